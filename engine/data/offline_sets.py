"""Assemble the offline training / evaluation sets from packages that install offline.

``python -m engine.data.offline_sets build [--only NAME] [--force] [--seed N]`` builds (once, cached under
``cache_dir()/datasets/<name>/``):

* ``cir``        composed-retrieval queries with known answers (Twemoji attribute variants, recoloured
                 object photos, category-change queries over real photos) + per-split galleries;
* ``captions``   image / caption pairs (Tux Paint, Twemoji, GCompris, Saleor, scikit samples);
* ``labelled``   single-label retrieval sets (Fashion-MNIST full and small, emoji, photos);
* ``multilabel`` multi-label set for hashing (Twemoji + Tux Paint category paths).

Everything is deterministic for a given seed: splits come from a hash of (seed, group key), so one
emoji family or one original photo (with its recoloured copies and near-duplicates) always lands in
one split, in every set. See ``docs/data.md`` for the record fields and counts.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

import numpy as np
from PIL import Image

from ..errors import EngineError, InputError
from ..fileio import atomic_write_bytes
from . import fashion_mnist, recolour, twemoji
from .formats import (
    DATASET_NAMES, FORMAT_VERSION, IMAGES_DIRNAME, MANIFEST, dataset_dir, datasets_root, write_json,
    write_jsonl,
)

DEFAULT_SEED = 0
SPLITS = ("train", "val", "test")
SPLIT_FRACTIONS = (0.70, 0.15, 0.15)
MAX_SIDE = 512
RECOLOUR_TARGETS_PER_IMAGE = 3
CATEGORY_QUERIES_PER_IMAGE = 2
MIN_CATEGORY_IMAGES = 3
FMNIST_SMALL_DB_PER_CLASS = 500
FMNIST_SMALL_QUERY_PER_CLASS = 100
FMNIST_VAL_CLASSES = 3
CLASS_FRACTIONS = (0.6, 0.2, 0.2)  # train / val / test classes of the labelled emoji and photo parts
QUERY_FRACTION = 0.2
RARE_KIND_MAX_GROUPS = 12  # attribute kinds with at most this many emoji groups are spread over the splits

try:
    from tqdm import tqdm
except ImportError:  # pragma: no cover
    def tqdm(it, **_):
        return it


def _progress(it, desc: str, total: Optional[int] = None):
    return tqdm(it, desc=desc, total=total, leave=False, disable=not sys.stderr.isatty() and os.environ.get("CIS_PROGRESS") != "1")


# ----------------------------------------------------------------------------------------------
# splits


def unit_hash(seed: int, key: str) -> float:
    """Deterministic number in [0, 1) from (seed, key)."""
    digest = hashlib.sha256(f"{seed}:{key}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64


def assign_split(group: str, seed: int, fractions: Sequence[float] = SPLIT_FRACTIONS) -> str:
    """train / val / test for a group key; the same key and seed always give the same split."""
    u = unit_hash(seed, group)
    acc = 0.0
    for name, frac in zip(SPLITS, fractions):
        acc += frac
        if u < acc:
            return name
    return SPLITS[-1]


def class_disjoint_split(labels: Iterable, seed: int, fractions: Sequence[float] = CLASS_FRACTIONS,
                         names: Sequence[str] = SPLITS) -> dict:
    """Assign whole classes to splits (validation / test classes never appear in training).

    Returns ``{class: split}``. Classes are shuffled with ``seed`` and cut by ``fractions`` (at least
    one class per split when there are enough classes).
    """
    classes = sorted(set(labels), key=str)
    rng = random.Random(seed)
    rng.shuffle(classes)
    n = len(classes)
    counts = [int(round(f * n)) for f in fractions]
    if n >= len(names):
        counts = [max(1, c) for c in counts]
    while sum(counts) > n:
        counts[int(np.argmax(counts))] -= 1
    counts[0] += n - sum(counts)
    out, start = {}, 0
    for name, c in zip(names, counts):
        for cls in classes[start:start + c]:
            out[cls] = name
        start += c
    return out


def query_db_split(records: list[dict], seed: int, label_key: str = "label",
                   query_fraction: float = QUERY_FRACTION) -> tuple[list[dict], list[dict]]:
    """Per class: ``query_fraction`` of the items become queries (at least one), the rest the database.

    Classes with a single item go to the database only (a query needs a relevant database item).
    """
    by_class: dict = defaultdict(list)
    for r in records:
        by_class[r[label_key]].append(r)
    rng = random.Random(seed)
    query, db = [], []
    for cls in sorted(by_class, key=str):
        items = sorted(by_class[cls], key=lambda r: r["id"])
        rng.shuffle(items)
        if len(items) < 2:
            db.extend(items)
            continue
        k = min(len(items) - 1, max(1, int(round(query_fraction * len(items)))))
        query.extend(items[:k])
        db.extend(items[k:])
    return sorted(query, key=lambda r: r["id"]), sorted(db, key=lambda r: r["id"])


# ----------------------------------------------------------------------------------------------
# photos


@dataclass
class PhotoItem:
    """A real photo prepared for the sets: resized file on disk plus its metadata."""

    key: str                    # unique, file-name safe
    path: Path                  # prepared image (PNG with alpha for cut-outs, else JPEG)
    source: str
    version: str
    ref: str                    # original file inside the source package
    licence: str
    labels: tuple               # category path in the source
    caption: Optional[str] = None
    category: Optional[str] = None   # category used by category-change queries (see CATEGORY_RULES)
    group: str = ""             # split group (near-duplicates and mirrored copies share one)
    author: Optional[str] = None


# (source, label-path prefix or None, file-name regex or None) -> category noun.
# Categories are chosen to be mutually exclusive so every gallery photo has exactly one.
CATEGORY_RULES: list[tuple[str, Optional[str], Optional[str], str]] = [
    ("tuxpaint-stamps-default", "animals/birds", None, "bird"),
    ("tuxpaint-stamps-default", "animals/fish", None, "fish"),
    ("tuxpaint-stamps-default", "animals/insects", None, "insect"),
    ("tuxpaint-stamps-default", "animals/mammals", None, "mammal"),
    ("tuxpaint-stamps-default", "animals/marsupials", None, "mammal"),
    ("tuxpaint-stamps-default", "food/fruit", None, "fruit"),
    ("tuxpaint-stamps-default", "food/vegetables", None, "vegetable"),
    ("tuxpaint-stamps-default", "food/nuts", None, "nut"),
    ("tuxpaint-stamps-default", "plants/flowers", None, "flower"),
    ("tuxpaint-stamps-default", "plants/trees", None, "tree"),
    ("tuxpaint-stamps-default", "plants/mushrooms", None, "mushroom"),
    ("tuxpaint-stamps-default", "hobbies/music", None, "musical instrument"),
    ("tuxpaint-stamps-default", "household/tools", None, "tool"),
    ("tuxpaint-stamps-default", "clothes/hats", None, "hat"),
    ("tuxpaint-stamps-default", "vehicles", None, "vehicle"),
    ("tuxpaint-stamps-default", "military/vehicles", None, "vehicle"),
    ("tuxpaint-stamps-default", "town/roadsigns", None, "road sign"),
    ("tuxpaint-stamps-default", "town/flags", None, "flag"),
    ("tuxpaint-stamps-default", "town/monuments", None, "monument"),
    ("tuxpaint-stamps-default", "space/planets", None, "planet"),
    ("tuxpaint-stamps-default", "symbols/money", r"coin|penny|nickel|dime|quarter|dollar|loonie|toonie|euro|cent|yen", "coin"),
    ("gcompris-qt-data", "categorization/fishes", None, "fish"),
    ("gcompris-qt-data", "clickgame", None, "fish"),
    ("gcompris-qt-data", "categorization/tools", None, "tool"),
    ("gcompris-qt-data", "categorization/monuments", None, "monument"),
    ("gcompris-qt-data", "explore_monuments", None, "monument"),
    ("gcompris-qt-data", "categorization/renewable", None, "renewable energy installation"),
    ("gcompris-qt-data", "solar_system", None, "planet"),
    ("saleor", "T-shirts", None, "t-shirt"),
    ("saleor", "Polo Shirts", None, "polo shirt"),
    ("saleor", "Hoodies", None, "hoodie"),
    ("saleor", "Footwear", None, "shoe"),
    ("saleor", "Alcohol", None, "bottle of alcohol"),
    ("saleor", "Juices", None, "bottle of juice"),
    ("saleor", "Paints", None, "can of paint"),
]

# Photo sources and which label paths to keep at all (for captions / multi-label sets too).
TUX_SKIP = ("symbols/alphabets", "symbols/math", "symbols/music", "symbols/chess", "symbols/shapes")
GCOMPRIS_KEEP = ("categorization/fishes", "categorization/tools", "categorization/monuments",
                 "categorization/renewable", "categorization/others", "clickgame", "explore_monuments",
                 "explore_world_animals", "explore_farm_animals", "erase", "solar_system", "lang/words_sample")
# (GCompris "paintings" are jigsaw pieces of a few paintings: left out, they are neither photos nor
# independent images.)


def recipe_hash() -> str:
    """Short hash of the assembly recipe (format version, selection and category rules, recolour and
    split settings). A set built with another recipe is rebuilt on next use."""
    recipe = [FORMAT_VERSION, SPLIT_FRACTIONS, MAX_SIDE, RECOLOUR_TARGETS_PER_IMAGE, CATEGORY_QUERIES_PER_IMAGE,
              MIN_CATEGORY_IMAGES, FMNIST_SMALL_DB_PER_CLASS, FMNIST_SMALL_QUERY_PER_CLASS, FMNIST_VAL_CLASSES,
              CLASS_FRACTIONS, QUERY_FRACTION, CATEGORY_RULES, TUX_SKIP, GCOMPRIS_KEEP, RARE_KIND_MAX_GROUPS,
              recolour.PALETTE, [recolour.MIN_SAT, recolour.MIN_VAL, recolour.MIN_COLOURFUL, recolour.MIN_CLUSTER,
                                 recolour.MIN_CLUSTER_VAL, recolour.MIN_CLUSTER_SAT, recolour.CLUSTER_DEG,
                                 recolour.FALLOFF_DEG, recolour.MIN_TARGET_DIST], twemoji.VERSION]
    return hashlib.sha256(json.dumps(recipe, default=str).encode()).hexdigest()[:12]


def category_for(source: str, labels: Sequence[str], filename: str) -> Optional[str]:
    """Category noun of a photo by :data:`CATEGORY_RULES` (first match), or None."""
    path = "/".join(labels)
    for src, prefix, pattern, noun in CATEGORY_RULES:
        if src != source:
            continue
        if prefix is not None and not (path == prefix or path.startswith(prefix + "/")):
            continue
        if pattern is not None and not re.search(pattern, filename, re.IGNORECASE):
            continue
        return noun
    return None


def category_text(noun: str) -> str:
    """Modification text of a category-change query: "a photo of a <noun>"."""
    article = "an" if noun[0].lower() in "aeiou" else "a"
    return f"a photo of {article} {noun}"


def words_from_filename(stem: str) -> str:
    """'arcDeTriomphe2' -> 'arc de triomphe'; 'AlbrechtDurer_a1' -> 'albrecht durer a'."""
    stem = re.sub(r"([a-z])([A-Z])", r"\1 \2", stem)
    stem = re.sub(r"[_\-]+", " ", stem)
    stem = re.sub(r"\d+", " ", stem)
    return re.sub(r"\s+", " ", stem).strip().lower()


def photo_caption(source: str, labels: Sequence[str], filename: str, caption: Optional[str],
                  category: Optional[str]) -> Optional[str]:
    """English caption: the source's own caption / product name, else one derived from the file name."""
    stem = filename.rsplit(".", 1)[0]
    if caption:
        caption = caption.strip()
        if source == "saleor" and labels:
            return f"{caption}, {labels[-1].lower()}"
        return caption
    words = words_from_filename(stem)
    if not words:
        return None
    if category == "painting":
        artist = words_from_filename(stem.split("_")[0])
        return f"a painting by {artist}" if artist else "a painting"
    if category in ("fish", "tool", "planet", "renewable energy installation") and re.fullmatch(r"[a-z ]+", words):
        return words if category in words else f"{words}, a {category}"
    if category == "monument":
        return f"{words}, a monument"
    return words


