"""The one shard format of indexing, for the single-machine runner (:mod:`engine.index.pipeline`) and the Ray
runner (:mod:`engine.index.ray_runner`): an ``.npz`` written atomically holding, row by row,

    hashes      SHA-256 of each embedded image (str)
    embeddings  float16 (N, D)
    sizes       int64 (N, 2): width, height
    paths       relative path of each image (str; the Ray runner's shards, empty in the local cache)
    bytes       file size of each image (int64; Ray, else empty)
    failed, reasons   paths that could not be read and why (Ray, else empty)

The local runner keeps its shards as an embedding cache by content hash (``<out>/cache/<fp hash>/``, names by
time); the Ray runner names each shard by its plan id (``<out>/ray-shards/<fp hash>/shard-<id>.npz``) so a retried
task rewrites the same file. A missing or damaged shard reads as None and is computed again.
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..fileio import atomic_write_bytes

log = logging.getLogger(__name__)


@dataclass
class Shard:
    hashes: np.ndarray
    embeddings: np.ndarray
    sizes: np.ndarray
    paths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=str))
    bytes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    failed: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=str))
    reasons: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=str))


def shard_folder(out: Path, fingerprint: str, kind: str = "cache") -> Path:
    """``<out>/<kind>/<first 16 hex of the fingerprint's SHA-256>``: ``cache`` (local) or ``ray-shards``."""
    return Path(out) / kind / hashlib.sha256(fingerprint.encode()).hexdigest()[:16]


def cache_folder(out: Path, fingerprint: str) -> Path:
    """The local runner's embedding cache (also the feature cache of :mod:`engine.data.features`)."""
    return shard_folder(out, fingerprint, "cache")


def write_shard_file(path: Path, hashes: Sequence[str], embeddings, sizes, paths: Sequence[str] = (),
                     nbytes: Sequence[int] = (), failed: Sequence[str] = (), reasons: Sequence[str] = ()) -> Path:
    """Writes one shard atomically at ``path``."""
    buf = io.BytesIO()
    np.savez(buf, hashes=np.array(list(hashes), dtype=str),
             embeddings=np.asarray(embeddings, dtype=np.float16),
             sizes=np.array(list(sizes), dtype=np.int64).reshape(-1, 2),
             paths=np.array(list(paths), dtype=str), bytes=np.array(list(nbytes), dtype=np.int64),
             failed=np.array(list(failed), dtype=str), reasons=np.array(list(reasons), dtype=str))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, buf.getvalue())
    return path


def read_shard_file(path: Path) -> Optional[Shard]:
    """One shard, or None when it is missing or damaged (its images are then embedded again). Shards written
    before ``paths``/``bytes``/``failed``/``reasons`` existed read with those empty."""
    try:
        with np.load(path, allow_pickle=False) as z:
            return Shard(**{k: z[k] for k in ("hashes", "embeddings", "sizes", "paths", "bytes", "failed", "reasons")
                            if k in z.files})
    except Exception as exc:  # a shard cut short by a crash
        if Path(path).exists():
            log.warning("ignoring damaged shard %s (%s)", Path(path).name, exc)
        return None


def write_shard(folder: Path, hashes: List[str], embeddings: np.ndarray, sizes: List[list]) -> Path:
    """A new shard of the local embedding cache in ``folder`` (a unique name by time and process)."""
    return write_shard_file(Path(folder) / f"shard-{time.time_ns()}-{os.getpid()}.npz", hashes, embeddings, sizes)


def read_shards(folder: Path) -> Dict[str, Tuple[np.ndarray, list]]:
    """{sha256: (embedding float16, [w, h])} from every intact shard in ``folder``; damaged ones are ignored."""
    found: Dict[str, Tuple[np.ndarray, list]] = {}
    for path in sorted(Path(folder).glob("shard-*.npz")):
        shard = read_shard_file(path)
        if shard is not None:
            bad = 0
            for h, e, s in zip(shard.hashes, shard.embeddings, shard.sizes):
                if not np.isfinite(e).all():  # a damaged row: its image is embedded again, the others are kept
                    bad += 1
                    continue
                found[str(h)] = (e, [int(s[0]), int(s[1])])
            if bad:
                log.warning("embedding cache %s: %d rows hold NaN or infinity; those images are embedded again",
                            path.name, bad)
    return found
