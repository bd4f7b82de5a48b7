"""Text-conditioned LAttQE trained on composed queries (``python -m engine train lattqe --composed``).

The image-only trainer (:mod:`.loop`) learns from labelled images; on composed queries its weight floor, chosen
on validation, keeps the query. Here the training queries are the composed queries themselves:

* data: the offline CIR *train* split without the held-out sources' images (as the composers' trainers read
  it), each query composed by the seed methods (``--methods``, default the weighted sum and RTIC) from its
  reference image and modification text; the text's embedding is the model's second token;
* neighbours: the query's top-k results in its own gallery group of the train split (reference left out, k drawn
  from U{k_min..k_max} per batch); relevance of a neighbour = it is one of the query's targets;
* loss: the Brier score of the neighbour weights against relevance, plus the pairwise ranking term of the
  expanded query (targets against the closest non-targets of the first stage); a share ``text_drop`` of the
  training queries go without their text token so that image-only queries still expand sensibly;
* choice on the offline CIR *val* split (never test), at the page's nQE: the epoch with the best mean recall
  (R@1, R@5, R@10 averaged, then over the methods), then the weight floor of :data:`COMPOSED_FLOOR_GRID` with the
  best mean recall among those that keep every method's R@10 within ``r10_guard`` points of no expansion (ties:
  the larger floor; 1 keeps the query, so it is never below no expansion on validation).

Why not R@10 alone: at the page's nQE (4, at most 2 % of the gallery: 3 or 4 on the CIR val galleries) a query
whose top nQE hold a target already counts for R@10, and one whose top nQE hold none has nothing to average in
that a target-only label calls relevant, so expansion can move R@1 (the target to the top) but hardly R@10.
With the right neighbours' weights given (an oracle), R@10 at the page's nQE stays within 0.3 points while R@1
doubles on the sum (docs/lattqe.md).

:func:`composed_eval` gives the figures the checkpoint's record and docs/lattqe.md carry: R@10 with and without
the expander per method, and how many validation queries' top 10 it changes.
"""
from __future__ import annotations

import copy
import re
import time
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from tqdm.auto import tqdm

from ...checkpoints import search_path
from ...compose import COMPOSERS, ComposerUnavailable
from ...data.heldout import held_out_cir_images, keep_row
from ...defaults import engine_defaults
from ...errors import InputError
from ...eval.cir import cir_tensors, compose_queries, query_texts
from ...expand.base import l2n
from ...expand.lattqe import LAttQEConfig, LAttQEModel, expand_numpy
from ..budget import another_epoch_fits
from .loop import FLOOR_GRID
from .model import ranking_loss, weight_loss


@dataclass
class ComposedConfig:
    epochs: int = 20
    queries_per_epoch: int = 4096
    batch: int = 64
    lr: float = 5e-4
    weight_decay: float = 1e-4
    k_min: int = 2
    k_max: int = 16
    weight_loss: float = 1.0
    rank_loss: float = 1.0
    rank_negatives: int = 48
    rank_positives: int = 8
    rank_temperature: float = 0.05
    text_drop: float = 0.2
    agree_label: float = 0.5  # the weight target of a non-target neighbour that has the edit's attribute
    val_nqe: int = 8  # neighbours of the validation figure the epoch is chosen on (as the CIR guard)
    seed: int = 0
    # architecture (a small encoder: a projection to ``width``, then ``layers`` transformer layers)
    layers: int = 2
    heads: int = 4
    width: int = 128
    ff_dim: int = 256
    dropout: float = 0.1


