"""Bench sections on the loaded engine: per-stage query latency and cache speed-up (``query``), bytes per
gallery item (``memory``) and compare mode (``compare``)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, List

import numpy as np

from .base import SECTIONS, pct


@SECTIONS.register("query")
def section_query(args, ctx):
    from ..search import search

    eng = ctx["engine"]
    rng = np.random.default_rng(0)
    ids = rng.choice(len(eng.index), size=min(args.queries, len(eng.index)), replace=False)
    rows, data = [], {}
    for method in eng.composers:
        for expand in ["none"] + [e for e in eng.expanders if e != "none"]:
            stages: Dict[str, List[float]] = {}
            for n, i in enumerate(ids):
                eng.cache._d.clear()
                resp = search(eng, image=int(i), text="the same but red", method=method, expand=expand, k=12)
                for k, v in resp.timings_ms.items():
                    if k != "image_cache_hit":
                        stages.setdefault(k, []).append(v)
            data[f"{method}/{expand}"] = {k: {"p50": pct(v, 50), "p95": pct(v, 95)} for k, v in stages.items()}
            tot = stages["total"]
            rows.append(f"| {method} | {expand} | " + " | ".join(
                f"{pct(stages.get(s, []), 50):.1f} / {pct(stages.get(s, []), 95):.1f}"
                for s in ("encode_image", "compose", "search", "expand")) + f" | {pct(tot, 50):.1f} / {pct(tot, 95):.1f} |")
    # cache: the same image again (features from the content-hash cache) vs the first time
    path = str(eng.index.image_path(int(ids[0])))
    firsts, repeats = [], []
    for n in range(args.queries):
        eng.cache._d.clear()
        t = time.perf_counter()
        search(eng, image=path, text="at night", method="sum")
        firsts.append((time.perf_counter() - t) * 1e3)
        t = time.perf_counter()
        search(eng, image=path, text="in the snow", method="sum")
        repeats.append((time.perf_counter() - t) * 1e3)
    speed = pct(firsts, 50) / max(pct(repeats, 50), 1e-9)
    data["cache"] = {"first_ms_p50": pct(firsts, 50), "repeat_ms_p50": pct(repeats, 50), "speedup": speed}
    md = [f"Bundled gallery ({len(eng.index)} images), backbone `{eng.backbone.name}`, {len(ids)} queries "
          "(gallery images as references, text 'the same but red'), feature cache cleared before each query.",
          "", "| method | expansion | encode image p50/p95 ms | compose | search | expand | total |",
          "|---|---|---|---|---|---|---|", *rows, "",
          f"Same reference image again (features from the content-hash cache): first query p50 "
          f"{pct(firsts, 50):.1f} ms, repeated {pct(repeats, 50):.1f} ms -> **{speed:.1f}x** faster (target >= 5x)."]
    return "\n".join(md), data



@SECTIONS.register("memory")
def section_memory(args, ctx):
    eng = ctx["engine"]
    st = eng.index.stats()
    vi = st.get("vector_index", {})
    thumbs = sum(p.stat().st_size for p in (Path(eng.index.folder) / "thumbs").glob("*.jpg"))
    n = max(1, len(eng.index))
    per = {"embedding_float16": 2 * eng.index.dim, "vector_index": vi.get("bytes_per_item", 0),
           "thumbnail_avg": thumbs / n}
    md = (f"Per gallery item ({eng.index.dim}-d): stored float16 embedding {per['embedding_float16']} B, "
          f"in-memory vector index ({vi.get('type')}) {per['vector_index']:.0f} B, thumbnail {per['thumbnail_avg']:.0f} B.")
    return md, per



@SECTIONS.register("compare")
def section_compare(args, ctx):
    from ..compare import bench_compare

    eng = ctx["engine"]
    sec = bench_compare(eng, repeats=args.compare_repeats)
    from ..compare import compare_plan

    cols = len(compare_plan(eng, lattqe=None))
    md = (f"Compare mode (one query through every available method: {', '.join(eng.composers)}, each also with "
          f"LAttQE when it is available: {cols} columns) on the bundled gallery: median **{sec:.2f} s** for all "
          f"columns together (target < 2 s).")
    return md, {"compare_all_methods_s": sec, "methods": list(eng.composers), "columns": cols}

