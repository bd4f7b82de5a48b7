"""Builder of the ``labelled`` set: single-label retrieval sets (Fashion-MNIST, emoji, photos)."""
from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path
from typing import Optional

from PIL import Image

from .. import fashion_mnist
from ..formats import (
    IMAGES_DIRNAME,
    write_jsonl,
)
from .common import (
    FMNIST_SMALL_DB_PER_CLASS,
    FMNIST_SMALL_QUERY_PER_CLASS,
    FMNIST_VAL_CLASSES,
    SPLITS,
    Inputs,
    _emoji_rel,
    _link_or_copy,
    _photo_sources,
    _progress,
    _twemoji_sources,
    class_disjoint_split,
    query_db_split,
)


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
            for i in _progress(range(len(xs)), f"labelled: fmnist {file_split}", total=len(xs), show=inp.progress):
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