@dataclass
class ComposedSet:
    """Composed queries over one gallery: ``q`` (Q, D) query vectors, ``t`` (Q, D) their texts' embeddings,
    ``cand`` (Q, C) the candidate gallery rows of each query in first-stage order (-1 padding; the reference and
    the other groups left out), ``rel`` (Q, C) True where the candidate is a target, ``agree`` (Q, C) True where it
    has the attribute the edit asks for (its category, colour or caption names it), ``gallery`` (G, D)."""

    q: np.ndarray
    t: np.ndarray
    cand: np.ndarray
    rel: np.ndarray
    gallery: np.ndarray
    method: np.ndarray  # (Q,) the composer each query came from
    agree: Optional[np.ndarray] = None

    def labels(self, idx: np.ndarray, k: int, agree_label: float) -> np.ndarray:
        """(B, k) weight targets of the first k candidates: 1 for a target, ``agree_label`` for another
        candidate with the edit's attribute, 0 otherwise."""
        rel = self.rel[idx, :k].astype(np.float32)
        if self.agree is not None and agree_label:
            rel = np.maximum(rel, agree_label * self.agree[idx, :k])
        return rel


def agrees(item: dict, attribute: Optional[str]) -> bool:
    """Whether a gallery record has the attribute an edit asks for: its category or colour is it, or its caption
    names it as a whole phrase ("man" in "man, bald" but not in "woman"; "medium" not in "medium-dark")."""
    if not attribute:
        return False
    a = str(attribute).lower()
    if a in (str(item.get("category") or "").lower(), str(item.get("colour") or "").lower()):
        return True
    cap = str(item.get("caption") or "").lower()
    return bool(cap) and re.search(r"(^|[\s,(])" + re.escape(a) + r"($|[\s,)])", cap) is not None


def build_set(qvecs: Dict[str, np.ndarray], texts: np.ndarray, queries: Sequence[dict], gallery: Sequence[dict],
              gemb: np.ndarray, pos: Dict[str, int], depth: int = 256) -> ComposedSet:
    """A :class:`ComposedSet` from ``{method: (Q, D)}`` composed vectors of the CIR ``queries`` (records with
    ``reference``, ``targets`` and ``gallery``) over the split's gallery; ``depth``: candidates kept per query
    (the first stage's top ones)."""
    groups = np.array([g["gallery"] for g in gallery])
    gemb = l2n(gemb)
    rows_q, rows_t, rows_c, rows_r, rows_m, rows_a = [], [], [], [], [], []
    for name, vecs in qvecs.items():
        vecs = l2n(vecs)
        for qi, rec in enumerate(queries):
            cand = np.flatnonzero(groups == rec["gallery"])
            cand = cand[cand != pos[rec["reference"]]]
            order = cand[np.argsort(-(gemb[cand] @ vecs[qi]), kind="stable")][:depth]
            targets = {pos[t] for t in rec["targets"] if t in pos}
            c = np.full(depth, -1, np.int64)
            c[:len(order)] = order
            rows_c.append(c)
            rows_r.append(np.isin(c, list(targets)) & (c >= 0))
            rows_a.append(np.array([i >= 0 and agrees(gallery[i], rec.get("attribute")) for i in c], bool))
            rows_q.append(vecs[qi])
            rows_t.append(texts[qi])
            rows_m.append(name)
    return ComposedSet(np.stack(rows_q).astype(np.float32), l2n(np.stack(rows_t)), np.stack(rows_c),
                       np.stack(rows_r), gemb.astype(np.float32), np.array(rows_m), np.stack(rows_a))


def new_model(cfg: ComposedConfig, data: ComposedSet) -> LAttQEModel:
    model = LAttQEModel(LAttQEConfig(
        dim=data.q.shape[1], layers=cfg.layers, heads=cfg.heads, ff_dim=cfg.ff_dim, dropout=cfg.dropout,
        trained_max_k=cfg.k_max, max_positions=cfg.k_max + 1, weight_floor=0.0, text_token=cfg.text_drop < 1.0,
        width=cfg.width))  # text_drop 1 (every text left out): the ablation without the text token
    model.center.copy_(torch.as_tensor(data.gallery.mean(0)))
    if model.config.text_token:
        model.text_center.copy_(torch.as_tensor(data.t.mean(0)))
    return model


