"""Evaluation and reporting of query expansion: mAP vs nQE on held-out classes for every expander
(:func:`evaluate_expanders`) on the labelled set's features (:func:`labelled_features`), plots, the Markdown table, and the cost of each expander (:func:`bench_expanders`).

Read by `eval offline --only query-expansion` (``engine.eval.expansion``), `bench --only expanders` and the LAttQE
trainer (``engine.train.lattqe``: its validation mAP and its report), which sits above it."""
from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence, Tuple

import numpy as np
import torch
from tqdm.auto import tqdm

from ..backbones import create_backbone
from ..data.builders import ensure_built
from ..data.features import embed_paths
from ..data.formats import image_path, load_split
from ..errors import InputError
from ..expand import EXPANDERS
from ..expand.base import l2n
from ..expand.baselines import DEFAULT_ALPHA, expand_batch
from ..expand.dba import dba_vectors, knn
from ..expand.lattqe import LAttQEConfig, LAttQEExpander, LAttQEModel, expand_numpy
from ..fileio import atomic_save_figure
from ..labels import expand_label
from .metrics import average_precisions as core_aps

NQE_LIST = (1, 2, 4, 8, 16, 32, 64, 128)
QE_METHODS = ("aqe", "aqewd", "alpha-qe", "lattqe")
DBA_NAMES = {"aqe": "adba", "alpha-qe": "alpha-dba", "lattqe": "lattdba"}


# ============================================================================ data helpers


# the labelled set's files of each split: "test" is the held-out query + db
HELD_OUT_FILES = {"train": ("train",), "val": ("val",), "test": ("query", "db")}


def labelled_features(parts: Sequence[str], backbone_name: str = "packaged", device: str = "auto",
                      splits: Sequence[str] = ("train", "val", "test"), max_per_class: int = 0, seed: int = 0,
                      ) -> Tuple[Dict[str, Tuple[np.ndarray, np.ndarray]], str]:
    """Embed the offline ``labelled`` set (parts e.g. emoji, photos, fmnist_small) with a backbone.

    Returns ({split: (embeddings, labels "part:label")}, backbone fingerprint). Splits are class
    disjoint; "test" is the held-out query + db files (parts without test classes are skipped there).
    ``max_per_class`` > 0 keeps at most that many random images per class and split.
    """
    ensure_built("labelled")  # the explicit build step (quick when built)
    backbone = create_backbone(backbone_name, device)
    out = {}
    for split in splits:
        paths, labels = [], []
        for part in parts:
            if split == "test" and part.startswith("fmnist"):
                continue  # Fashion-MNIST parts have train + val classes only (their query/db mix both)
            recs = [r for name in HELD_OUT_FILES[split] for r in load_split("labelled", name, part)]
            if max_per_class > 0:
                by: Dict[str, list] = {}
                for r in recs:
                    by.setdefault(str(r["label"]), []).append(r)
                rng = random.Random(f"{seed}:{part}:{split}")
                recs = [r for lab in sorted(by) for r in (by[lab] if len(by[lab]) <= max_per_class
                                                          else rng.sample(by[lab], max_per_class))]
            for r in recs:
                paths.append(image_path("labelled", r["image"]))
                labels.append(f"{part}:{r['label']}")
        if paths:
            x = embed_paths(backbone, paths, desc=f"embedding labelled {split}")
            out[split] = (np.asarray(x, np.float32), np.asarray(labels))
    return out, backbone.fingerprint


def encode_labels(labels: Sequence) -> np.ndarray:
    """Any labels -> int64 codes 0..C-1."""
    _, codes = np.unique(np.asarray(labels), return_inverse=True)
    return codes.astype(np.int64)


