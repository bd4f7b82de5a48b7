"""Bench section ``ann``: search latency and recall@10 per vector-index type on synthetic galleries."""
from __future__ import annotations

import time

import numpy as np

from ..eval.metrics import approximate_recall
from ..index.vectors import HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH, create_vector_index
from .base import SECTIONS, pct


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
            rec = approximate_recall(ids, truth[qname])
            data[f"ivfpq/rerank{rr}@{n}/{qname}"] = {
                "p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95), "recall@10": rec, "build_s": build_s,
                "bytes_per_item": vi.bytes_per_item(), **{k: p[k] for k in ("nlist", "m", "nprobe")}}
            rows.append(f"| {n:,} | {label} | {qname} | {pct(lat, 50):.2f} | {pct(lat, 95):.2f} | {rec:.3f} | "
                        f"{build_s:.1f} | {vi.bytes_per_item():.0f} |")
    vi.rerank = rerank


ANN_RECALL_MIN, ANN_MS_MAX, ANN_CHECK_N = 0.95, 2.0, 100_000  # issue #17: HNSW target on in-distribution queries


class _Tables:
    """The rows, efSearch sweep, raw figures and target checks that ``section_ann`` collects."""

    def __init__(self):
        self.rows, self.sweep, self.data, self.checks = [], [], {}, []


def _variants(kind: str, n: int, args, efcs, out: _Tables):
    """Build options to measure for index ``kind`` at ``n`` vectors ([] = skipped, with a row saying why)."""
    if kind == "ivfpq" and n > args.ivfpq_max:
        out.rows.append(f"| {n:,} | ivfpq | | skipped: building it would take well over 5 min on this machine "
                        "(100k: about 3 min; 1M has 10x the vectors and 4x the cells to assign them to; raise "
                        "--ivfpq-max to measure) | | | | |")
        return []
    if kind == "hnsw":
        if n > args.hnsw_max:
            out.rows.append(f"| {n:,} | hnsw | | skipped: building it takes too long on this machine "
                            f"(raise --hnsw-max to measure) | | | | |")
            return []
        # every efConstruction of --hnsw-efc at the smallest size (the trade-off), the default above it
        return [{"ef_construction": e} for e in (efcs if n == min(args.sizes) else [HNSW_EF_CONSTRUCTION])]
    if kind == "ivf":
        return [{"nlist": min(1024, int(4 * np.sqrt(n)))}]
    return [{}]


def _measure(vi, kind: str, opts: dict, n: int, build_s: float, queries: dict, truth: dict, args, out: _Tables):
    """Latency and recall of one built index (every efSearch of the sweep for HNSW) into ``out``."""
    name = kind + (f" efC {opts['ef_construction']}" if "ef_construction" in opts else "")
    for ef in (args.hnsw_ef_search if kind == "hnsw" else [None]):
        if ef is not None:
            vi.index.hnsw.efSearch = int(ef)
        for qname, q in queries.items():
            ids, lat = _timed_search(vi, q, timed=50 if kind == "flat" else 0)
            rec = approximate_recall(ids, truth[qname])
            key = f"{name}@{n}/{qname}" + (f"/ef{ef}" if ef is not None else "")
            out.data[key] = {"p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95), "recall@10": rec,
                             "build_s": build_s, "bytes_per_item": vi.bytes_per_item()}
            if ef is not None:
                out.sweep.append(f"| {n:,} | {opts['ef_construction']} | {build_s:.1f} | {ef} | {qname} | "
                                 f"{pct(lat, 50):.2f} | {pct(lat, 95):.2f} | {rec:.3f} |")
            if ef is not None and (ef != HNSW_EF_SEARCH or opts.get("ef_construction") != HNSW_EF_CONSTRUCTION):
                continue
            label = kind + (f" (efC {HNSW_EF_CONSTRUCTION}, efSearch {ef})" if ef else "")
            out.rows.append(f"| {n:,} | {label} | {qname} | {pct(lat, 50):.2f} | {pct(lat, 95):.2f} | "
                            f"{rec:.3f} | {build_s:.1f} | {vi.bytes_per_item():.0f} |")
            if ef and qname == "in" and n == ANN_CHECK_N:
                ok = rec >= ANN_RECALL_MIN and pct(lat, 50) <= ANN_MS_MAX
                out.checks.append(f"HNSW at {n:,}, in-distribution queries: recall@10 **{rec:.3f}** "
                                  f"(limit >= {ANN_RECALL_MIN}), p50 **{pct(lat, 50):.2f} ms** (limit "
                                  f"<= {ANN_MS_MAX} ms) -> {'pass' if ok else 'FAIL'}.")


@SECTIONS.register("ann")
def section_ann(args, ctx):
    out = _Tables()
    d = args.dim
    efcs = sorted({*args.hnsw_efc, HNSW_EF_CONSTRUCTION})
    for n in args.sizes:
        x, q_in, q_ood = ann_queries(n, d, args.ann_queries)
        exact = create_vector_index("flat", d, n)
        exact.build(x)
        truth = {"in": exact.search(q_in, 10)[1], "ood": exact.search(q_ood, 10)[1]}
        best = {"in": float(exact.search(q_in, 1)[0].mean()), "ood": float(exact.search(q_ood, 1)[0].mean())}
        out.data[f"best_similarity@{n}"] = best
        del exact
        for kind in args.index_types:
            for opts in _variants(kind, n, args, efcs, out):
                vi = create_vector_index(kind, d, n, progress=True, **opts)
                t = time.perf_counter()
                vi.build(x)
                build_s = time.perf_counter() - t
                vi.search(q_in[:5], 10)
                if kind == "ivfpq":
                    _ivfpq_rows(vi, n, build_s, q_in, q_ood, truth, out.rows, out.data)
                else:
                    _measure(vi, kind, opts, n, build_s, {"in": q_in, "ood": q_ood}, truth, args, out)
                del vi
    return _markdown(args, efcs, out), out.data


def _markdown(args, efcs, out: _Tables) -> str:
    data, d = out.data, args.dim
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
          "|---|---|---|---|---|---|---|---|", *out.rows, "", *out.checks]
    if out.sweep:
        md += ["", f"HNSW trade-off (M 32): efConstruction {', '.join(map(str, efcs))} at the smallest size, "
               f"efSearch {', '.join(map(str, args.hnsw_ef_search))}; the product defaults (efConstruction "
               f"{HNSW_EF_CONSTRUCTION}, efSearch {HNSW_EF_SEARCH}, `engine/index/vectors.py`) are chosen from it.",
               "", "| vectors | efConstruction | build s | efSearch | queries | p50 ms | p95 ms | recall@10 |",
               "|---|---|---|---|---|---|---|---|", *out.sweep]
    return "\n".join(md)

