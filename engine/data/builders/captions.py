"""Builder of the ``captions`` set: image / caption pairs."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from .. import twemoji
from ..formats import IMAGES_DIRNAME, write_jsonl
from .common import (SPLITS, Inputs, _emoji_groups, _emoji_rel, _link_or_copy, _photo_sources, _progress,
                     _twemoji_sources, assign_split, emoji_group_splits)


def build_captions(out: Path, inp: Inputs, seed: int) -> dict:
    groups = _emoji_groups(inp)
    gsplit = emoji_group_splits(inp.emojis, seed)
    records: dict[str, list[dict]] = {s: [] for s in SPLITS}
    img_root = out / IMAGES_DIRNAME
    for e in _progress(inp.emojis, "captions: emoji", show=inp.progress):
        _link_or_copy(inp.emoji_img_dir / e.image, img_root / _emoji_rel(e))
        records[gsplit[groups[e.key]]].append({
            "id": f"twemoji:{e.key}", "image": _emoji_rel(e), "caption": twemoji.caption(e),
            "source": "twemoji", "group": groups[e.key], "licence": twemoji.LICENCE_IMAGES,
        })
    for p in _progress(inp.photos, "captions: photos", show=inp.progress):
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