def average_precisions(scores: torch.Tensor, q_labels: torch.Tensor, g_labels: torch.Tensor,
                       self_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
    """AP per query over the full ranking of the gallery (relevant = same label), the query's own item
    excluded; NaN for a query without any relevant item. Computed by the evaluation core
    (:func:`engine.eval.metrics.average_precisions`, ties in gallery order)."""
    rel = (q_labels[:, None] == g_labels[None, :]).numpy()
    excl = None
    if self_ids is not None:
        excl = np.zeros(rel.shape, dtype=bool)
        excl[np.arange(rel.shape[0]), np.asarray(self_ids)] = True
    return torch.from_numpy(core_aps(scores.double().numpy(), rel, exclude=excl))


def _map_of(queries: np.ndarray, gallery: np.ndarray, labels: np.ndarray, qids: np.ndarray,
            chunk: int = 256) -> float:
    g = torch.as_tensor(gallery)
    gl = torch.as_tensor(labels)
    aps = []
    for s in range(0, len(qids), chunk):
        ids = torch.as_tensor(qids[s:s + chunk])
        sc = torch.as_tensor(queries[s:s + chunk]) @ g.T
        aps.append(average_precisions(sc, gl[ids], gl, ids))
    aps = torch.cat(aps)
    return float(aps.nanmean()) if (~aps.isnan()).any() else 0.0  # queries without relevant items skipped


def _expand(method: str, q: np.ndarray, nb: np.ndarray, sims: np.ndarray, model, alpha: float) -> np.ndarray:
    if method == "lattqe":
        return expand_numpy(model, q, nb)[0]
    return expand_batch(method, q, nb, sims, alpha)


def qe_map(method: str, embeddings: np.ndarray, labels: np.ndarray, nqe: int, qids: np.ndarray,
           gallery: Optional[np.ndarray] = None, model=None, alpha: float = DEFAULT_ALPHA) -> float:
    """Leave-one-out mAP: query ``embeddings[qids]``, first search in ``gallery`` (default: the
    embeddings), expansion from the top ``nqe`` (own item excluded), second search; ``method`` may
    be "none"."""
    g = embeddings if gallery is None else gallery
    q = embeddings[qids]
    if method != "none" and nqe > 0:
        sims, ids = knn(q, g, nqe, self_ids=qids)
        q = _expand(method, q, g[ids], sims, model, alpha)
    return _map_of(q, g, labels, qids)


def evaluate_expanders(embeddings: np.ndarray, labels: Sequence, model: Optional[LAttQEModel] = None,
                       nqe_list: Iterable[int] = NQE_LIST, n_queries: int = 1000, alpha: float = DEFAULT_ALPHA,
                       dba: bool = True, seed: int = 0, progress: bool = True) -> Dict:
    """mAP (0..1) on a labelled set (pass held-out classes only) for every expander and nQE.

    Each of ``n_queries`` random items queries the rest of the set (leave-one-out, relevant =
    same label). Returns {"none": mAP, "curves": {method: {nqe: mAP}}, ...}; DBA variants use
    k = nQE for the database side, alone and followed by the matching QE.
    """
    x = l2n(np.asarray(embeddings, dtype=np.float32))
    y = encode_labels(labels)
    if len(x) != len(y):
        raise InputError(f"{len(x)} embeddings but {len(y)} labels")
    rng = np.random.default_rng(seed)
    qids = np.sort(rng.permutation(len(x))[: min(n_queries, len(x))])
    nqe_list = [int(n) for n in nqe_list if 0 < int(n) < len(x)]
    methods = [m for m in QE_METHODS if m != "lattqe" or model is not None]
    if model is not None:
        model.eval()
    out = {"n_items": int(len(x)), "n_classes": int(len(np.unique(y))), "n_queries": int(len(qids)),
           "alpha": alpha, "nqe": nqe_list, "none": _map_of(x[qids], x, y, qids), "curves": {}}
    curves: Dict[str, Dict[int, float]] = {m: {} for m in methods}
    dba_methods = [m for m in DBA_NAMES if m in methods] if dba else []
    for m in dba_methods:
        curves[DBA_NAMES[m]] = {}
        curves[f"{DBA_NAMES[m]}+{m}"] = {}
    for n in tqdm(nqe_list, desc="evaluate expanders (nQE)", disable=not progress):
        for m in methods:
            curves[m][n] = qe_map(m, x, y, n, qids, model=model, alpha=alpha)
        for m in dba_methods:
            g = dba_vectors(x, m, n, alpha=alpha, model=model, progress=False)
            curves[DBA_NAMES[m]][n] = qe_map("none", x, y, n, qids, gallery=g)
            curves[f"{DBA_NAMES[m]}+{m}"][n] = qe_map(m, x, y, n, qids, gallery=g, model=model, alpha=alpha)
    out["curves"] = curves
    return out


def plot_curves(result: Dict, path, title: str = "mAP vs nQE (held-out classes)") -> Path:
    """Write the mAP-vs-nQE PNG of an :func:`evaluate_expanders` result."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    xs = result["nqe"]
    ax.axhline(result["none"], color="k", ls=":", label=expand_label("none"))
    for m, curve in result["curves"].items():
        ks = sorted(int(k) for k in curve)
        style = "--" if "dba" in m else "-"
        ax.plot(ks, [curve[k] if k in curve else curve[str(k)] for k in ks], style, marker="o", ms=3,
                label=expand_label(m))
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(k) for k in xs])
    ax.set_xlabel("nQE (neighbours used)")
    ax.set_ylabel("mAP")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return _save_figure(fig, path)


def _save_figure(fig, path: Path) -> Path:
    """Write a matplotlib figure atomically (temporary file, then rename) and close it."""
    return atomic_save_figure(fig, path)


def format_table(res: Dict, at: Sequence[int] = (8, 64)) -> str:
    """Markdown table: mAP of each method at a few nQE values."""
    ks = [k for k in at if k in res["nqe"] or str(k) in map(str, res["nqe"])]
    lines = ["| method | " + " | ".join(f"nQE={k}" for k in ks) + " |", "|---" * (len(ks) + 1) + "|"]
    lines.append("| " + expand_label("none") + " | " + " | ".join(f"{res['none']:.4f}" for _ in ks) + " |")
    for m, c in res["curves"].items():
        vals = [c.get(k, c.get(str(k))) for k in ks]
        lines.append(f"| {expand_label(m)} | " + " | ".join(f"{v:.4f}" for v in vals) + " |")
    return "\n".join(lines)



# ============================================================================ benchmark
def bench_expanders(dim: int = 512, k: int = 64, n_gallery: int = 10000, n_queries: int = 100,
                    batch: int = 256, model: Optional[LAttQEModel] = None, seed: int = 0,
                    end_to_end_ms: Optional[float] = None) -> Dict[str, Dict[str, float]]:
    """Added latency per query of each expander (expansion + second exact search over a
    ``n_gallery`` x ``dim`` gallery) and batched throughput (queries/s of the expansion alone).

    LAttQE uses ``model`` if given (its width must be ``dim``), else a random model of the
    default architecture (same cost). With ``end_to_end_ms`` (the measured time of a whole query
    without expansion) each entry also gets ``share`` = added / (end_to_end + added).
    """
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    gallery = l2n(rng.standard_normal((n_gallery, dim)).astype(np.float32))
    queries = l2n(rng.standard_normal((n_queries, dim)).astype(np.float32))
    if model is None:
        model = LAttQEModel(LAttQEConfig(dim=dim))
    if model.config.dim != dim:
        raise InputError(f"the LAttQE model is {model.config.dim}-d, the benchmark {dim}-d")
    model.eval()
    sims, ids = knn(queries, gallery, k)
    g = torch.as_tensor(gallery)

    def search(v):
        return torch.topk(torch.as_tensor(v[None]) @ g.T, k, dim=1)

    expanders = {m: EXPANDERS.get(m)() for m in ("aqe", "aqewd", "alpha-qe")}
    expanders["lattqe"] = LAttQEExpander(model)
    out: Dict[str, Dict[str, float]] = {}
    t0 = time.perf_counter()
    for i in range(n_queries):
        search(queries[i])
    search_ms = 1000 * (time.perf_counter() - t0) / n_queries
    for name, ex in expanders.items():
        ex.expand(queries[0], gallery[ids[0]], sims[0])  # warm-up
        t0 = time.perf_counter()
        for i in range(n_queries):
            ex.expand(queries[i], gallery[ids[i]], sims[i])
        expand_ms = 1000 * (time.perf_counter() - t0) / n_queries
        nb = gallery[ids]
        t0 = time.perf_counter()
        if name == "lattqe":
            expand_numpy(model, queries, nb, batch=batch)
        else:
            expand_batch(name, queries, nb, sims)
        qps = n_queries / max(time.perf_counter() - t0, 1e-9)
        rec = {"expand_ms": expand_ms, "second_search_ms": search_ms, "added_ms": expand_ms + search_ms,
               "batched_qps": qps}
        if end_to_end_ms:
            rec["share"] = rec["added_ms"] / (end_to_end_ms + rec["added_ms"])
        out[name] = rec
    return out
