"""Image embeddings of arbitrary files with a backbone, cached on disk by (backbone, content hash).

Training and evaluation code calls :func:`embed_paths`; it shares the decode stage and the shard
cache format with gallery indexing (``engine.index.pipeline``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..config import cache_dir
from ..errors import InputError
from ..images import sha256_file
from ..index.pipeline import (
    DecodeDataset,
    _collate,
    cache_folder,
    read_shards,
    write_shard,
)


def embed_paths(backbone, paths: Sequence, batch_size: int = 64, workers: Optional[int] = None,
                cache: bool = True, desc: str = "embedding") -> np.ndarray:
    """float32 (N, D) L2-normalised embeddings of the image files ``paths`` (order kept).

    Files that cannot be decoded raise InputError naming the first one.
    """
    from tqdm.auto import tqdm

    paths = [Path(p) for p in paths]
    hashes = [sha256_file(p) for p in paths]
    folder = cache_folder(cache_dir() / "features", backbone.fingerprint)
    known = read_shards(folder) if cache else {}
    todo = sorted({h: i for i, h in enumerate(hashes) if h not in known}.values())
    if todo:
        ds = DecodeDataset(Path("/"), [str(paths[i].resolve()) for i in todo], [hashes[i] for i in todo],
                           backbone.preprocess, None, 40_000_000)
        ds.root = Path(os.sep)
        if workers is None:
            workers = min(2, os.cpu_count() or 1)
        loader = DataLoader(ds, batch_size=batch_size, num_workers=workers, collate_fn=_collate)
        with tqdm(total=len(todo), desc=desc, unit="img") as bar:
            for batch in loader:
                if batch["failed"]:
                    j, err = batch["failed"][0]
                    raise InputError(f"cannot embed {paths[todo[j]]}: {err}")
                with torch.no_grad():
                    emb = backbone.encode_images(batch["pixels"]).float().cpu().numpy()
                hs = [hashes[todo[j]] for j in batch["i"]]
                for h, e, s in zip(hs, emb, batch["size"]):
                    known[h] = (e.astype(np.float16), s)
                if cache:
                    write_shard(folder, hs, emb, batch["size"])
                bar.update(len(batch["i"]))
    return np.stack([known[h][0] for h in hashes]).astype(np.float32) if hashes else np.zeros(
        (0, backbone.embed_dim), np.float32)


def embed_texts(backbone, texts: Sequence[str], batch_size: int = 256) -> np.ndarray:
    """float32 (N, D) normalised text embeddings (no disk cache: text encoding is cheap)."""
    if not texts:
        return np.zeros((0, backbone.embed_dim), np.float32)
    out = [backbone.encode_texts(list(texts[i : i + batch_size])).embeddings.float().cpu().numpy()
           for i in range(0, len(texts), batch_size)]
    return np.concatenate(out).astype(np.float32)
