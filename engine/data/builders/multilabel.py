"""Builder of the ``multilabel`` set (hashing): Twemoji + Tux Paint category paths."""
from __future__ import annotations

import random
from pathlib import Path

from ..formats import IMAGES_DIRNAME, write_json, write_jsonl
from .common import (QUERY_FRACTION, SPLITS, Inputs, _emoji_groups, _emoji_rel, _link_or_copy, _photo_sources,
                     _twemoji_sources, assign_split, emoji_group_splits)


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
