"""Builder of the ``cir`` set: composed retrieval queries with known answers + per-split galleries."""
from __future__ import annotations

import random
from collections import Counter, defaultdict
from pathlib import Path

from PIL import Image

from .. import recolour, twemoji
from ..formats import IMAGES_DIRNAME, write_jsonl
from .common import (CATEGORY_QUERIES_PER_IMAGE, MIN_CATEGORY_IMAGES, RECOLOUR_TARGETS_PER_IMAGE, SPLITS, Inputs,
                     _emoji_groups, _emoji_rel, _link_or_copy, _photo_sources, _progress, _twemoji_sources,
                     assign_split, category_text, emoji_group_splits)


Splits = dict[str, list[dict]]  # split name -> its records (queries or gallery entries)


def build_cir(out: Path, inp: Inputs, seed: int) -> dict:
    """Composed retrieval queries + galleries; returns the manifest's counts."""
    img_root = out / IMAGES_DIRNAME
    queries: Splits = {s: [] for s in SPLITS}
    gallery: Splits = {s: [] for s in SPLITS}
    cross_split = _twemoji_part(img_root, inp, seed, queries, gallery)
    # (b) recoloured photos and (c) category changes: only photos with a category, so every photo in
    # the "photos" gallery has exactly one category and category targets are complete.
    photos = [p for p in inp.photos if p.category]
    split_photo_images, recolour_stats = _recolour_part(img_root, photos, seed, queries, gallery, inp.progress)
    for split in SPLITS:
        queries[split].extend(_category_queries(split, split_photo_images[split], gallery[split], seed))
    return {"counts": _write_splits(out, queries, gallery), "recolour_analysis": dict(sorted(recolour_stats.items())),
            "twemoji_queries_dropped_across_splits": cross_split,
            "sources": {**_twemoji_sources(inp), **_photo_sources(inp)}}


def _twemoji_part(img_root: Path, inp: Inputs, seed: int, queries: Splits, gallery: Splits) -> int:
    """(a) Twemoji attribute variants: every emoji into its group's gallery, one query per variant edge
    whose two ends share a split. Returns how many edges were dropped for crossing splits."""
    rng = random.Random(seed)
    groups = _emoji_groups(inp)
    gsplit = emoji_group_splits(inp.emojis, seed)
    by_key = {e.key: e for e in inp.emojis}
    for e in _progress(inp.emojis, "cir: emoji images", show=inp.progress):
        _link_or_copy(inp.emoji_img_dir / e.image, img_root / _emoji_rel(e))
        split = gsplit[groups[e.key]]
        gallery[split].append({"image": _emoji_rel(e), "gallery": "twemoji", "group": groups[e.key],
                               "caption": twemoji.caption(e), "source": "twemoji"})
    cross_split = 0
    for edge in twemoji.variant_edges(inp.emojis, rng):
        src, dst = by_key[edge.src], by_key[edge.dst]
        split = gsplit[groups[src.key]]
        if split != gsplit[groups[dst.key]]:
            cross_split += 1  # a loose link whose ends fell in different splits: not usable
            continue
        queries[split].append({
            "id": f"twemoji:{edge.kind}:{src.key}>{dst.key}", "kind": edge.kind, "gallery": "twemoji",
            "reference": _emoji_rel(src), "text": edge.text, "targets": [_emoji_rel(dst)],
            "group": groups[src.key], "attribute": edge.value,
            "reference_caption": twemoji.caption(src), "target_caption": twemoji.caption(dst),
        })
    return cross_split


def _recolour_part(img_root: Path, photos: list, seed: int, queries: Splits,
                   gallery: Splits, progress: bool = False) -> tuple[dict[str, list[tuple[str, str]]], Counter]:
    """(b) Every photo into its split's gallery, with its recoloured copies and one query per copy.
    Returns each split's (image, category) pairs, originals and copies, and the recolour analysis tally."""
    photo_split = {p.key: assign_split(p.group, seed) for p in photos}
    split_photo_images: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}  # (rel, category)
    recolour_stats = Counter()
    for p in _progress(photos, "cir: photos / recolour", show=progress):
        split = photo_split[p.key]
        rel = f"photos/{p.path.name}"
        _link_or_copy(p.path, img_root / rel)
        gallery[split].append({"image": rel, "gallery": "photos", "group": p.group, "caption": p.caption,
                               "category": p.category, "source": p.source})
        split_photo_images[split].append((rel, p.category))
        recolour_stats[_recolour_photo(img_root, p, rel, seed, queries[split], gallery[split],
                                       split_photo_images[split])] += 1
    return split_photo_images, recolour_stats


