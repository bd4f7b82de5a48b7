"""Bench section ``text-batch``: ms per text of the live backbone's text encoder by batch size, the figure
the micro-batcher (:mod:`engine.batching`) is built on."""
from __future__ import annotations

import time

import torch

from ..backbones import create_backbone
from ..loadtest import TEXTS
from ..sysinfo import load_average
from .base import SECTIONS


@SECTIONS.register("text-batch")
def section_text_batch(args=None, ctx=None) -> tuple:
    """`python -m engine bench --only text-batch`: the live backbone's text encoder, ms per text by batch size
    (one thread, as one server worker runs it), the figure the micro-batcher is built on."""

    if ctx and ctx.get("engine") is not None:
        backbone = ctx["engine"].backbone
    else:
        s = ctx["settings"]  # the one bench.cli.main built
        backbone = create_backbone(s.backbone, s.device, settings=s)
    encode = backbone.encode_texts
    encode = getattr(encode, "encode", encode)  # the unbatched encoder even where a batcher is installed
    repeats = getattr(args, "text_repeats", 15)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rows = []
    try:
        for size in getattr(args, "text_batches", None) or (1, 2, 4, 8, 16):
            texts = [TEXTS[i % len(TEXTS)] for i in range(size)]
            encode(texts)
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                encode(texts)
                times.append(time.perf_counter() - t)
            ms = 1e3 * sorted(times)[len(times) // 2]
            rows.append((size, ms, ms / size))
    finally:
        torch.set_num_threads(threads)
    load = load_average()
    one = rows[0][2]
    md = [f"Text encoder of `{backbone.name}`, one thread, median of {repeats} forward passes per batch size (texts from "
          f"the load test's mix; load average {load}):", "", "| batch | ms per batch | ms per text | speed-up per text |",
          "|---|---|---|---|"]
    md += [f"| {b} | {ms:.2f} | {per:.2f} | {one / per:.1f}x |" for b, ms, per in rows]
    return "\n".join(md), {"rows": [{"batch": b, "ms": ms, "ms_per_text": per} for b, ms, per in rows], "load": load}
