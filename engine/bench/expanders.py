"""Bench section ``expanders``: added latency per query of each query expander."""
from __future__ import annotations

import numpy as np

from ..search import search
from ..eval.expanders import bench_expanders
from .base import SECTIONS


@SECTIONS.register("expanders")
def section_expanders(args, ctx):
    """Added latency per query of each expander at k = 64 for 512-d embeddings, share of a whole query."""
    eng = ctx["engine"]
    times = []
    for i in range(min(10, len(eng.index))):
        times.append(search(eng, image=i, text="the same but red", method="sum").timings_ms["total"])
    e2e = float(np.median(times))
    res = bench_expanders(dim=512, k=64, n_gallery=args.expander_gallery, n_queries=args.expander_queries,
                          end_to_end_ms=e2e)
    rows = [f"| {name} | {r['expand_ms']:.2f} | {r['second_search_ms']:.2f} | {r['added_ms']:.2f} | "
            f"{100 * r.get('share', float('nan')):.1f}% | {r['batched_qps']:.0f} |" for name, r in res.items()]
    md = "\n".join([
        f"512-d synthetic gallery of {args.expander_gallery:,}, nQE = 64, {args.expander_queries} queries; share = added / (end-to-end query without "
        f"expansion on the bundled gallery, p50 {e2e:.1f} ms, + added). Target for LAttQE: at most 20%. "
        "The paper reports about 250 queries/s for LAttQE on a Tesla M40 GPU.", "",
        "| expander | expand ms | second search ms | added ms | share of query | batched queries/s |",
        "|---|---|---|---|---|---|", *rows])
    return md, res