def _dhash(img: Image.Image, size: int = 8) -> str:
    g = np.asarray(img.convert("L").resize((size + 1, size), Image.BILINEAR), dtype=np.int16)
    bits = (g[:, 1:] > g[:, :-1]).ravel()
    return "%0*x" % (size * size // 4, int("".join("1" if b else "0" for b in bits), 2))


def _has_alpha(img: Image.Image) -> bool:
    if img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info):
        alpha = np.asarray(img.convert("RGBA"))[..., 3]
        return bool((alpha < 250).any())
    return False


def prepare_image(data: bytes, name: str) -> Image.Image:
    """Decode and resize (longest side <= MAX_SIDE); keeps alpha for cut-outs, else RGB."""
    try:
        img = Image.open(io.BytesIO(data))
        img.seek(0)
        img.load()
    except Exception as exc:
        raise InputError(f"{name} could not be decoded: {exc}") from None
    img = img.convert("RGBA") if _has_alpha(img) else img.convert("RGB")
    if max(img.size) > MAX_SIDE:
        img.thumbnail((MAX_SIDE, MAX_SIDE), Image.LANCZOS)
    return img


def save_image(img: Image.Image, path_stem: Path) -> Path:
    """PNG for images with alpha (lossless, keeps the cut-out), JPEG q90 otherwise; atomic."""
    path = path_stem.with_suffix(".png" if img.mode == "RGBA" else ".jpg")
    buf = io.BytesIO()
    if img.mode == "RGBA":
        img.save(buf, format="PNG", optimize=False)
    else:
        img.save(buf, format="JPEG", quality=90)
    return atomic_write_bytes(path, buf.getvalue())