def _batch_loss(model: LAttQEModel, data: ComposedSet, idx: np.ndarray, k: int, cfg: ComposedConfig,
                rng: np.random.Generator) -> Tuple[torch.Tensor, float, float]:
    g = torch.as_tensor(data.gallery)
    cand = data.cand[idx]
    nb = cand[:, :k]
    mask = torch.as_tensor(nb >= 0)
    q = torch.as_tensor(data.q[idx])
    t = torch.as_tensor(data.t[idx])
    has_text = torch.as_tensor(rng.random(len(idx)) >= cfg.text_drop)
    qhat, w, _ = model.expand(q, g[np.maximum(nb, 0)], mask, text=t, text_mask=has_text)
    l_w = weight_loss(w, torch.as_tensor(data.labels(idx, k, cfg.agree_label)), mask)
    # ranking: the query's targets (up to rank_positives) against the closest non-targets of the first stage
    pos_ids = np.zeros((len(idx), cfg.rank_positives), np.int64)
    pos_mask = np.zeros((len(idx), cfg.rank_positives), bool)
    neg_ids = np.zeros((len(idx), cfg.rank_negatives), np.int64)
    for r, i in enumerate(idx):
        tg = data.cand[i][data.rel[i]]
        if len(tg):
            pick = tg[:cfg.rank_positives]
            pos_ids[r, :len(pick)], pos_mask[r, :len(pick)] = pick, True
        non = data.cand[i][(~data.rel[i]) & (data.cand[i] >= 0)][:cfg.rank_negatives]
        neg_ids[r, :len(non)] = non
        neg_ids[r, len(non):] = non[-1] if len(non) else 0
    s_pos = torch.einsum("bd,bpd->bp", qhat, g[pos_ids])
    s_neg = torch.einsum("bd,bnd->bn", qhat, g[neg_ids])
    keep = torch.as_tensor(pos_mask.any(1))
    l_r = (ranking_loss(s_pos[keep], s_neg[keep], cfg.rank_temperature, torch.as_tensor(pos_mask)[keep])
           if keep.any() else torch.zeros(()))
    return cfg.weight_loss * l_w + cfg.rank_loss * l_r, l_w.item(), l_r.item()


@torch.no_grad()
def fixed_composed_loss(model: LAttQEModel, data: ComposedSet, cfg: Optional[ComposedConfig] = None,
                        k: int = 8) -> float:
    """The training objective on every query of ``data`` at ``k`` neighbours, texts kept (before/after checks)."""
    cfg = cfg or ComposedConfig()
    model.eval()
    loss, _, _ = _batch_loss(model, data, np.arange(len(data.q)), k, ComposedConfig(**{**asdict(cfg), "text_drop": 0.0}),
                             np.random.default_rng(0))
    return float(loss)


@torch.no_grad()
def composed_ranks(model: Optional[LAttQEModel], data: ComposedSet, nqe, with_text: bool = True
                   ) -> Tuple[np.ndarray, np.ndarray]:
    """(1-based best target rank per query, (Q, 10) the top 10 gallery rows) among each query's candidates,
    after expanding from its first ``nqe`` candidates (an int, or (Q,) per query; ``model`` None: no expansion;
    ``with_text`` False: the text token left out)."""
    n = len(data.q)
    nqe = np.broadcast_to(np.asarray(nqe, np.int64), (n,))
    vecs = data.q.copy()
    if model is not None:
        for k in np.unique(nqe):
            rows = np.flatnonzero(nqe == k)
            nb = data.cand[rows, :k]
            ok = (nb >= 0).all(1)
            rows, nb = rows[ok], nb[ok]
            if len(rows):
                vecs[rows] = expand_numpy(model, data.q[rows], data.gallery[nb],
                                          text=data.t[rows] if with_text else None)[0]
    ranks = np.zeros(n, np.int64)
    top = np.full((n, 10), -1, np.int64)
    for i in range(n):
        c = data.cand[i][data.cand[i] >= 0]
        s = data.gallery[c] @ vecs[i]
        order = np.argsort(-s, kind="stable")
        rel = data.rel[i][data.cand[i] >= 0][order]
        ranks[i] = int(np.argmax(rel)) + 1 if rel.any() else len(c) + 1
        top[i, :min(10, len(c))] = c[order[:10]]
    return ranks, top


