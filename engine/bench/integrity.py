"""Bench section ``integrity``: what verifying the checksums adds to loading an index folder."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from ..index.store import GalleryIndex, verify_checksums
from .base import SECTIONS


@SECTIONS.register("integrity")
def section_integrity(args, ctx):
    """`python -m engine bench --only integrity`: what verifying the checksums adds to loading an index,
    on synthetic galleries of ``args.sizes`` items x ``args.dim`` float16 dims (vector index not built)."""
    rows, data = [], {}
    for n in args.sizes:
        with tempfile.TemporaryDirectory(dir=ctx.get("tmp")) as tmp:
            rng = np.random.default_rng(0)
            emb = rng.standard_normal((n, args.dim), dtype=np.float32).astype(np.float16)
            items = [{"id": i, "path": f"{i:07d}.jpg", "sha256": f"{i:064x}", "caption": ""} for i in range(n)]
            GalleryIndex(Path(tmp), {"fingerprint": "bench", "source": tmp}, items, emb).save()
            del emb, items
            version = Path(tmp) / (Path(tmp) / "CURRENT").read_text().strip()
            size = sum(p.stat().st_size for p in version.iterdir())
            plain, checked, verify_only = [], [], []
            for _ in range(3):
                t = time.perf_counter()
                GalleryIndex.load(tmp, build_vectors=False, verify=False)
                plain.append(time.perf_counter() - t)
                t = time.perf_counter()
                GalleryIndex.load(tmp, build_vectors=False)
                checked.append(time.perf_counter() - t)
                t = time.perf_counter()
                verify_checksums(version)
                verify_only.append(time.perf_counter() - t)
        a, b, v = min(plain), min(checked), min(verify_only)
        data[n] = {"bytes": size, "load_s": a, "load_verified_s": b, "verify_s": v}
        rows.append(f"| {n:,} | {size / 1e6:,.0f} MB | {a:.2f} s | {b:.2f} s | {v:.2f} s ({size / 1e6 / v:,.0f} MB/s) "
                    f"| {b / a:.2f}x |")
    md = "\n".join([
        f"Loading an index folder (items.jsonl, meta.json, {args.dim}-d float16 embeddings; best of 3) with and "
        "without verifying the SHA-256 checksum of every file (streamed in 1 MB blocks; memory stays flat). "
        f"Command: `python -m engine bench --only integrity --sizes {','.join(str(n) for n in args.sizes)}`. "
        "Loads always verify; the cost is a fraction of parsing the item list, so there is no switch to skip it.",
        "", "| items | files | load, no verification | load, verified | verification alone | ratio |",
        "|---:|---:|---:|---:|---:|---:|", *rows])
    return md, data