SOURCE_SHORT = {"tuxpaint-stamps-default": "tux", "gcompris-qt-data": "gcompris", "saleor": "saleor",
                "scikit-image": "skimage", "scikit-learn": "sklearn"}


def photo_key(source: str, ref: str) -> str:
    """Readable, file-name safe key: short source name + the original path without boilerplate."""
    path = ref.split(":/")[-1]
    path = re.sub(r"^(gcompris/src/activities/|saleor/static/placeholders/|skimage/data/|sklearn/datasets/images/)", "", path)
    path = path.replace("/resource/", "/").replace("/images/", "/").rsplit(".", 1)[0]
    key = re.sub(r"[^A-Za-z0-9]+", "_", f"{SOURCE_SHORT.get(source, source)}_{path}").strip("_").lower()
    if len(key) > 80:
        key = key[:71] + "_" + hashlib.sha1(ref.encode()).hexdigest()[:8]
    return key


def _source_records():
    """Photo records of every available source (lazy import of ``engine.data.sources``)."""
    from . import sources as S  # written by another module owner; imported only when photos are needed

    out, missing = [], []
    readers = [
        ("tuxpaint", S.tuxpaint_stamps),
        ("gcompris", S.gcompris_images),
        ("saleor", S.saleor_products),
        ("skimage", S.skimage_samples),
        ("sklearn", S.sklearn_samples),
    ]
    for name, reader in readers:
        try:
            recs = list(reader())
        except EngineError as exc:  # a missing package: build without it, say so in the manifest
            missing.append(f"{name}: {exc}")
            continue
        if name == "tuxpaint":
            recs = [r for r in recs if not any("/".join(r.labels).startswith(p) for p in TUX_SKIP)]
        elif name == "gcompris":
            recs = [r for r in recs if any("/".join(r.labels).startswith(p) for p in GCOMPRIS_KEEP)]
        elif name == "saleor":
            recs = [r for r in recs if r.labels[:1] != ("products-list",)]
        out.extend(recs)
    return out, missing


