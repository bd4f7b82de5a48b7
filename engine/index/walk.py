"""Stage 1 of indexing: find image files and their captions under a folder."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List

from ..images import IMAGE_EXTENSIONS

CAPTION_FILES = ("captions.json",)


def find_images(root: Path) -> List[str]:
    """Relative POSIX paths of image files under ``root``, sorted; hidden folders and symlinks skipped."""
    root = Path(root)
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if p.is_symlink() or not p.is_file():
            continue
        if p.suffix.lower() in IMAGE_EXTENSIONS:
            out.append(rel.as_posix())
    return out


def load_captions(root: Path, rel_paths: List[str]) -> Dict[str, str]:
    """Captions from ``captions.json`` ({relative path: caption}) or a ``<image>.txt`` sidecar."""
    root = Path(root)
    caps: Dict[str, str] = {}
    for name in CAPTION_FILES:
        f = root / name
        if f.is_file():
            try:
                data = json.loads(f.read_text(encoding="utf-8"))
                caps.update({str(k): str(v) for k, v in data.items()})
            except (ValueError, AttributeError):
                pass
    for rel in rel_paths:
        side = (root / rel).with_suffix(".txt")
        if side.is_file() and side.stat().st_size < 10_000:
            caps[rel] = side.read_text(encoding="utf-8", errors="replace").strip()
    wanted = set(rel_paths)
    return {k: v for k, v in caps.items() if k in wanted}
