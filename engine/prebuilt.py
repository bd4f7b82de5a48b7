"""The prebuilt index of the bundled gallery (``assets/prebuilt/``), so the demo's first start embeds nothing.

``gallery-<backbone slug>.npz`` holds, per bundled photo, its content hash, its float16 embedding and its size
(the layout of the indexer's own cache shards, engine/index/pipeline.py); ``gallery-<backbone slug>.json`` says
which backbone fingerprint produced it and with which command. On a first start with an empty cache
(:func:`seed_index`) the file is copied into the new index's embedding cache when the live backbone's
fingerprint is the recorded one: the indexer then finds every unchanged photo already embedded and embeds only
photos that changed. Another backbone (CLIP, another packaged variant, new concept weights) finds no matching
file and the gallery is embedded as before. Regenerate with ``python tools/build_gallery.py --embeddings``.
"""
from __future__ import annotations

import io
import json
import logging
import shutil
from pathlib import Path
from typing import Optional

import numpy as np

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parent.parent
PREBUILT_DIR = ROOT / "assets" / "prebuilt"
BUNDLED_GALLERY = ROOT / "assets" / "gallery"
SHARD_NAME = "shard-0-prebuilt.npz"


def _slug(backbone_name: str) -> str:
    from .checkpoints import slug

    return slug(backbone_name)


def prebuilt_paths(backbone_name: str, folder: Optional[Path] = None):
    """(embeddings .npz, record .json) for a backbone name."""
    folder = Path(folder or PREBUILT_DIR)
    stem = f"gallery-{_slug(backbone_name)}"
    return folder / f"{stem}.npz", folder / f"{stem}.json"


def read_record(backbone, folder: Optional[Path] = None) -> Optional[dict]:
    """The prebuilt record for ``backbone`` when one exists and names its fingerprint, else None."""
    npz, rec = prebuilt_paths(backbone.name, folder)
    try:
        record = json.loads(rec.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not npz.is_file() or record.get("fingerprint") != backbone.fingerprint:
        return None
    return record


def is_bundled(gallery) -> bool:
    try:
        return Path(gallery).resolve() == BUNDLED_GALLERY.resolve()
    except OSError:
        return False


def seed_index(gallery, out, backbone, folder: Optional[Path] = None) -> bool:
    """Before the first build of ``gallery``'s index at ``out``: put the prebuilt embeddings in its cache
    when ``gallery`` is the bundled one and the backbone is the one they were made with. True when seeded."""
    from .index.pipeline import cache_folder

    if not is_bundled(gallery):
        return False
    record = read_record(backbone, folder)
    if record is None:
        log.info("no prebuilt gallery index for %s; embedding the gallery", backbone.fingerprint)
        return False
    cache = cache_folder(Path(out), backbone.fingerprint)
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / SHARD_NAME
    if not target.exists():
        tmp = target.with_suffix(".tmp")
        shutil.copyfile(prebuilt_paths(backbone.name, folder)[0], tmp)
        tmp.replace(target)
    log.debug("using the prebuilt index of the bundled gallery (%d photos, %s)", record.get("count", 0),
              prebuilt_paths(backbone.name, folder)[0].name)
    return True


def write_prebuilt(index, backbone, command: str, folder: Optional[Path] = None) -> Path:
    """Writes the prebuilt files for ``index`` (an index of the bundled gallery built with ``backbone``)."""
    from .fileio import atomic_write_bytes, atomic_write_text

    if index.fingerprint != backbone.fingerprint:
        raise ValueError("the index was built with another backbone")
    npz, rec = prebuilt_paths(backbone.name, folder)
    npz.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez_compressed(buf, hashes=np.array([it["sha256"] for it in index.items]),
                        embeddings=index.embeddings.astype(np.float16),
                        sizes=np.array([[int(it["width"]), int(it["height"])] for it in index.items]))
    atomic_write_bytes(npz, buf.getvalue())
    record = {"kind": "prebuilt-gallery", "fingerprint": backbone.fingerprint, "backbone": backbone.name,
              "count": len(index), "dim": int(index.dim), "gallery": "assets/gallery", "command": command}
    atomic_write_text(rec, json.dumps(record, indent=2) + "\n")
    write_text_tables(backbone, npz.parent / "packaged")
    return npz


def write_text_tables(backbone, folder: Path) -> list:
    """Copies the packaged backbone's text tables (ImageNet class prompts, concept prompts, as the backbone cached
    them) to ``folder``, where the backbone finds them on a first start with an empty cache."""
    from .config import cache_dir

    names = list(getattr(backbone, "text_tables", []))
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("text-*.npy"):
        if old.name not in names:
            old.unlink()
    for name in names:
        src = cache_dir() / "packaged" / name
        if src.is_file():
            tmp = folder / f".{name}.tmp"
            shutil.copyfile(src, tmp)
            tmp.replace(folder / name)
    return names