def collect_photos(seed: int = DEFAULT_SEED, work_dir: Optional[Path] = None) -> tuple[list[PhotoItem], dict]:
    """Read, de-duplicate and resize every photo once; cached in ``datasets/_photos``.

    Returns the items and a summary (per-source counts, versions, licences, missing sources).
    """
    work = Path(work_dir) if work_dir else datasets_root() / "_photos"
    index_file = work / f"photos-{recipe_hash()}.json"  # the photo selection does not depend on the seed
    if index_file.is_file():
        try:
            saved = json.loads(index_file.read_text(encoding="utf-8"))
            items = [PhotoItem(**{**d, "path": work / d["path"], "labels": tuple(d["labels"])}) for d in saved["items"]]
            if all(it.path.is_file() for it in items):
                return items, saved["summary"]
        except (OSError, json.JSONDecodeError, TypeError, KeyError):
            pass
    records, missing = _source_records()
    items: list[PhotoItem] = []
    seen_bytes: set[str] = set()
    used_keys: set[str] = set()
    hash_group: dict[str, str] = {}
    for rec in _progress(records, "photos", total=len(records)):
        try:
            data = rec.read_bytes()
        except (OSError, InputError):
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest in seen_bytes:
            continue  # the same file shipped twice (e.g. in two GCompris activities)
        try:
            img = prepare_image(data, rec.name)
        except InputError:
            continue
        if min(img.size) < 32:
            continue
        seen_bytes.add(digest)
        filename = rec.name
        key = photo_key(rec.source, rec.ref)
        while key in used_keys:
            key += "_x"
        used_keys.add(key)
        base_ref = re.sub(r"_mirror(?=\.[A-Za-z]+$)", "", rec.ref)
        dh = f"dhash:{_dhash(img)}"
        # mirrored copies share their original's group, near-identical pixels share one too
        group = hash_group.get(f"ref:{base_ref}") or hash_group.get(dh) or f"photo:{rec.source}:{base_ref}"
        hash_group.setdefault(f"ref:{base_ref}", group)
        hash_group.setdefault(dh, group)
        category = category_for(rec.source, rec.labels, filename)
        path = save_image(img, work / "images" / key)
        items.append(PhotoItem(
            key=key, path=path, source=rec.source, version=rec.version, ref=rec.ref, licence=rec.licence,
            labels=tuple(rec.labels), caption=photo_caption(rec.source, rec.labels, filename, rec.caption, category),
            category=category, group=group, author=rec.author,
        ))
    summary = {
        "sources": _source_summary(items),
        "missing_sources": missing,
    }
    write_json(index_file, {
        "items": [{**it.__dict__, "path": str(it.path.relative_to(work)), "labels": list(it.labels)} for it in items],
        "summary": summary,
    })
    return items, summary


def _source_summary(items: Sequence[PhotoItem]) -> dict:
    out: dict = {}
    for it in items:
        s = out.setdefault(it.source, {"version": it.version, "images": 0, "licences": Counter()})
        s["images"] += 1
        s["licences"][it.licence] += 1
    return {k: {**v, "licences": dict(v["licences"])} for k, v in sorted(out.items())}


# ----------------------------------------------------------------------------------------------
# inputs


@dataclass
class Inputs:
    """Everything the builders read; the real one comes from :func:`gather_inputs`, tests make small ones."""

    emojis: list = field(default_factory=list)        # twemoji.Emoji
    emoji_img_dir: Optional[Path] = None
    emoji_version: str = "none"
    photos: list = field(default_factory=list)        # PhotoItem
    photo_summary: dict = field(default_factory=dict)
    fmnist: Optional[tuple] = None                    # (train_x, train_y, test_x, test_y)
    fmnist_version: str = "none"


