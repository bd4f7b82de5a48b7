"""Bench section ``indexing``: indexing throughput against the backbone's raw forward pass."""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from .base import SECTIONS


@SECTIONS.register("indexing")
def section_indexing(args, ctx):
    """Indexing throughput (decode + preprocess + embed + write) vs the raw forward pass on the same batch."""
    import torch

    from ..images import load_image
    from ..index.pipeline import build_index

    eng = ctx["engine"]
    b = eng.backbone
    src = Path(eng.index.source)
    files = sorted(src.rglob("*.jpg"))[: args.index_images]
    tmp = Path(tempfile.mkdtemp())
    try:
        for i, f in enumerate(files):
            shutil.copy(f, tmp / f"{i:04d}.jpg")
        batch = torch.stack([b.preprocess(load_image(f)) for f in files[: args.batch_size]])
        with torch.no_grad():
            b.encode_images(batch)  # warm-up
            t = time.perf_counter()
            reps = max(1, len(files) // len(batch))
            for _ in range(reps):
                b.encode_images(batch)
            raw = reps * len(batch) / (time.perf_counter() - t)
        t = time.perf_counter()
        build_index(tmp, tmp / ".idx", b, batch_size=args.batch_size, progress=lambda *a: None)
        full = len(files) / (time.perf_counter() - t)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = full / raw
    md = (f"{len(files)} gallery JPEGs, batch {args.batch_size}, DataLoader workers 2: raw forward "
          f"{raw:.1f} img/s, full indexing (read, decode, preprocess, thumbnail, embed, shard, FAISS, save) "
          f"{full:.1f} img/s -> **ratio {ratio:.2f}** (target >= 0.85).")
    return md, {"raw_img_s": raw, "index_img_s": full, "ratio": ratio}