def composed_eval(model: LAttQEModel, data: ComposedSet, nqe) -> Dict[str, dict]:
    """Per method: R@10 without and with the expander, with it but without the text token, and how many queries'
    top 10 it changes (with the text)."""
    out = {}
    r0, top0 = composed_ranks(None, data, nqe)
    r1, top1 = composed_ranks(model, data, nqe)
    r2, _ = composed_ranks(model, data, nqe, with_text=False)
    for name in dict.fromkeys(data.method.tolist()):
        m = data.method == name
        out[name] = {"queries": int(m.sum()), "r10_none": round(100.0 * float(np.mean(r0[m] <= 10)), 2),
                     "r5_none": round(100.0 * float(np.mean(r0[m] <= 5)), 2),
                     "r5": round(100.0 * float(np.mean(r1[m] <= 5)), 2),
                     "r10": round(100.0 * float(np.mean(r1[m] <= 10)), 2),
                     "r10_no_text": round(100.0 * float(np.mean(r2[m] <= 10)), 2),
                     "r1_no_text": round(100.0 * float(np.mean(r2[m] <= 1)), 2),
                     "r1_none": round(100.0 * float(np.mean(r0[m] <= 1)), 2),
                     "r1": round(100.0 * float(np.mean(r1[m] <= 1)), 2),
                     "top10_changed": int(np.sum(np.any(top0[m] != top1[m], axis=1))),
                     "target_rank_changed": int(np.sum(r0[m] != r1[m]))}
    return out


def mean_r10(res: Dict[str, dict], key: str = "r10") -> float:
    return float(np.mean([v[key] for v in res.values()]))


def mean_recall(res: Dict[str, dict], none: bool = False) -> float:
    """Mean over the methods of (R@1 + R@5 + R@10) / 3, with the expander or (``none``) without."""
    tail = "_none" if none else ""
    return float(np.mean([(v["r1" + tail] + v["r5" + tail] + v["r10" + tail]) / 3.0 for v in res.values()]))