def gather_inputs(names: Sequence[str], seed: int = DEFAULT_SEED) -> Inputs:
    """Load the real sources needed by ``names`` (installs the Twemoji npm package into the cache)."""
    inp = Inputs()
    need_emoji = any(n in names for n in ("cir", "captions", "labelled", "multilabel"))
    need_photos = any(n in names for n in ("cir", "captions", "labelled", "multilabel"))
    if need_emoji:
        pkg = twemoji.package_dir(install=True)
        inp.emojis = twemoji.load_emoji(pkg)
        inp.emoji_img_dir = pkg / twemoji.IMAGE_SUBDIR
        inp.emoji_version = twemoji.installed_version(pkg)
    if need_photos:
        inp.photos, inp.photo_summary = collect_photos(seed)
    if "labelled" in names:
        if fashion_mnist.available():
            tx, ty = fashion_mnist.load("train")
            vx, vy = fashion_mnist.load("test")
            inp.fmnist = (tx, ty, vx, vy)
            inp.fmnist_version = fashion_mnist.package_version()
    return inp


# ----------------------------------------------------------------------------------------------
# builders


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.exists():
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _emoji_rel(e) -> str:
    return f"twemoji/{e.image}"


def _emoji_groups(inp: Inputs) -> dict[str, str]:
    return twemoji.variant_groups(inp.emojis)



def emoji_group_splits(emojis: Sequence, seed: int) -> dict[str, str]:
    """Split of every emoji group. Groups holding a rare attribute kind (hair, direction: only a few
    families) are spread over the splits in a seeded order (test, val, then train) so every split gets
    some; all other groups use :func:`assign_split`."""
    groups = twemoji.variant_groups(emojis)
    out = {g: assign_split(g, seed) for g in set(groups.values())}
    kinds: dict[str, set] = defaultdict(set)
    for base, kind, _, variant in twemoji.attribute_relations(emojis):
        kinds[kind].add(groups[base])
        kinds[kind].add(groups[variant])
    fixed: set = set()
    for kind in sorted(kinds):
        gs = sorted(kinds[kind] - fixed)
        if not gs or len(kinds[kind]) > RARE_KIND_MAX_GROUPS:
            continue
        random.Random(f"{seed}:{kind}").shuffle(gs)
        order = ["test", "val"] + ["train"] * max(0, len(gs) - 2)
        for g, split in zip(gs, order):
            out[g] = split
            fixed.add(g)
    return out


def _twemoji_sources(inp: Inputs) -> dict:
    return {"twemoji": {"package": f"npm {twemoji.PACKAGE}", "version": inp.emoji_version,
                        "licence": twemoji.LICENCE_IMAGES, "data_licence": twemoji.LICENCE_DATA}}


def _photo_sources(inp: Inputs) -> dict:
    return {"photos": inp.photo_summary or _source_summary(inp.photos)}


