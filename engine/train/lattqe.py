"""Train LAttQE (``python -m engine train lattqe``), evaluate every expander, benchmark them.

Training follows the issue / paper recipe on labelled gallery embeddings:

* classes are split so that validation classes never occur in training;
* each training query is expanded by the model from its top-k neighbours in the training set,
  k drawn from U{32..64} per batch and each neighbour dropped with a probability p ~ U(0, 0.6)
  drawn per query (kept neighbours stay in rank order);
* loss: contrastive ``y z^2 + (1-y) max(0, m - z)^2`` with ``z = ||q^ - d||``, margin 0.1, one
  positive (random same-class item) and 5 hard negatives per positive (the other-class items
  of a random pool, refreshed every epoch, closest to the current expanded query); plus a pairwise
  ranking term (64 same-class items against the 50 closest other-class pool items, softplus of the
  similarity gaps) and the Brier score of the neighbour weights against relevance (the auxiliary BCE
  of the relevance head is off by default; ``--weight-loss 0 --rank-loss 0 --bce-weight 1`` is the
  earlier recipe);
* Adam (lr 1e-4, weight decay 1e-6), exponential decay 0.99 per epoch, batch 64; the epoch
  with the best validation mAP (LAttQE at nQE = 64 on the held-out classes) is kept.

:func:`evaluate_expanders` measures mAP on held-out classes for no QE, AQE, AQEwD, alpha-QE,
LAttQE and the DBA variants as a function of nQE; :func:`bench_expanders` gives the added latency
per query and the batched throughput of each expander.
"""
from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from tqdm.auto import tqdm

from ..errors import InputError
from ..expand.base import l2n
from ..expand.baselines import DEFAULT_ALPHA, expand_batch
from .budget import another_epoch_fits
from ..expand.dba import dba_vectors, knn
from ..expand.lattqe import LAttQEConfig, LAttQEModel, expand_numpy, save_lattqe
from ..labels import expand_label

NQE_LIST = (1, 2, 4, 8, 16, 32, 64, 128)
QE_METHODS = ("aqe", "aqewd", "alpha-qe", "lattqe")
DBA_NAMES = {"aqe": "adba", "alpha-qe": "alpha-dba", "lattqe": "lattdba"}