def train_composed(train: ComposedSet, val: ComposedSet, cfg: Optional[ComposedConfig] = None, val_nqe=None,
                   progress: bool = True, model: Optional[LAttQEModel] = None
                   ) -> Tuple[LAttQEModel, List[Dict]]:
    """Trains a text-conditioned LAttQE on ``train``; keeps the epoch with the best :func:`mean_recall` on
    ``val`` at ``val_nqe`` (an int or per-query array; default ``cfg.val_nqe``). Returns (model, history)."""
    cfg = cfg or ComposedConfig()
    if len(train.q) < 2 or len(val.q) < 1:
        raise InputError("training needs at least 2 composed training queries and 1 validation query")
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    val_nqe = cfg.val_nqe if val_nqe is None else val_nqe
    model = model if model is not None else new_model(cfg, train)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    usable = np.flatnonzero(train.rel.any(1) & (train.cand[:, cfg.k_min - 1] >= 0))
    if len(usable) == 0:
        raise InputError("no composed training query has a target among its candidates")
    steps = max(1, cfg.queries_per_epoch // cfg.batch)
    base = mean_recall(composed_eval(model, val, val_nqe), none=True)
    history: List[Dict] = []
    best, best_state = -1.0, None
    bar = tqdm(range(1, cfg.epochs + 1), desc="train LAttQE (text)", disable=not progress)
    for epoch in bar:
        t0 = time.perf_counter()
        model.train()
        sums = np.zeros(3)
        for _ in range(steps):
            idx = rng.choice(usable, size=min(cfg.batch, len(usable)), replace=False)
            k = int(rng.integers(cfg.k_min, cfg.k_max + 1))
            loss, l_w, l_r = _batch_loss(model, train, idx, k, cfg, rng)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sums += [loss.item(), l_w, l_r]
        model.eval()
        res = composed_eval(model, val, val_nqe)
        score = mean_recall(res)
        history.append({"epoch": epoch, "loss": sums[0] / steps, "weight": sums[1] / steps, "rank": sums[2] / steps,
                        "val_recall": score, "val_recall_none": base, "val_r10": mean_r10(res),
                        "val_by_method": {n: {k: v[k] for k in ("r1", "r5", "r10")} for n, v in res.items()}})
        if score > best:
            best, best_state = score, copy.deepcopy(model.state_dict())
        bar.set_postfix(loss=f"{sums[0] / steps:.4f}", val_recall=f"{score:.2f}", none=f"{base:.2f}")
        if not another_epoch_fits(time.perf_counter() - t0):
            break
    if best_state is not None:
        model.load_state_dict(best_state)
    return model.eval(), history


# finer near 1 than the image-only trainer's grid: on composed queries only high floors keep R@10
COMPOSED_FLOOR_GRID = (*FLOOR_GRID[:-2], 0.7, 0.8, 0.85, 0.9, 0.95, 1.0)


def choose_composed_floor(model: LAttQEModel, val: ComposedSet, val_nqe, grid: Sequence[float] = COMPOSED_FLOOR_GRID,
                          r10_guard: float = 0.5) -> Dict:
    """Sets the model's query-side weight floor to the grid value with the best :func:`mean_recall` on ``val``
    among those that keep every method's R@10 within ``r10_guard`` points of no expansion (ties: the larger
    floor; 1, keeping the query, when no other is allowed)."""
    table, r10, allowed = {}, {}, []
    for f in grid:
        model.config.weight_floor = float(f)
        res = composed_eval(model, val, val_nqe)
        table[float(f)] = round(mean_recall(res), 4)
        r10[str(float(f))] = {n: [v["r10_none"], v["r10"]] for n, v in res.items()}
        if all(v["r10"] >= v["r10_none"] - r10_guard for v in res.values()):
            allowed.append(float(f))
    best = max(allowed or [1.0], key=lambda f: (table.get(f, -1.0), f))
    model.config.weight_floor = best
    return {"weight_floor": best, "r10_guard": r10_guard, "allowed": allowed,
            "val_recall_by_floor": {str(f): v for f, v in table.items()}, "val_r10_by_floor": r10}


def composed_sets(backbone, methods: Sequence[str], settings) -> Dict[str, tuple]:
    """{"train"/"val": the arguments of :func:`build_set`} from the offline CIR set: the train split without the
    held-out sources' queries, each query composed by ``methods`` (registered composers that load for
    ``backbone``) at alpha 0.5 as `eval offline` composes them, and its text encoded by the backbone."""
    composers = {}
    for name in methods:
        if name not in COMPOSERS:
            raise InputError(f"unknown method {name!r} for --methods; known: {', '.join(COMPOSERS)}")
        try:
            composers[name] = COMPOSERS.get(name)(backbone, checkpoint_dir=search_path(settings))
        except ComposerUnavailable as exc:
            raise InputError(f"method {name!r} is not available: {exc}") from None
    out = {}
    held = held_out_cir_images()
    for split in ("train", "val"):
        queries, gallery, gemb, pos = cir_tensors(backbone, split)
        if split == "train" and held:
            queries = [q for q in queries if keep_row([q["reference"], *q["targets"]], held)]
        ref = torch.from_numpy(np.asarray(gemb[[pos[q["reference"]] for q in queries]], np.float32))
        qv = compose_queries(backbone, composers, queries, ref)
        texts = query_texts(backbone, queries)
        out[split] = (qv, texts, queries, gallery, gemb, pos)
    return out


def page_nqe(backbone, settings, raw: tuple, name: str = "lattqe-text") -> np.ndarray:
    """(Q * methods,) the nQE the page's defaults give ``name`` on each query's gallery group (engine.defaults),
    in :func:`build_set`'s row order."""
    qv, _, queries, gallery, _, _ = raw
    d = engine_defaults(backbone, settings)
    sizes: Dict[str, int] = {}
    for g in gallery:
        sizes[g["gallery"]] = sizes.get(g["gallery"], 0) + 1
    per_query = np.array([d.gallery_nqe(name, sizes[q["gallery"]]) for q in queries], np.int64)
    return np.tile(per_query, len(qv))