def build_cir(out: Path, inp: Inputs, seed: int) -> dict:
    """Composed retrieval queries + galleries; returns the manifest's counts."""
    rng = random.Random(seed)
    img_root = out / IMAGES_DIRNAME
    queries: dict[str, list[dict]] = {s: [] for s in SPLITS}
    gallery: dict[str, list[dict]] = {s: [] for s in SPLITS}

    # (a) Twemoji attribute variants
    groups = _emoji_groups(inp)
    gsplit = emoji_group_splits(inp.emojis, seed)
    by_key = {e.key: e for e in inp.emojis}
    for e in _progress(inp.emojis, "cir: emoji images"):
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

    # (b) recoloured photos and (c) category changes: only photos with a category, so every photo in
    # the "photos" gallery has exactly one category and category targets are complete.
    photos = [p for p in inp.photos if p.category]
    photo_split = {p.key: assign_split(p.group, seed) for p in photos}
    split_photo_images: dict[str, list[tuple[str, str]]] = {s: [] for s in SPLITS}  # (rel, category)
    recolour_stats = Counter()
    for p in _progress(photos, "cir: photos / recolour"):
        split = photo_split[p.key]
        rel = f"photos/{p.path.name}"
        _link_or_copy(p.path, img_root / rel)
        gallery[split].append({"image": rel, "gallery": "photos", "group": p.group, "caption": p.caption,
                               "category": p.category, "source": p.source})
        split_photo_images[split].append((rel, p.category))
        img = Image.open(p.path)
        img.load()
        analysis, reason = recolour.analyse(img)
        recolour_stats[reason] += 1
        if analysis is None:
            continue
        options = recolour.target_colours(analysis)
        prng = random.Random(f"{seed}:{p.key}")
        for colour in sorted(prng.sample(options, min(RECOLOUR_TARGETS_PER_IMAGE, len(options)))):
            target_img = recolour.recolour(img, colour, analysis)
            target_rel = f"recoloured/{p.key}__{colour}.png"
            target_path = img_root / target_rel
            target_path.parent.mkdir(parents=True, exist_ok=True)
            target_img.save(target_path, format="PNG")
            gallery[split].append({"image": target_rel, "gallery": "photos", "group": p.group,
                                   "caption": None, "category": p.category, "source": p.source,
                                   "recoloured_from": rel, "colour": colour})
            split_photo_images[split].append((target_rel, p.category))
            queries[split].append({
                "id": f"recolour:{p.key}:{colour}", "kind": "recolour", "gallery": "photos",
                "reference": rel, "text": f"make it {colour}", "targets": [target_rel], "group": p.group,
                "attribute": colour, "source_colour": analysis.name, "source_hue": round(analysis.hue, 1),
                "mask": analysis.mask_kind, "reference_caption": p.caption,
            })
    for split in SPLITS:
        by_cat: dict[str, list[str]] = defaultdict(list)
        originals = [(rel, cat) for rel, cat in split_photo_images[split] if rel.startswith("photos/")]
        for rel, cat in split_photo_images[split]:
            by_cat[cat].append(rel)  # recoloured copies are still images of their category
        eligible = sorted(c for c in by_cat if sum(1 for r, k in originals if k == c) >= MIN_CATEGORY_IMAGES)
        crng = random.Random(f"{seed}:category:{split}")
        group_of = {g["image"]: g["group"] for g in gallery[split]}
        for rel, cat in sorted(originals):
            others = [c for c in eligible if c != cat]
            if not others:
                continue
            group = group_of[rel]
            for target_cat in sorted(crng.sample(others, min(CATEGORY_QUERIES_PER_IMAGE, len(others)))):
                queries[split].append({
                    "id": f"category:{rel}>{target_cat}", "kind": "category", "gallery": "photos",
                    "reference": rel, "text": category_text(target_cat), "targets": sorted(by_cat[target_cat]),
                    "group": group, "attribute": target_cat, "reference_category": cat,
                })
    counts = {}
    for split in SPLITS:
        queries[split].sort(key=lambda q: q["id"])
        gallery[split].sort(key=lambda g: g["image"])
        write_jsonl(out / f"{split}.jsonl", queries[split])
        write_jsonl(out / f"{split}_gallery.jsonl", gallery[split])
        counts[split] = {"queries": len(queries[split]), "gallery": len(gallery[split]),
                         "by_kind": dict(sorted(Counter(q["kind"] for q in queries[split]).items()))}
    return {"counts": counts, "recolour_analysis": dict(sorted(recolour_stats.items())),
            "twemoji_queries_dropped_across_splits": cross_split,
            "sources": {**_twemoji_sources(inp), **_photo_sources(inp)}}


def build_captions(out: Path, inp: Inputs, seed: int) -> dict:
    groups = _emoji_groups(inp)
    gsplit = emoji_group_splits(inp.emojis, seed)
    records: dict[str, list[dict]] = {s: [] for s in SPLITS}
    img_root = out / IMAGES_DIRNAME
    for e in _progress(inp.emojis, "captions: emoji"):
        _link_or_copy(inp.emoji_img_dir / e.image, img_root / _emoji_rel(e))
        records[gsplit[groups[e.key]]].append({
            "id": f"twemoji:{e.key}", "image": _emoji_rel(e), "caption": twemoji.caption(e),
            "source": "twemoji", "group": groups[e.key], "licence": twemoji.LICENCE_IMAGES,
        })
    for p in _progress(inp.photos, "captions: photos"):
        if not p.caption:
            continue
        rel = f"photos/{p.path.name}"
        _link_or_copy(p.path, img_root / rel)
        records[assign_split(p.group, seed)].append({
            "id": f"photo:{p.key}", "image": rel, "caption": p.caption, "source": p.source,
            "group": p.group, "licence": p.licence,
        })
    counts = {}
    for split in SPLITS:
        records[split].sort(key=lambda r: r["id"])
        write_jsonl(out / f"{split}.jsonl", records[split])
        counts[split] = {"pairs": len(records[split]),
                         "by_source": dict(sorted(Counter(r["source"] for r in records[split]).items()))}
    return {"counts": counts, "sources": {**_twemoji_sources(inp), **_photo_sources(inp)}}


def _write_class_disjoint(out: Path, part: str, records: list[dict], seed: int,
                          query_db: Optional[tuple[list[dict], list[dict]]] = None) -> dict:
    """train / val (+ val_query, val_db) by class; query / db from test classes unless given."""
    class_split = class_disjoint_split([r["label"] for r in records], seed)
    by_split: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for r in records:
        by_split[class_split[r["label"]]].append(r)
    files = {"train": by_split["train"], "val": by_split["val"]}
    files["val_query"], files["val_db"] = query_db_split(by_split["val"], seed)
    if query_db is None:
        files["query"], files["db"] = query_db_split(by_split["test"], seed)
    else:
        files["query"], files["db"] = query_db
    counts = {}
    for name, recs in files.items():
        write_jsonl(out / part / f"{name}.jsonl", recs)
        counts[name] = {"images": len(recs), "classes": len({r["label"] for r in recs})}
    return counts