# ============================================================================ data helpers
def split_classes(labels: Sequence, val_frac: float = 0.3, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Boolean masks (train, val) over items such that no class is in both (at least 1 class each)."""
    labels = np.asarray(labels)
    classes = np.unique(labels)
    if len(classes) < 2:
        raise InputError(f"need at least 2 classes to split train/validation, got {len(classes)}")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(classes)
    n_val = int(min(max(1, round(val_frac * len(classes))), len(classes) - 1))
    val_classes = perm[:n_val]
    val = np.isin(labels, val_classes)
    return ~val, val


def encode_labels(labels: Sequence) -> np.ndarray:
    """Any labels -> int64 codes 0..C-1."""
    _, codes = np.unique(np.asarray(labels), return_inverse=True)
    return codes.astype(np.int64)


def fashion_mnist_pca(dim: int = 64, per_class: int = 1000, val_classes: Sequence[int] = (7, 8, 9),
                      seed: int = 0) -> Tuple[np.ndarray, np.ndarray, str]:
    """Stand-in embeddings: Fashion-MNIST training pixels projected by PCA fit on the training
    classes only (``val_classes`` are held out). Files come from :mod:`engine.data.fashion_mnist`.

    Returns (embeddings (N, dim) L2-normalised, labels (N,), pseudo fingerprint).
    """
    from ..data import fashion_mnist

    images, y = fashion_mnist.load("train")
    rng = np.random.default_rng(seed)
    keep = np.sort(np.concatenate([rng.permutation(np.flatnonzero(y == c))[:per_class] for c in np.unique(y)]))
    x, y = images[keep].reshape(len(keep), -1).astype(np.float32) / 255.0, y[keep]
    fit = x[~np.isin(y, val_classes)]
    mean = fit.mean(0)
    _, _, vt = np.linalg.svd(fit - mean, full_matrices=False)
    emb = l2n((x - mean) @ vt[:dim].T)
    return emb.astype(np.float32), y, f"fashion-mnist-pixels-pca{dim}"


HELD_OUT_FILES = {"train": ("train",), "val": ("val",), "test": ("query", "db")}


def labelled_features(parts: Sequence[str], backbone_name: str = "packaged", device: str = "auto",
                      splits: Sequence[str] = ("train", "val", "test"), max_per_class: int = 0, seed: int = 0,
                      ) -> Tuple[Dict[str, Tuple[np.ndarray, np.ndarray]], str]:
    """Embed the offline ``labelled`` set (parts e.g. emoji, photos, fmnist_small) with a backbone.

    Returns ({split: (embeddings, labels "part:label")}, backbone fingerprint). Splits are class
    disjoint; "test" is the held-out query + db files (parts without test classes are skipped there).
    ``max_per_class`` > 0 keeps at most that many random images per class and split.
    """
    import random

    from ..backbones import create_backbone
    from ..data.features import embed_paths
    from ..data.builders import ensure_built
    from ..data.formats import image_path, load_split

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


# ============================================================================ metrics
def average_precisions(scores: torch.Tensor, q_labels: torch.Tensor, g_labels: torch.Tensor,
                       self_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
    """AP per query over the full ranking of the gallery (relevant = same label), the query's own item
    excluded; NaN for a query without any relevant item. Computed by the evaluation core
    (:func:`engine.eval.metrics.average_precisions`, ties in gallery order)."""
    from ..eval.metrics import average_precisions as core_aps

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
    import matplotlib.pyplot as plt

    from ..fileio import atomic_path

    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)
    return path


def plot_history(history: List[Dict], path) -> Path:
    """Training curves: loss per epoch and validation mAP per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ep = [h["epoch"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
    a.plot(ep, [h["loss"] for h in history], label="total")
    a.plot(ep, [h["contrastive"] for h in history], label="contrastive")
    a.plot(ep, [h["bce"] for h in history], label="aux BCE")
    a.set_xlabel("epoch")
    a.set_ylabel("training loss")
    a.set_yscale("log")
    a.legend(fontsize=8)
    b.plot(ep, [h["val_map"] for h in history], marker="o", ms=3, label="LAttQE")
    if history and "val_map_none" in history[0]:
        b.axhline(history[0]["val_map_none"], color="k", ls=":", label=expand_label("none"))
    if history and "val_map_aqe" in history[0]:
        b.axhline(history[0]["val_map_aqe"], color="gray", ls="--", label="AQE")
    b.set_xlabel("epoch")
    b.set_ylabel("validation mAP (nQE=64)")
    b.legend(fontsize=8)
    for ax in (a, b):
        ax.grid(alpha=0.3)
    return _save_figure(fig, path)


# ============================================================================ training
@dataclass
class TrainConfig:
    epochs: int = 40
    queries_per_epoch: int = 2048
    batch: int = 64
    lr: float = 1e-4
    weight_decay: float = 1e-6
    gamma: float = 0.99
    margin: float = 0.1
    positives: int = 1
    negatives: int = 5  # per positive
    pool_size: int = 2000
    k_min: int = 32
    k_max: int = 64
    drop_max: float = 0.6
    bce_weight: float = 0.0  # auxiliary BCE of the relevance head (off: the weights are supervised directly)
    weight_loss: float = 3.0  # Brier score of the neighbour weights against relevance (same class)
    rank_loss: float = 1.0  # pairwise ranking of the training set by the expanded query
    rank_positives: int = 64  # same-class items drawn per query (with replacement)
    rank_negatives: int = 50  # hardest other-class pool items per query
    rank_temperature: float = 0.05
    val_nqe: int = 64
    val_queries: int = 500
    seed: int = 0
    # architecture
    layers: int = 3
    heads: int = 8
    ff_dim: int = 0
    dropout: float = 0.1
    positional: bool = True
    center_inputs: bool = True  # encoder input = normalise(x - mean of the training embeddings)
    keep_query: bool = True  # non-negative weights in training, weight floor chosen on validation


def contrastive_loss(z: torch.Tensor, y: torch.Tensor, margin: float) -> torch.Tensor:
    """Mean of y z^2 + (1 - y) max(0, margin - z)^2."""
    return (y * z.pow(2) + (1 - y) * torch.clamp(margin - z, min=0).pow(2)).mean()


def ranking_loss(s_pos: torch.Tensor, s_neg: torch.Tensor, temperature: float,
                 pos_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Mean over every (positive, negative) pair of a query of softplus((s_neg - s_pos) / T): a smooth count
    of negatives ranked above positives (1 - AUC) for similarities s_pos (B, P) and s_neg (B, H).
    ``pos_mask`` (B, P): only these positives count, each query's pairs averaged, then the queries."""
    pairs = torch.nn.functional.softplus((s_neg[:, None, :] - s_pos[:, :, None]) / temperature).mean(2)
    if pos_mask is None:
        return pairs.mean()
    m = pos_mask.to(pairs.dtype)
    return ((pairs * m).sum(1) / m.sum(1).clamp(min=1)).mean()


def weight_loss(w: torch.Tensor, rel: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Brier score of the neighbour weights (B, k) against relevance (1 = same class) over present neighbours:
    its minimiser is the probability that the neighbour is relevant."""
    m = mask.to(w.dtype)
    return ((w - rel).pow(2) * m).sum() / m.sum().clamp(min=1)


class _Sampler:
    """Training tuples from a labelled training set with precomputed neighbour lists."""

    def __init__(self, x: np.ndarray, y: np.ndarray, cfg: TrainConfig, rng: np.random.Generator):
        self.x = torch.as_tensor(x)
        self.y = torch.as_tensor(y)
        self.cfg = cfg
        self.rng = rng
        kmax = min(cfg.k_max, len(x) - 1)
        self.nbr = torch.as_tensor(knn(x, x, kmax, self_ids=np.arange(len(x)))[1])
        self.by_class = {int(c): np.flatnonzero(y == c) for c in np.unique(y)}
        usable = [c for c, ids in self.by_class.items() if len(ids) >= 2]
        self.queries = np.flatnonzero(np.isin(y, usable))
        if len(self.queries) == 0:
            raise InputError("no training class has 2 or more items; cannot form positives")
        self.refresh_pool()

    def refresh_pool(self) -> None:
        n = min(self.cfg.pool_size, len(self.x))
        self.pool = torch.as_tensor(self.rng.choice(len(self.x), n, replace=False))

    def neighbours(self, qids: np.ndarray) -> Tuple[torch.Tensor, torch.Tensor]:
        """Augmented neighbour ids (B, k) and presence mask (B, k), kept ones first in rank order."""
        cfg = self.cfg
        kmax = self.nbr.shape[1]
        k = int(self.rng.integers(min(cfg.k_min, kmax), kmax + 1))
        ids = self.nbr[torch.as_tensor(qids), :k]
        p = torch.as_tensor(self.rng.uniform(0.0, cfg.drop_max, size=(len(qids), 1)), dtype=torch.float32)
        keep = torch.as_tensor(self.rng.random((len(qids), k)), dtype=torch.float32) >= p
        order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
        return torch.gather(ids, 1, order), torch.gather(keep, 1, order)

    def positives(self, qids: np.ndarray) -> torch.Tensor:
        out = np.empty((len(qids), self.cfg.positives), np.int64)
        for r, q in enumerate(qids):
            same = self.by_class[int(self.y[q])]
            for j in range(self.cfg.positives):
                p = q
                while p == q:
                    p = same[self.rng.integers(len(same))]
                out[r, j] = p
        return torch.as_tensor(out)

    def hard_negatives(self, qhat: torch.Tensor, qids: np.ndarray, n: Optional[int] = None) -> torch.Tensor:
        """(B, n) pool items of other classes closest to the expanded queries (default n: positives * negatives)."""
        pool = self.pool
        with torch.no_grad():
            sims = qhat @ self.x[pool].T
            same = self.y[torch.as_tensor(qids)][:, None] == self.y[pool][None, :]
            sims[same] = -float("inf")
            n = min(n or self.cfg.positives * self.cfg.negatives, len(pool))
            top = torch.topk(sims, n, dim=1).indices
        return pool[top]

    def rank_positives(self, qids: np.ndarray) -> torch.Tensor:
        """(B, rank_positives) random other items of each query's class, drawn with replacement."""
        qt = torch.as_tensor(qids)
        same = (self.y[qt][:, None] == self.y[None, :]).float()
        same[torch.arange(len(qt)), qt] = 0.0
        return torch.multinomial(same, self.cfg.rank_positives, replacement=True)


@torch.no_grad()
def fixed_loss(model: LAttQEModel, x: np.ndarray, y: Sequence, k: int, cfg: Optional[TrainConfig] = None,
               n_queries: int = 256, seed: int = 0) -> Dict[str, float]:
    """The training objective on a fixed, augmentation-free tuple set (for before/after checks).

    ``n_queries`` items of (x, y) query the rest with their top-k neighbours (none dropped); the
    positive term averages z^2 over ALL same-class items, the negatives are the 5 other-class
    items closest to the expanded query; the ranking term pairs ALL same-class items with the
    ``rank_negatives`` other-class items closest to the expanded query; weight Brier score and BCE as in training.
    """
    cfg = cfg or TrainConfig()
    x = torch.as_tensor(l2n(np.asarray(x, np.float32)))
    y = torch.as_tensor(encode_labels(y))
    qids = np.sort(np.random.default_rng(seed).permutation(len(x))[:n_queries])
    _, nb = knn(x[qids].numpy(), x.numpy(), k, self_ids=qids)
    nb = torch.as_tensor(nb)
    qt = torch.as_tensor(qids)
    model.eval()
    qhat, w, logits = model.expand(x[qt], x[nb])
    z = torch.cdist(qhat, x)  # (Q, N)
    same = y[qt][:, None] == y[None, :]
    same[torch.arange(len(qt)), qt] = False
    pos = (z.pow(2) * same).sum(1) / same.sum(1).clamp(min=1)
    zn = torch.topk(z.masked_fill(same, float("inf")).masked_fill(
        torch.nn.functional.one_hot(qt, len(x)).bool(), float("inf")), cfg.negatives, largest=False).values
    neg = torch.clamp(cfg.margin - zn, min=0).pow(2).sum(1)
    contrastive = float(((pos + neg) / (1 + cfg.negatives)).mean())
    rel = (y[nb] == y[qt][:, None]).float()
    bce = float(torch.nn.functional.binary_cross_entropy_with_logits(logits, rel))
    brier = float(weight_loss(w, rel, torch.ones_like(rel)))
    s = qhat @ x.T
    other = y[qt][:, None] != y[None, :]
    s_neg = torch.topk(s.masked_fill(~other, -float("inf")), min(cfg.rank_negatives, int(other.sum(1).min())),
                       dim=1).values
    rank = float(ranking_loss(s, s_neg, cfg.rank_temperature, same))
    return {"contrastive": contrastive, "bce": bce, "weight": brier, "rank": rank,
            "loss": contrastive + cfg.bce_weight * bce + cfg.weight_loss * brier + cfg.rank_loss * rank}


def validation_queries(n_val: int, cfg: TrainConfig) -> np.ndarray:
    """Ids of the validation items used as queries to pick the epoch (fixed by ``cfg.seed``)."""
    rng = np.random.default_rng(cfg.seed + 1)
    return np.sort(rng.permutation(n_val)[: min(cfg.val_queries, n_val)])


def train_lattqe(train_x: np.ndarray, train_y: Sequence, val_x: np.ndarray, val_y: Sequence,
                 cfg: Optional[TrainConfig] = None, progress: bool = True,
                 model: Optional[LAttQEModel] = None, keep: str = "best") -> Tuple[LAttQEModel, List[Dict]]:
    """Train on (train_x, train_y), pick the epoch by validation mAP on (val_x, val_y).

    ``model`` (optional) is trained in place instead of a fresh one built from ``cfg``;
    ``keep="last"`` returns the last epoch's weights instead of the best validation epoch's.
    Returns (best model in eval mode, per-epoch history dicts).
    """
    cfg = cfg or TrainConfig()
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    tx = l2n(np.asarray(train_x, np.float32))
    ty = encode_labels(train_y)
    vx = l2n(np.asarray(val_x, np.float32))
    vy = encode_labels(val_y)
    if tx.ndim != 2 or len(tx) < 3 or len(vx) < 3:
        raise InputError("training needs at least 3 training and 3 validation embeddings")
    dim = tx.shape[1]
    if model is not None and model.config.dim != dim:
        raise InputError(f"the initial LAttQE model is {model.config.dim}-d, the data {dim}-d")
    if model is None:
        model = LAttQEModel(LAttQEConfig(
            dim=dim, layers=cfg.layers, heads=cfg.heads, ff_dim=cfg.ff_dim, dropout=cfg.dropout,
            positional=cfg.positional, trained_max_k=cfg.k_max,
            max_positions=max(129, cfg.k_max + 1), weight_floor=0.0 if cfg.keep_query else None,
        ))
        if cfg.center_inputs:
            model.center.copy_(torch.as_tensor(tx.mean(0)))
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=cfg.gamma)
    sampler = _Sampler(tx, ty, cfg, rng)
    val_qids = validation_queries(len(vx), cfg)
    val_nqe = min(cfg.val_nqe, len(vx) - 1)
    ref = {"val_map_none": qe_map("none", vx, vy, val_nqe, val_qids),
           "val_map_aqe": qe_map("aqe", vx, vy, val_nqe, val_qids)}
    history: List[Dict] = []
    best_map, best_state = -1.0, None
    steps = max(1, cfg.queries_per_epoch // cfg.batch)
    bce = torch.nn.BCEWithLogitsLoss(reduction="none")
    bar = tqdm(range(1, cfg.epochs + 1), desc="train LAttQE", disable=not progress)
    for epoch in bar:
        t_epoch = time.perf_counter()
        model.train()
        sampler.refresh_pool()
        sums = np.zeros(5)
        for _ in range(steps):
            qids = rng.choice(sampler.queries, size=min(cfg.batch, len(sampler.queries)), replace=False)
            nb_ids, mask = sampler.neighbours(qids)
            q = sampler.x[torch.as_tensor(qids)]
            qhat, w, logits = model.expand(q, sampler.x[nb_ids], mask)
            pos = sampler.positives(qids)
            neg = sampler.hard_negatives(qhat.detach(), qids)
            z_pos = (qhat[:, None, :] - sampler.x[pos]).norm(dim=-1)
            z_neg = (qhat[:, None, :] - sampler.x[neg]).norm(dim=-1)
            z = torch.cat([z_pos, z_neg], 1)
            yv = torch.cat([torch.ones_like(z_pos), torch.zeros_like(z_neg)], 1)
            l_c = contrastive_loss(z, yv, cfg.margin)
            rel = (sampler.y[nb_ids] == sampler.y[torch.as_tensor(qids)][:, None]).float()
            m = mask.float()
            l_b = (bce(logits, rel) * m).sum() / m.sum().clamp(min=1)
            l_w = weight_loss(w, rel, mask)
            loss = l_c + cfg.bce_weight * l_b + cfg.weight_loss * l_w
            l_r = torch.zeros(())
            if cfg.rank_loss:
                rp = sampler.rank_positives(qids)
                rn = sampler.hard_negatives(qhat.detach(), qids, cfg.rank_negatives)
                l_r = ranking_loss(torch.einsum("bd,bpd->bp", qhat, sampler.x[rp]),
                                   torch.einsum("bd,bnd->bn", qhat, sampler.x[rn]), cfg.rank_temperature)
                loss = loss + cfg.rank_loss * l_r
            opt.zero_grad()
            loss.backward()
            opt.step()
            sums += [loss.item(), l_c.item(), l_b.item(), l_w.item(), l_r.item()]
        sched.step()
        model.eval()
        vmap = qe_map("lattqe", vx, vy, val_nqe, val_qids, model=model)
        rec = {"epoch": epoch, "loss": sums[0] / steps, "contrastive": sums[1] / steps, "bce": sums[2] / steps,
               "weight": sums[3] / steps, "rank": sums[4] / steps,
               "val_map": vmap, "lr": opt.param_groups[0]["lr"], **ref}
        history.append(rec)
        if vmap > best_map:
            best_map, best_state = vmap, copy.deepcopy(model.state_dict())
        bar.set_postfix(loss=f"{rec['loss']:.4f}", val_map=f"{vmap:.4f}", best=f"{best_map:.4f}")
        if not another_epoch_fits(time.perf_counter() - t_epoch):
            break  # the time limit of `prepare`
    if keep == "best" and best_state is not None:
        model.load_state_dict(best_state)
    return model.eval(), history


FLOOR_GRID = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


@torch.no_grad()
def choose_floor(model: LAttQEModel, val_x: np.ndarray, val_y: Sequence, cfg: Optional[TrainConfig] = None,
                 nqes: Sequence[int] = (8, 64), grid: Sequence[float] = FLOOR_GRID,
                 allowed: Optional[Sequence[float]] = None) -> Dict:
    """Sets ``model.config.weight_floor`` to the grid value with the largest mean validation mAP over
    ``nqes`` (ties: the larger floor, i.e. the more conservative one; 1.0 keeps the query, so the result
    is never below no expansion on validation). ``allowed``: the query-side floors that may be chosen
    (e.g. those passing :func:`cir_guard`). Returns the per-floor figures."""
    cfg = cfg or TrainConfig()
    vx, vy = l2n(np.asarray(val_x, np.float32)), encode_labels(val_y)
    qids = validation_queries(len(vx), cfg)
    ks = [min(k, len(vx) - 1) for k in nqes]
    none = qe_map("none", vx, vy, ks[0], qids)

    def by_floor(map_at, allowed=None):  # {floor: [mAP at each k]} and the allowed floor with the best mean
        table = {}                         # (ties: the larger; 1.0 when none is allowed)
        for f in grid:
            model.config.weight_floor, model.config.dba_weight_floor = float(f), None
            table[float(f)] = [map_at(k) for k in ks]
        ok = [f for f in table if allowed is None or any(abs(f - a) < 1e-9 for a in allowed)] or [1.0]
        return table, max(ok, key=lambda f: (round(float(np.mean(table[f])), 6), f))

    table, best = by_floor(lambda k: qe_map("lattqe", vx, vy, k, qids, model=model), allowed)
    # the gallery side (LAttDBA) gets its own floor, chosen the same way
    dba, best_dba = by_floor(lambda k: qe_map("none", vx, vy, k, qids, gallery=dba_vectors(
        vx, "lattqe", k, model=model, progress=False)))
    model.config.weight_floor, model.config.dba_weight_floor = best, best_dba
    k_val = min(cfg.val_nqe, len(vx) - 1)  # the shipped model's validation figure, at the epochs' nQE
    return {"weight_floor": best, "dba_weight_floor": best_dba, "nqe": list(ks), "val_map_none": none,
            "val_map": table[best][ks.index(k_val)] if k_val in ks else table[best][-1],
            "val_map_by_floor": {str(f): v for f, v in table.items()},
            "val_dba_map_by_floor": {str(f): v for f, v in dba.items()}}


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
    from ..expand import EXPANDERS
    from ..expand.lattqe import LAttQEExpander

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


# ============================================================================ CLI
def _load_features(path: Path) -> Tuple[Dict[str, Tuple[np.ndarray, np.ndarray]], str]:
    """An .npz with either 'embeddings' + 'labels' (one set, split by class here) or per-split
    '<split>_embeddings' + '<split>_labels' (as written by --save-features), plus 'fingerprint'."""
    try:
        with np.load(path, allow_pickle=False) as f:
            fp = str(f["fingerprint"]) if "fingerprint" in f.files else ""
            if "embeddings" in f.files:
                out = {"all": (f["embeddings"].astype(np.float32), f["labels"])}
            else:
                out = {s: (f[f"{s}_embeddings"].astype(np.float32), f[f"{s}_labels"])
                       for s in ("train", "val", "test") if f"{s}_embeddings" in f.files}
    except (OSError, KeyError, ValueError) as exc:
        raise InputError(f"{path.name}: expected an .npz with arrays 'embeddings', 'labels' "
                         f"(or train_/val_/test_ prefixed ones) and 'fingerprint' ({exc})") from exc
    if not out or ("all" not in out and not {"train", "val"} <= set(out)):
        raise InputError(f"{path.name}: no embeddings/labels (or train_ and val_ arrays) found")
    for name, (x, y) in out.items():
        if x.ndim != 2 or len(x) != len(y):
            raise InputError(f"{path.name}: {name} embeddings {x.shape} and labels {y.shape} do not match")
    return out, fp


def _class_list(text: str, option: str) -> List[int]:
    try:
        out = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        out = []
    if not out or not all(0 <= c <= 9 for c in out):
        raise InputError(f"{option} takes Fashion-MNIST class numbers 0 to 9 separated by commas, got {text!r}")
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine train lattqe", description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--features", type=Path, help=".npz with 'embeddings' (N,D), 'labels' (N,), 'fingerprint'")
    src.add_argument("--labelled", metavar="PARTS",
                     help="offline labelled set parts, comma separated (e.g. emoji,photos,fmnist_small), "
                          "embedded with --backbone; trains on 'train', picks the epoch on 'val', "
                          "reports on the held-out test classes")
    src.add_argument("--fashion-mnist", action="store_true",
                     help="stand-in: Fashion-MNIST pixels projected by PCA (see --pca; CIS_FASHION_MNIST_DIR)")
    p.add_argument("--backbone", default="packaged", help="backbone for --labelled (create_backbone name)")
    p.add_argument("--device", default="auto")
    p.add_argument("--max-per-class", type=int, default=0, help="--labelled: at most N images per class and split")
    p.add_argument("--save-features", type=Path, default=None, help="also write the embedded --labelled splits (.npz)")
    p.add_argument("--pca", type=int, default=64, help="PCA size for --fashion-mnist")
    p.add_argument("--per-class", type=int, default=1000, help="items per class for --fashion-mnist")
    p.add_argument("--val-classes", default="7,8,9",
                   help="--fashion-mnist: validation classes (held out of training and of the PCA fit)")
    p.add_argument("--classes", default="",
                   help="--fashion-mnist: use only these classes (default all 10); the others are left out of the "
                        "PCA fit too, e.g. --classes 0,1,2,3,4,5,6 --val-classes 5,6 never sees 7, 8, 9")
    p.add_argument("--fingerprint", default="", help="backbone fingerprint (overrides the one in --features)")
    p.add_argument("--val-frac", type=float, default=0.3, help="share of classes held out for validation")
    p.add_argument("--out", type=Path, default=None, help="checkpoint folder (default: CIS_CHECKPOINTS)")
    p.add_argument("--name", default="lattqe", help="checkpoint file stem (lattqe*.safetensors/json)")
    p.add_argument("--report", type=Path, default=None,
                   help="folder for eval JSON + PNG plots (mAP vs nQE on held-out classes, training curves)")
    p.add_argument("--eval-queries", type=int, default=1000)
    p.add_argument("--nqe-list", default=",".join(map(str, NQE_LIST)), help="nQE values of the report's curves")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    p.add_argument("--quiet", action="store_true")
    for f in fields(TrainConfig):
        if f.name in ("positional", "center_inputs", "keep_query"):
            continue
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    p.add_argument("--no-positional", action="store_true", help="ablation: no positional encodings")
    p.add_argument("--no-center", action="store_true", help="ablation: feed raw (uncentred) vectors to the encoder")
    p.add_argument("--refloor", type=Path, default=None, metavar="CHECKPOINT",
                   help="no training: choose the weight floors of this LAttQE checkpoint on the validation "
                        "classes of the data given and write it to --out/--name")
    p.add_argument("--cir-guard", type=float, default=0.0, metavar="POINTS",
                   help="with --refloor: only floors that keep composed R@10 on the offline CIR validation split "
                        "within POINTS of no expansion for every composer (0 = off)")
    p.add_argument("--no-keep-query", action="store_true",
                   help="the paper's raw cosine weights (may be negative), no weight floor chosen on validation")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)
                         if f.name not in ("positional", "center_inputs", "keep_query")},
                      positional=not args.no_positional, center_inputs=not args.no_center,
                      keep_query=not args.no_keep_query)
    test = None
    feats = None
    if args.labelled:
        parts = [p.strip() for p in args.labelled.split(",") if p.strip()]
        feats, fp = labelled_features(parts, args.backbone, args.device, max_per_class=args.max_per_class,
                                      seed=args.seed)
        source = f"labelled {'+'.join(parts)}" + (f" (max {args.max_per_class}/class)" if args.max_per_class else "")
        if args.save_features:
            args.save_features.parent.mkdir(parents=True, exist_ok=True)
            arrays = {f"{k}_{n}": v for k, (xe, ye) in feats.items() for n, v in (("embeddings", xe), ("labels", ye))}
            np.savez(args.save_features, fingerprint=np.array(fp), **arrays)
    elif args.features is not None:
        feats, fp = _load_features(args.features)
        source = args.features.name
        if "all" in feats:
            x, y = feats.pop("all")
            tr, va = split_classes(y, args.val_frac, args.seed)
            feats = {"train": (x[tr], y[tr]), "val": (x[va], y[va])}
    else:
        val_classes = _class_list(args.val_classes, "--val-classes")
        classes = _class_list(args.classes, "--classes") if args.classes.strip() else list(range(10))
        if not set(val_classes) < set(classes):
            raise InputError("--val-classes must be some, not all, of --classes")
        unused = [c for c in range(10) if c not in classes]
        x, y, fp = fashion_mnist_pca(dim=args.pca, per_class=args.per_class, seed=args.seed,
                                     val_classes=sorted(set(val_classes) | set(unused)))
        source = (f"Fashion-MNIST pixels, PCA {args.pca}, {args.per_class}/class, classes "
                  f"{','.join(map(str, classes))}, validation {','.join(map(str, val_classes))}")
        va = np.isin(y, val_classes)  # the PCA was fit without the validation (and unused) classes
        tr = np.isin(y, classes) & ~va
        feats = {"train": (x[tr], y[tr]), "val": (x[va], y[va])}
    if "train" not in feats or "val" not in feats:
        raise InputError("the data gave no train/validation images")
    test = feats.get("test")
    x = np.concatenate([feats["train"][0], feats["val"][0]])
    y = np.concatenate([feats["train"][1], feats["val"][1]])
    tr = np.r_[np.ones(len(feats["train"][0]), bool), np.zeros(len(feats["val"][0]), bool)]
    va = ~tr
    if set(np.unique(y[tr]).tolist()) & set(np.unique(y[va]).tolist()):
        raise InputError("training and validation share classes; the split must be class disjoint")
    fp = args.fingerprint or fp
    if not fp:
        raise InputError("no backbone fingerprint: pass --fingerprint or store one in the .npz")
    print(f"LAttQE: {source}; {tr.sum()} training items ({len(np.unique(y[tr]))} classes), "
          f"{va.sum()} validation items ({len(np.unique(y[va]))} held-out classes), dim {x.shape[1]}")
    t0 = time.time()
    if args.refloor is not None:
        return _refloor(args, cfg, fp, x[va], y[va])
    model, history = train_lattqe(x[tr], y[tr], x[va], y[va], cfg, progress=not args.quiet)
    best = max(history, key=lambda h: h["val_map"])
    floor = choose_floor(model, x[va], y[va], cfg) if cfg.keep_query else None
    from ..config import Settings

    out_dir = args.out or Path(Settings().checkpoints)
    if floor is not None:  # the validation figure of the model as shipped (floor chosen)
        best = {**best, "val_map": floor["val_map"]}
    extra = {"train": asdict(cfg), "data": source, "best_epoch": best["epoch"], "val_map": best["val_map"],
             "floor_selection": floor,
             "val_map_none": best["val_map_none"], "val_map_aqe": best["val_map_aqe"],
             "train_seconds": round(time.time() - t0, 1), "history": history,
             "val_classes": [str(c) for c in np.unique(y[va])],
             "train_classes": [str(c) for c in np.unique(y[tr])]}
    path = save_lattqe(model, out_dir / f"{args.name}.safetensors", fp, extra)
    print(f"best epoch {best['epoch']}: val mAP {best['val_map']:.4f} (no QE {best['val_map_none']:.4f}, "
          f"AQE {best['val_map_aqe']:.4f})" + (f", weight floor {floor['weight_floor']:.1f}" if floor else "")
          + f"; checkpoint {path}")
    if args.report is not None:
        args.report.mkdir(parents=True, exist_ok=True)
        ex, ey, where = (test[0], test[1], "test") if test is not None else (x[va], y[va], "val")
        nqe_list = [int(v) for v in args.nqe_list.split(",") if v.strip()]
        res = evaluate_expanders(ex, ey, model, nqe_list=nqe_list, n_queries=args.eval_queries, seed=args.seed,
                                 progress=not args.quiet)
        res.update(source=source, fingerprint=fp, split=where)
        from ..fileio import atomic_write_text

        atomic_write_text(args.report / f"{args.name}_eval.json", json.dumps(res, indent=1))
        plot_curves(res, args.report / f"{args.name}_map_vs_nqe.png",
                    title=f"mAP vs nQE, held-out {where} classes")
        plot_history(history, args.report / f"{args.name}_training.png")
        print(format_table(res))
    return 0


@torch.no_grad()
def cir_guard(model: LAttQEModel, backbone, max_drop: float, grid: Sequence[float] = FLOOR_GRID,
              nqe: int = 8, split: str = "val") -> Dict:
    """The query-side floors under which composed retrieval on the offline CIR ``split`` (every composer
    with a checkpoint for ``backbone``, as `eval offline` ranks) loses at most ``max_drop`` points of R@10
    to no expansion. Returns {"allowed": [...], "r10_by_floor": {floor: {composer: [none, lattqe]}}}."""
    from ..config import Settings
    from ..eval.offline import cir_composers, cir_tensors, compose_queries, rank_queries, recall
    from ..expand.lattqe import LAttQEExpander

    queries, gallery, gemb, pos = cir_tensors(backbone, split)
    ref = torch.from_numpy(gemb[[pos[q["reference"]] for q in queries]])
    qv = compose_queries(backbone, cir_composers(backbone, Settings())[0], queries, ref)
    expander = LAttQEExpander(model)
    saved = model.config.weight_floor
    out, allowed = {}, []
    for f in grid:
        model.config.weight_floor = float(f)
        row = {}
        for n, v in qv.items():
            r = rank_queries(v, queries, gallery, gemb, pos, {"lattqe": expander}, nqe=nqe)
            row[n] = [recall(r["none"])["R@10"], recall(r["lattqe"])["R@10"]]
        out[str(float(f))] = row
        if all(b >= a - max_drop for a, b in row.values()):
            allowed.append(float(f))
    model.config.weight_floor = saved
    return {"allowed": allowed, "max_drop": max_drop, "split": split, "nqe": nqe, "r10_by_floor": out}


def _refloor(args, cfg: TrainConfig, fp: str, val_x: np.ndarray, val_y: np.ndarray) -> int:
    """``--refloor CHECKPOINT``: the weights stay, the floors are chosen again on the validation classes
    (with ``--cir-guard P``: only among the floors that keep composed retrieval on the CIR validation split
    within P points of R@10 of no expansion for every composer)."""
    from ..config import Settings
    from ..expand.lattqe import load_lattqe

    model, record = load_lattqe(args.refloor, fingerprint=fp)
    guard = None
    if args.cir_guard > 0:
        from ..backbones import create_backbone

        guard = cir_guard(model, create_backbone(args.backbone, "cpu"), args.cir_guard)
        print(f"CIR validation guard ({args.cir_guard:g} points of R@10): floors allowed {guard['allowed']}")
    floor = choose_floor(model, val_x, val_y, cfg, allowed=None if guard is None else guard["allowed"])
    if guard is not None:
        floor["cir_guard"] = guard
    keep = {key: v for key, v in record.items() if key not in ("kind", "fingerprint", "embed_dim", "config",
                                                                "weights", "file")}
    keep.update(floor_selection=floor, val_map=floor["val_map"])
    out_dir = args.out or Path(Settings().checkpoints)
    path = save_lattqe(model, out_dir / f"{args.name}.safetensors", fp, keep)
    print(f"weight floor {floor['weight_floor']:.1f} (query side), {floor['dba_weight_floor']:.1f} (LAttDBA); "
          f"val mAP {keep['val_map']:.4f} (no QE {floor['val_map_none']:.4f}); checkpoint {path}")
    return 0


def format_table(res: Dict, at: Sequence[int] = (8, 64)) -> str:
    """Markdown table: mAP of each method at a few nQE values."""
    ks = [k for k in at if k in res["nqe"] or str(k) in map(str, res["nqe"])]
    lines = ["| method | " + " | ".join(f"nQE={k}" for k in ks) + " |", "|---" * (len(ks) + 1) + "|"]
    lines.append("| " + expand_label("none") + " | " + " | ".join(f"{res['none']:.4f}" for _ in ks) + " |")
    for m, c in res["curves"].items():
        vals = [c.get(k, c.get(str(k))) for k in ks]
        lines.append(f"| {expand_label(m)} | " + " | ".join(f"{v:.4f}" for v in vals) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
