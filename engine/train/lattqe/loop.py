"""The LAttQE training loop (:func:`train_lattqe`), the epoch choice on validation and the query-side weight
floor chosen on validation (:func:`choose_floor`, optionally under the CIR guard :func:`cir_guard`)."""
from __future__ import annotations

import copy
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from tqdm.auto import tqdm

from ...errors import InputError
from ...eval.expanders import encode_labels, qe_map
from ...expand.base import l2n
from ...expand.dba import dba_vectors, knn
from ...expand.lattqe import LAttQEConfig, LAttQEExpander, LAttQEModel
from ..budget import another_epoch_fits
from .model import Sampler, TrainConfig, contrastive_loss, ranking_loss, weight_loss
from ...eval.cir import cir_composers, cir_tensors, compose_queries, rank_queries, recall


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


def _new_model(cfg: TrainConfig, tx: np.ndarray) -> LAttQEModel:
    model = LAttQEModel(LAttQEConfig(
        dim=tx.shape[1], layers=cfg.layers, heads=cfg.heads, ff_dim=cfg.ff_dim, dropout=cfg.dropout,
        positional=cfg.positional, trained_max_k=cfg.k_max,
        max_positions=max(129, cfg.k_max + 1), weight_floor=0.0 if cfg.keep_query else None,
    ))
    if cfg.center_inputs:
        model.center.copy_(torch.as_tensor(tx.mean(0)))
    return model


def _step(model: LAttQEModel, sampler: Sampler, cfg: TrainConfig, rng, opt, bce) -> np.ndarray:
    """One optimiser step on a batch of training queries; [total, contrastive, bce, weight, rank] losses."""
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
    return np.array([loss.item(), l_c.item(), l_b.item(), l_w.item(), l_r.item()])


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
        model = _new_model(cfg, tx)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=cfg.gamma)
    sampler = Sampler(tx, ty, cfg, rng)
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
            sums += _step(model, sampler, cfg, rng, opt, bce)
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


@torch.no_grad()
def cir_guard(model: LAttQEModel, backbone, max_drop: float, grid: Sequence[float] = FLOOR_GRID,
              nqe: int = 8, split: str = "val", *, settings) -> Dict:
    """The query-side floors under which composed retrieval on the offline CIR ``split`` (every composer
    with a checkpoint for ``backbone``, as `eval offline` ranks) loses at most ``max_drop`` points of R@10
    to no expansion. Returns {"allowed": [...], "r10_by_floor": {floor: {composer: [none, lattqe]}}}.
    ``settings``: the trainer's (its command's main builds it), for the composers' checkpoints."""
    queries, gallery, gemb, pos = cir_tensors(backbone, split)
    ref = torch.from_numpy(gemb[[pos[q["reference"]] for q in queries]])
    qv = compose_queries(backbone, cir_composers(backbone, settings)[0], queries, ref)
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