def _fmnist_class_split(seed: int) -> dict[int, str]:
    classes = list(range(10))
    random.Random(f"{seed}:fmnist").shuffle(classes)
    return {c: ("val" if i < FMNIST_VAL_CLASSES else "train") for i, c in enumerate(classes)}


def build_labelled(out: Path, inp: Inputs, seed: int) -> dict:
    img_root = out / IMAGES_DIRNAME
    counts: dict = {}
    sources: dict = {}
    if inp.fmnist is not None:
        tx, ty, vx, vy = inp.fmnist
        recs = {"train": [], "test": []}
        for file_split, xs, ys in (("train", tx, ty), ("test", vx, vy)):
            folder = img_root / "fmnist" / file_split
            folder.mkdir(parents=True, exist_ok=True)
            for i in _progress(range(len(xs)), f"labelled: fmnist {file_split}", total=len(xs)):
                rel = f"fmnist/{file_split}/{i:05d}.png"
                Image.fromarray(xs[i], mode="L").save(img_root / rel, format="PNG", compress_level=1)
                y = int(ys[i])
                recs[file_split].append({"id": f"fmnist:{file_split}:{i:05d}", "image": rel, "label": y,
                                         "label_name": fashion_mnist.CLASS_NAMES[y], "index": i,
                                         "source_split": file_split})
        cls_split = _fmnist_class_split(seed)
        for part, db, query in (("fmnist", recs["train"], recs["test"]),
                                ("fmnist_small",) + _fmnist_small(recs["train"], recs["test"], seed)):
            files = {"train": [r for r in db if cls_split[r["label"]] == "train"],
                     "val": [r for r in db if cls_split[r["label"]] == "val"], "query": query, "db": db}
            files["val_query"], files["val_db"] = query_db_split(files["val"], seed, query_fraction=0.1)
            counts[part] = {}
            for name, rs in files.items():
                write_jsonl(out / part / f"{name}.jsonl", rs)
                counts[part][name] = {"images": len(rs), "classes": len({r["label"] for r in rs})}
        counts["fmnist_val_classes"] = sorted(fashion_mnist.CLASS_NAMES[c] for c, s in cls_split.items() if s == "val")
        sources["fashion_mnist"] = {"package": f"debian {fashion_mnist.DEBIAN_PACKAGE}", "version": inp.fmnist_version,
                                    "licence": fashion_mnist.LICENCE}
    emoji_recs = []
    for e in inp.emojis:
        if e.skin_tone is not None:
            continue  # near-identical tone copies would make retrieval trivial
        _link_or_copy(inp.emoji_img_dir / e.image, img_root / _emoji_rel(e))
        emoji_recs.append({"id": f"twemoji:{e.key}", "image": _emoji_rel(e), "label": e.subcategory,
                           "label_name": e.subcategory, "category": e.category})
    if emoji_recs:
        counts["emoji"] = _write_class_disjoint(out, "emoji", sorted(emoji_recs, key=lambda r: r["id"]), seed)
        sources.update(_twemoji_sources(inp))
    photo_recs = []
    for p in inp.photos:
        if not p.category:
            continue
        rel = f"photos/{p.path.name}"
        _link_or_copy(p.path, img_root / rel)
        photo_recs.append({"id": f"photo:{p.key}", "image": rel, "label": p.category, "label_name": p.category,
                           "source": p.source, "group": p.group})
    if photo_recs:
        counts["photos"] = _write_class_disjoint(out, "photos", sorted(photo_recs, key=lambda r: r["id"]), seed)
        sources.update(_photo_sources(inp))
    return {"counts": counts, "sources": sources}


def _fmnist_small(train: list[dict], test: list[dict], seed: int) -> tuple[list[dict], list[dict]]:
    """Stratified subsample: FMNIST_SMALL_DB_PER_CLASS train images and FMNIST_SMALL_QUERY_PER_CLASS test images per class."""
    def pick(recs, per_class, tag):
        rng = random.Random(f"{seed}:fmnist_small:{tag}")
        by = defaultdict(list)
        for r in recs:
            by[r["label"]].append(r)
        out = []
        for c in sorted(by):
            out.extend(rng.sample(by[c], min(per_class, len(by[c]))))
        return sorted(out, key=lambda r: r["id"])
    return pick(train, FMNIST_SMALL_DB_PER_CLASS, "db"), pick(test, FMNIST_SMALL_QUERY_PER_CLASS, "query")


def emoji_multilabels(e) -> list[str]:
    labels = [f"category:{e.category}", f"subcategory:{e.subcategory}"]
    if e.skin_tone:
        labels.append(f"skin_tone:{e.skin_tone}")
    if e.gender:
        labels.append(f"gender:{e.gender}")
    return labels