def _recolour_photo(img_root: Path, p, rel: str, seed: int, queries: list[dict], gallery: list[dict],
                    photo_images: list[tuple[str, str]]) -> str:
    """Recoloured copies of one photo (up to RECOLOUR_TARGETS_PER_IMAGE, seeded per photo) into one
    split's gallery and queries; returns the analysis' reason (why it was or was not recoloured)."""
    img = Image.open(p.path)
    img.load()
    analysis, reason = recolour.analyse(img)
    if analysis is None:
        return reason
    options = recolour.target_colours(analysis)
    prng = random.Random(f"{seed}:{p.key}")
    for colour in sorted(prng.sample(options, min(RECOLOUR_TARGETS_PER_IMAGE, len(options)))):
        target_img = recolour.recolour(img, colour, analysis)
        target_rel = f"recoloured/{p.key}__{colour}.png"
        target_path = img_root / target_rel
        target_path.parent.mkdir(parents=True, exist_ok=True)
        target_img.save(target_path, format="PNG")
        gallery.append({"image": target_rel, "gallery": "photos", "group": p.group,
                        "caption": None, "category": p.category, "source": p.source,
                        "recoloured_from": rel, "colour": colour})
        photo_images.append((target_rel, p.category))
        queries.append({
            "id": f"recolour:{p.key}:{colour}", "kind": "recolour", "gallery": "photos",
            "reference": rel, "text": f"make it {colour}", "targets": [target_rel], "group": p.group,
            "attribute": colour, "source_colour": analysis.name, "source_hue": round(analysis.hue, 1),
            "mask": analysis.mask_kind, "reference_caption": p.caption,
        })
    return reason


def _category_queries(split: str, photo_images: list[tuple[str, str]], gallery: list[dict],
                      seed: int) -> list[dict]:
    """(c) Category changes in one split: from each original photo to up to CATEGORY_QUERIES_PER_IMAGE
    other categories with at least MIN_CATEGORY_IMAGES originals; every image of the category is a target."""
    by_cat: dict[str, list[str]] = defaultdict(list)
    originals = [(rel, cat) for rel, cat in photo_images if rel.startswith("photos/")]
    for rel, cat in photo_images:
        by_cat[cat].append(rel)  # recoloured copies are still images of their category
    eligible = sorted(c for c in by_cat if sum(1 for r, k in originals if k == c) >= MIN_CATEGORY_IMAGES)
    crng = random.Random(f"{seed}:category:{split}")
    group_of = {g["image"]: g["group"] for g in gallery}
    queries = []
    for rel, cat in sorted(originals):
        others = [c for c in eligible if c != cat]
        if not others:
            continue
        group = group_of[rel]
        for target_cat in sorted(crng.sample(others, min(CATEGORY_QUERIES_PER_IMAGE, len(others)))):
            queries.append({
                "id": f"category:{rel}>{target_cat}", "kind": "category", "gallery": "photos",
                "reference": rel, "text": category_text(target_cat), "targets": sorted(by_cat[target_cat]),
                "group": group, "attribute": target_cat, "reference_category": cat,
            })
    return queries


def _write_splits(out: Path, queries: Splits, gallery: Splits) -> dict:
    """Each split's queries (by id) and gallery (by image) as JSON lines; returns the per-split counts."""
    counts = {}
    for split in SPLITS:
        queries[split].sort(key=lambda q: q["id"])
        gallery[split].sort(key=lambda g: g["image"])
        write_jsonl(out / f"{split}.jsonl", queries[split])
        write_jsonl(out / f"{split}_gallery.jsonl", gallery[split])
        counts[split] = {"queries": len(queries[split]), "gallery": len(gallery[split]),
                         "by_kind": dict(sorted(Counter(q["kind"] for q in queries[split]).items()))}
    return counts
