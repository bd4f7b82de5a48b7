"""`python -m engine bench`: figures for docs/BENCHMARKS.md, measured in one run on this machine.

Sections (``--only`` picks some): query (per-stage latency per composer/expander, cache speed-up),
indexing (throughput vs the backbone's raw forward pass), ann (search latency and recall@10 per index
type at 100k / 1M synthetic vectors), memory (bytes per gallery item), plus the sections other parts
register in ``EXTRA_SECTIONS`` (ICS, query expansion, Context-I2W, compare mode).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np

from .config import ROOT, Settings
from .plugins import load_plugin, merge_sections

# name -> "module:function"; each function takes (args, ctx) and returns (markdown, json-able dict)
EXTRA_SECTIONS: Dict[str, str] = {
    "expanders": "engine.expand.evaluate:bench_section",
    "ics": "engine.index.ics_bench:bench_section",
    "context-i2w": "engine.train.context_i2w:bench_section",
    "integrity": "engine.index.store:bench_section",
    "prepare-cost": "engine.prepare:bench_section",
    "text-batch": "engine.batching:bench_section",
}


# long sections, run only when named with --only: ICS (~40 min: six hash-head trainings + 1M vectors),
# the 20-client load test (~2.5 min plus start-up)
HEAVY = {"ics", "loadtest"}


def pct(values: List[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def load_average(minutes: int = 1) -> str:
    """The 1-minute (or 1-, 5- and 15-minute, ``minutes=3``) load average from /proc: what else wanted the
    cores while a figure was measured; '?' where there is none."""
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:minutes])
    except OSError:
        return "?"


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return f"{cpu}, {os.cpu_count()} cores, GPU: {gpu}, torch {torch.__version__}, {platform.python_version()}"


def section_query(args, ctx):
    from .search import search

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


def section_indexing(args, ctx):
    """Indexing throughput (decode + preprocess + embed + write) vs the raw forward pass on the same batch."""
    import shutil
    import tempfile

    import torch

    from .index.pipeline import build_index
    from .images import load_image

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


def clustered(n: int, d: int, seed: int = 0, centers: int = 1000) -> np.ndarray:
    """Synthetic normalised embeddings with cluster structure (like real image embeddings)."""
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centers, d)).astype(np.float32)
    x = c[rng.integers(0, centers, size=n)] + 0.6 * rng.normal(size=(n, d)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def ann_queries(n: int, d: int, nq: int, seed: int = 1):
    """(gallery, in-distribution queries, out-of-distribution queries).

    In-distribution queries are held-out points of the gallery's own distribution (drawn with it, kept out
    of it), as real queries are; out-of-distribution ones come from their own random cluster centres, so
    they fall between every data cluster (the hard case, kept as a second row)."""
    x = clustered(n + nq, d, seed=seed)
    return x[:n], x[n:], clustered(nq, d, seed=seed + 1)


def _timed_search(vi, q: np.ndarray, k: int = 10, timed: int = 0):
    """ids of every query (batched) and single-query latencies (ms, one FAISS thread: a server answers
    concurrent queries on separate cores, and OpenMP threads spinning on a shared machine only add noise) of
    the first ``timed`` queries (all when 0)."""
    import faiss

    lat = []
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        for row in q[: timed or len(q)]:
            t = time.perf_counter()
            vi.search(row[None], k)
            lat.append((time.perf_counter() - t) * 1e3)
    finally:
        faiss.omp_set_num_threads(threads)
    return vi.search(q, k)[1], lat


def _recall(ids: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(a[a >= 0]) & set(b)) / len(b) for a, b in zip(ids, exact)]))


def _ivfpq_rows(vi, n, build_s, q_in, q_ood, truth, rows, data):
    """IVF-PQ with exact float16 re-rank of its top candidates, and the same index without re-rank."""
    rerank = vi.rerank
    for rr in ([rerank, 0] if rerank else [0]):
        vi.rerank = rr
        p = vi.params
        label = f"ivfpq (nlist {p['nlist']}, m {p['m']}, nprobe {p['nprobe']}, " + \
            (f"re-rank {rr} from float16)" if rr else "no re-rank)")
        for qname, q in (("in", q_in), ("ood", q_ood)):
            ids, lat = _timed_search(vi, q)
            rec = _recall(ids, truth[qname])
            data[f"ivfpq/rerank{rr}@{n}/{qname}"] = {
                "p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95), "recall@10": rec, "build_s": build_s,
                "bytes_per_item": vi.bytes_per_item(), **{k: p[k] for k in ("nlist", "m", "nprobe")}}
            rows.append(f"| {n:,} | {label} | {qname} | {pct(lat, 50):.2f} | {pct(lat, 95):.2f} | {rec:.3f} | "
                        f"{build_s:.1f} | {vi.bytes_per_item():.0f} |")
    vi.rerank = rerank


ANN_RECALL_MIN, ANN_MS_MAX, ANN_CHECK_N = 0.95, 2.0, 100_000  # issue #17: HNSW target on in-distribution queries


def section_ann(args, ctx):
    from .index.vectors import HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH, create_vector_index

    rows, sweep, data, checks = [], [], {}, []
    d = args.dim
    efcs = sorted({*args.hnsw_efc, HNSW_EF_CONSTRUCTION})
    for n in args.sizes:
        x, q_in, q_ood = ann_queries(n, d, args.ann_queries)
        exact = create_vector_index("flat", d, n)
        exact.build(x)
        truth = {"in": exact.search(q_in, 10)[1], "ood": exact.search(q_ood, 10)[1]}
        best = {"in": float(exact.search(q_in, 1)[0].mean()), "ood": float(exact.search(q_ood, 1)[0].mean())}
        data[f"best_similarity@{n}"] = best
        del exact
        for kind in args.index_types:
            variants = [{}]
            if kind == "ivfpq" and n > args.ivfpq_max:
                rows.append(f"| {n:,} | ivfpq | | skipped: building it would take well over 5 min on this machine "
                            "(100k: about 3 min; 1M has 10x the vectors and 4x the cells to assign them to; raise "
                            "--ivfpq-max to measure) | | | | |")
                continue
            if kind == "hnsw":
                if n > args.hnsw_max:
                    rows.append(f"| {n:,} | hnsw | | skipped: building it takes too long on this machine "
                                f"(raise --hnsw-max to measure) | | | | |")
                    continue
                # every efConstruction of --hnsw-efc at the smallest size (the trade-off), the default above it
                variants = [{"ef_construction": e} for e in (efcs if n == min(args.sizes) else [HNSW_EF_CONSTRUCTION])]
            for opts in variants:
                if kind == "ivf":
                    opts = {"nlist": min(1024, int(4 * np.sqrt(n)))}
                name = kind + (f" efC {opts['ef_construction']}" if "ef_construction" in opts else "")
                vi = create_vector_index(kind, d, n, progress=True, **opts)
                t = time.perf_counter()
                vi.build(x)
                build_s = time.perf_counter() - t
                vi.search(q_in[:5], 10)
                efs = args.hnsw_ef_search if kind == "hnsw" else [None]
                if kind == "ivfpq":
                    _ivfpq_rows(vi, n, build_s, q_in, q_ood, truth, rows, data)
                    efs = []
                for ef in efs:
                    if ef is not None:
                        vi.index.hnsw.efSearch = int(ef)
                    for qname, q in (("in", q_in), ("ood", q_ood)):
                        ids, lat = _timed_search(vi, q, timed=50 if kind == "flat" else 0)
                        rec = _recall(ids, truth[qname])
                        key = f"{name}@{n}/{qname}" + (f"/ef{ef}" if ef is not None else "")
                        data[key] = {"p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95), "recall@10": rec,
                                     "build_s": build_s, "bytes_per_item": vi.bytes_per_item()}
                        if ef is not None:
                            sweep.append(f"| {n:,} | {opts['ef_construction']} | {build_s:.1f} | {ef} | {qname} | "
                                         f"{pct(lat, 50):.2f} | {pct(lat, 95):.2f} | {rec:.3f} |")
                        if ef is None or (ef == HNSW_EF_SEARCH and opts.get("ef_construction") == HNSW_EF_CONSTRUCTION):
                            label = kind + (f" (efC {HNSW_EF_CONSTRUCTION}, efSearch {ef})" if ef else "")
                            rows.append(f"| {n:,} | {label} | {qname} | {pct(lat, 50):.2f} | {pct(lat, 95):.2f} | "
                                        f"{rec:.3f} | {build_s:.1f} | {vi.bytes_per_item():.0f} |")
                            if ef and qname == "in" and n == ANN_CHECK_N:
                                ok = rec >= ANN_RECALL_MIN and pct(lat, 50) <= ANN_MS_MAX
                                checks.append(f"HNSW at {n:,}, in-distribution queries: recall@10 **{rec:.3f}** "
                                              f"(limit >= {ANN_RECALL_MIN}), p50 **{pct(lat, 50):.2f} ms** (limit "
                                              f"<= {ANN_MS_MAX} ms) -> {'pass' if ok else 'FAIL'}.")
                del vi
    sizes = ",".join(str(n) for n in args.sizes)
    md = [f"Synthetic clustered {d}-d normalised vectors (1000 centres), {args.ann_queries} single queries per "
          "set (one FAISS thread), k = 10; recall@10 against exact (flat) search. **in**: held-out points of the gallery's own "
          "distribution (as real queries are drawn); **ood**: points around their own random centres, between "
          "every data cluster (mean best similarity " + ", ".join(
              f"{n:,}: in {data[f'best_similarity@{n}']['in']:.2f} / ood {data[f'best_similarity@{n}']['ood']:.2f}"
              for n in args.sizes) + "). bytes/item of ivfpq: PQ code + 8-byte id, plus the float16 vector when it "
          "re-ranks (parameters from `ivfpq_params`, no memory budget). "
          f"Command: `python -m engine bench --only ann --sizes {sizes}`.", "",
          "| vectors | index | queries | p50 ms | p95 ms | recall@10 | build s | bytes/item |",
          "|---|---|---|---|---|---|---|---|", *rows, "", *checks]
    if sweep:
        md += ["", f"HNSW trade-off (M 32): efConstruction {', '.join(map(str, efcs))} at the smallest size, "
               f"efSearch {', '.join(map(str, args.hnsw_ef_search))}; the product defaults (efConstruction "
               f"{HNSW_EF_CONSTRUCTION}, efSearch {HNSW_EF_SEARCH}, `engine/index/vectors.py`) are chosen from it.",
               "", "| vectors | efConstruction | build s | efSearch | queries | p50 ms | p95 ms | recall@10 |",
               "|---|---|---|---|---|---|---|---|", *sweep]
    return "\n".join(md), data


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


def section_startup(args, ctx):
    """Time until `python app.py` answers, and its resident memory then (index already built)."""
    import socket
    import subprocess
    import sys
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "GRADIO_SERVER_NAME": "127.0.0.1"}
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    ready = None
    try:
        while time.perf_counter() - t < 300 and proc.poll() is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2)
                ready = time.perf_counter() - t
                break
            except OSError:
                time.sleep(0.5)
        rss = 0
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    md = (f"`python app.py` on the bundled gallery with `CIS_BACKBONE={Settings().backbone}` (index already built): "
          f"ready after **{ready:.1f} s**, resident memory **{rss / 2**30:.2f} GiB** "
          "(targets: under 60 s, under 4 GB).") if ready else "`python app.py` did not answer within 300 s."
    return md, {"ready_s": ready, "rss_bytes": rss}


def section_loadtest(args, ctx):
    """`python -m engine loadtest --clients 20 --duration 45` against a fresh `python app.py`: both routes."""
    import subprocess
    import sys
    import tempfile

    cmd = "python -m engine loadtest --clients 20 --duration 45"
    with tempfile.TemporaryDirectory() as tmp:
        summary_path = Path(tmp) / "loadtest.json"
        out = subprocess.run([sys.executable, "-m", "engine", "loadtest", "--clients", "20", "--duration", "45",
                              "--json", str(summary_path)], cwd=ROOT, capture_output=True, text=True)
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    text = out.stdout.strip() or out.stderr.strip()[-2000:]
    md = (f"Targets (issue #16), all from one run: at 20 clients p50 ≤ 1.0 s with 0 errors, `served/limit ratio` "
          f"≥ 0.6 (the compute limit is the machine's cores ÷ the single-query compute time of the same query mix, "
          f"measured in the same run, in the load generator's process before the load, one thread, image features "
          f"cached), the load generator under half a core. The same server is loaded through `POST /api/search` "
          f"(the JSON route for programs) and then through `/search` in Gradio's queue (what the page and "
          f"`gradio_client` use); docs/deploy.md, *Load test*, says which client should use which. The compute "
          f"limit is for queries one at a time; served searches share batched text encodes "
          f"(`engine/batching.py`), so a ratio above 1 is possible.\n\n"
          f"Output of `{cmd}`:\n\n```\n{text}\n```")
    routes = summary.get("routes", {})
    if routes:
        rows = ["| Target | " + " | ".join(f"`{r}`" for r in routes) + " |", "|---" * (len(routes) + 1) + "|"]

        def row(label, fn):
            rows.append(f"| {label} | " + " | ".join(fn(r) for r in routes.values()) + " |")

        ok = lambda c: "met" if c else "**not met**"  # noqa: E731
        row("p50 ≤ 1.0 s", lambda r: f"{r['latency_ms']['p50'] / 1e3:.2f} s, {ok(r['latency_ms']['p50'] <= 1000)}")
        row("errors = 0", lambda r: f"{r['errors']}, {ok(r['errors'] == 0)}")
        row("served/limit ≥ 0.6", lambda r: f"{r['requests_per_s']} / {r['compute']['limit_qps']} requests/s = "
            f"{r['served_limit_ratio']}, {ok((r['served_limit_ratio'] or 0) >= 0.6)}")
        row("generator CPU < 0.5 core", lambda r: f"{r['generator_cpu_cores']}, {ok(r['generator_cpu_cores'] < 0.5)}")
        row("load average (start → end)", lambda r: " → ".join(r["load_average"]))
        md += "\n\n" + "\n".join(rows)
    return md, {"returncode": out.returncode, **summary}


def section_info(args, ctx):
    """`python -m engine info --bench`: info answered without loading models vs a bare `import torch`."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "engine", "info", "--bench"], cwd=ROOT, capture_output=True, text=True)
    text = out.stdout.strip() or out.stderr.strip()[-2000:]
    return ("`python -m engine info` answers from the configuration without loading any model (`--load` loads the "
            "backbone). Output of `python -m engine info --bench` (fresh processes, one run; target: info "
            "≤ 2 × bare `import torch`):\n\n```\n" + text + "\n```"), {"returncode": out.returncode}