def build_multilabel(out: Path, inp: Inputs, seed: int) -> dict:
    img_root = out / IMAGES_DIRNAME
    groups = _emoji_groups(inp)
    gsplit = emoji_group_splits(inp.emojis, seed)
    by_split: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for e in inp.emojis:
        _link_or_copy(inp.emoji_img_dir / e.image, img_root / _emoji_rel(e))
        by_split[gsplit[groups[e.key]]].append({
            "id": f"twemoji:{e.key}", "image": _emoji_rel(e), "labels": emoji_multilabels(e),
            "source": "twemoji", "group": groups[e.key]})
    for p in inp.photos:
        if p.source != "tuxpaint-stamps-default" or not p.labels:
            continue
        rel = f"photos/{p.path.name}"
        _link_or_copy(p.path, img_root / rel)
        levels = ["tuxpaint:" + "/".join(p.labels[:i]) for i in range(1, len(p.labels) + 1)]
        by_split[assign_split(p.group, seed)].append({
            "id": f"photo:{p.key}", "image": rel, "labels": levels, "source": p.source, "group": p.group})
    rng = random.Random(f"{seed}:multilabel")
    test = sorted(by_split["test"], key=lambda r: r["id"])
    rng.shuffle(test)
    k = max(1, int(round(QUERY_FRACTION * len(test)))) if len(test) > 1 else 0
    files = {"train": by_split["train"], "val": by_split["val"], "query": test[:k], "db": test[k:]}
    vocab = sorted({lab for recs in by_split.values() for r in recs for lab in r["labels"]})
    write_json(out / "labels.json", vocab)
    counts = {}
    for name, recs in files.items():
        recs = sorted(recs, key=lambda r: r["id"])
        write_jsonl(out / f"{name}.jsonl", recs)
        counts[name] = {"images": len(recs), "labels_used": len({lab for r in recs for lab in r["labels"]})}
    counts["vocabulary"] = len(vocab)
    sources = _twemoji_sources(inp)
    if inp.photos:
        sources.update(_photo_sources(inp))
    return {"counts": counts, "sources": sources}


BUILDERS: dict[str, Callable[[Path, Inputs, int], dict]] = {
    "cir": build_cir,
    "captions": build_captions,
    "labelled": build_labelled,
    "multilabel": build_multilabel,
}


def build_into(name: str, final_dir: Path, inp: Inputs, seed: int = DEFAULT_SEED) -> dict:
    """Build one set into a temporary folder next to ``final_dir`` and swap it in atomically."""
    if name not in BUILDERS:
        raise InputError(f"unknown data set {name!r}; choose one of {', '.join(BUILDERS)}")
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final_dir.parent, prefix=f".tmp-{name}-"))
    os.chmod(tmp, 0o755)
    try:
        started = time.time()
        info = BUILDERS[name](tmp, inp, seed)
        manifest = {
            "name": name, "format_version": FORMAT_VERSION, "recipe": recipe_hash(), "seed": seed,
            "split_fractions": dict(zip(SPLITS, SPLIT_FRACTIONS)),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": round(time.time() - started, 1),
            **info,
        }
        write_json(tmp / MANIFEST, manifest)
        old = None
        if final_dir.exists():
            old = final_dir.with_name(f".old-{name}-{os.getpid()}")
            os.replace(final_dir, old)
        os.replace(tmp, final_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return manifest
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def build(name: Optional[str] = None, force: bool = False, seed: int = DEFAULT_SEED) -> dict[str, dict]:
    """Build one set (or all); already built sets are kept unless ``force``. Returns manifests."""
    from .formats import is_built, load_manifest

    names = [name] if name else list(DATASET_NAMES)
    for n in names:
        if n not in BUILDERS:
            raise InputError(f"unknown data set {n!r}; choose one of {', '.join(BUILDERS)}")
    todo = [n for n in names if force or not is_built(n)]
    out = {n: load_manifest(n, build=False) for n in names if n not in todo}
    if todo:
        inp = gather_inputs(todo, seed)
        for n in todo:
            out[n] = build_into(n, dataset_dir(n), inp, seed)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.data.offline_sets", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="assemble the sets (cached; --force rebuilds)")
    b.add_argument("--only", choices=DATASET_NAMES, help="build just this set")
    b.add_argument("--force", action="store_true", help="rebuild even if built")
    b.add_argument("--seed", type=int, default=DEFAULT_SEED)
    i = sub.add_parser("info", help="print the counts of the built sets")
    i.add_argument("--only", choices=DATASET_NAMES)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            os.environ.setdefault("CIS_PROGRESS", "1")
            manifests = build(args.only, force=args.force, seed=args.seed)
        else:
            from .formats import load_manifest

            names = [args.only] if args.only else list(DATASET_NAMES)
            manifests = {n: load_manifest(n, build=False) for n in names}
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for n, m in manifests.items():
        print(f"{n}: {dataset_dir(n)}  (seed {m.get('seed')}, built {m.get('built_at')}, {m.get('build_seconds')} s)")
        print(json.dumps(m.get("counts", {}), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