def section_compare(args, ctx):
    from .compare import bench_compare

    eng = ctx["engine"]
    sec = bench_compare(eng, repeats=3)
    from .compare import compare_plan

    cols = len(compare_plan(eng, lattqe=None))
    md = (f"Compare mode (one query through every available method: {', '.join(eng.composers)}, each also with "
          f"LAttQE when it is available: {cols} columns) on the bundled gallery: median **{sec:.2f} s** for all "
          f"columns together (target < 2 s).")
    return md, {"compare_all_methods_s": sec, "methods": list(eng.composers), "columns": cols}


SECTIONS: Dict[str, Callable] = {"query": section_query, "indexing": section_indexing, "ann": section_ann,
                                 "memory": section_memory, "compare": section_compare, "startup": section_startup,
                                 "info": section_info, "loadtest": section_loadtest}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine bench", description=__doc__.split("\n")[0])
    p.add_argument("--only", default="", help="comma-separated sections: " + ",".join([*SECTIONS, *EXTRA_SECTIONS]))
    p.add_argument("--skip", default="", help="comma-separated sections to skip")
    p.add_argument("--queries", type=int, default=30)
    p.add_argument("--sizes", default="100000,1000000", help="synthetic gallery sizes for the ANN section")
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--ann-queries", type=int, default=200)
    p.add_argument("--index-types", default="flat,ivf,hnsw,ivfpq")
    p.add_argument("--hnsw-max", type=int, default=200_000, help="largest synthetic gallery to build HNSW for "
                   "(1M takes over 15 min on 2 loaded cores)")
    p.add_argument("--ivfpq-max", type=int, default=1_000_000, help="largest synthetic gallery to build IVF-PQ "
                   "for (1M: 4096 cells, about 2 min to build on 2 quiet cores)")
    p.add_argument("--hnsw-efc", default="40,80", help="HNSW efConstruction values compared at the smallest size")
    p.add_argument("--hnsw-ef-search", default="16,32,64,128", help="HNSW efSearch values measured")
    p.add_argument("--ics-million-only", action="store_true", help="ics section: only the 1M speed table (a few "
                   "minutes), keeping the mAP / recall tables of the last full run in --out")
    p.add_argument("--ics-threads", type=int, default=1, help="ics section: cores the compact indexes' Hamming "
                   "scan is split over (the rest of a query runs on one)")
    p.add_argument("--index-images", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--out", default=str(ROOT / "docs" / "BENCHMARKS.md"), help="markdown file to write ('' = none)")
    p.add_argument("--json", default="", help="also write the raw figures as JSON here")
    args = p.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    args.index_types = [s for s in args.index_types.split(",") if s]
    args.hnsw_efc = [int(s) for s in args.hnsw_efc.split(",") if s]
    args.hnsw_ef_search = [int(s) for s in args.hnsw_ef_search.split(",") if s]
    names = [n for n in [*SECTIONS, *EXTRA_SECTIONS] if n not in HEAVY]
    if args.only:
        names = [n for n in args.only.split(",") if n]
    names = [n for n in names if n not in set(args.skip.split(","))]
    from .service import load_default_engine

    ctx = {"engine": load_default_engine(Settings())}
    parts = [f"# Benchmarks\n\nWritten by `python -m engine bench` on {time.strftime('%Y-%m-%d')}.\n\n"
             f"**Machine:** {machine()}\n\nRatios are measured within one run; the machine is shared and noisy."]
    raw = {}
    for name in names:
        if name in SECTIONS:
            fn = SECTIONS[name]
        else:
            fn = load_plugin(EXTRA_SECTIONS[name])  # a broken section module fails the run loudly
        print(f"[bench] {name} ...", flush=True)
        t = time.perf_counter()
        md, data = fn(args, ctx)
        print(md, flush=True)
        print(f"[bench] {name} took {time.perf_counter() - t:.0f} s", flush=True)
        # each section carries its own date and machine, so `--only X` rewrites X's line with X
        parts.append(f"## {name}\n\n_Measured {time.strftime('%Y-%m-%d')} on {machine()}._\n\n{md}")
        raw[name] = data
    text = "\n\n".join(parts) + "\n"
    if args.out:
        out = Path(args.out)
        if out.exists() and args.only:
            text = merge_sections(out.read_text(), parts[1:])
        from .fileio import atomic_write_text

        atomic_write_text(out, text)
        print(f"[bench] wrote {out}")
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=2, default=float))
    return 0

