"""Composed retrieval on the offline CIR set, the pieces every evaluation shares: the set's tensors
(:func:`cir_tensors`), the composers and expanders that load (:func:`cir_composers`,
:func:`available_expanders`), the query vectors (:func:`compose_queries`), the ranking with the reference
left out (:func:`rank_queries`) and Recall@K (:func:`recall`).

Used by `eval offline` (``engine.eval.offline``), the other evaluation sections and the trainers' validation
(LAttQE's CIR guard, the anchor fit); it imports none of them.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

from ..compose import COMPOSERS, ComposerUnavailable, Query
from ..compose.rtic import load_rtic_composer
from ..checkpoints import search_path
from ..config import Settings
from ..data.features import embed_paths
from ..data.formats import image_path, load_split
from ..expand import EXPANDERS, ExpanderUnavailable
from ..expand.base import expand_query, expander_reads_text
from ..images import load_image
from ..index import hubs
from .metrics import first_hit_rank, first_hit_ranks, recall_from_ranks

KS = (1, 5, 10, 50)


def cir_tensors(backbone, split: str = "test"):
    """Queries, gallery records, gallery embeddings and reference features of the offline CIR set."""
    from ..data.builders import ensure_built

    ensure_built("cir")  # the explicit build step (quick when built)
    queries = load_split("cir", split)
    gallery = load_split("cir", f"{split}_gallery")
    gemb = embed_paths(backbone, [image_path("cir", g["image"]) for g in gallery], desc=f"cir {split} gallery")
    pos = {g["image"]: i for i, g in enumerate(gallery)}
    return queries, gallery, gemb, pos


def reference_tokens(backbone, paths: List[Path], batch: int = 32) -> torch.Tensor:
    out = []
    with torch.no_grad():
        for i in range(0, len(paths), batch):
            x = torch.stack([backbone.preprocess(load_image(p)) for p in paths[i : i + batch]])
            out.append(backbone.encode_images_with_tokens(x)[1].cpu())
    return torch.cat(out)


def cir_composers(backbone, settings: Settings):
    """({name: composer} for every registered composer that loads for ``backbone`` plus the extra checkpoint
    variants, {name: why not} for the others)."""
    composers, skipped = {}, {}
    for name in COMPOSERS:
        try:
            composers[name] = COMPOSERS.get(name)(backbone, checkpoint_dir=search_path(settings))
        except ComposerUnavailable as exc:
            skipped[name] = str(exc)
    composers.update(_variants(backbone, settings))
    return composers, skipped


def compose_queries(backbone, composers: dict, queries, ref_emb: torch.Tensor,
                    timings: Optional[dict] = None, ref_paths: Optional[List[Path]] = None,
                    trusts: Optional[dict] = None) -> Dict[str, np.ndarray]:
    """{composer name: query vectors (Q, D)} for the CIR ``queries`` (alpha 0.5), the reference embeddings
    ``ref_emb`` (Q, D) given; visual tokens are computed only when a composer needs them (Context-I2W), from
    ``ref_paths`` (default: the queries' references in the offline CIR set).
    ``timings``: filled with each composer's ms per query (the token extraction not counted); ``trusts``: filled
    with each anchored composer's share of the learned correction per query (its explanation's ``trust``)."""
    tokens = None
    if any(getattr(c, "name", "") == "context-i2w" for c in composers.values()):
        if ref_paths is None:
            ref_paths = [image_path("cir", q["reference"]) for q in queries]
        unique = sorted({str(p) for p in ref_paths})  # each reference's tokens once, however many queries use it
        row = {p: i for i, p in enumerate(unique)}
        tokens = reference_tokens(backbone, [Path(p) for p in unique])[[row[str(p)] for p in ref_paths]]
    out = {}
    with torch.no_grad():
        for name, comp in composers.items():
            t = time.perf_counter()
            done = comp.compose_many([Query(text=q["text"], image_embedding=ref_emb[i], has_image=True, alpha=0.5,
                                            image_tokens=None if tokens is None else tokens[i])
                                      for i, q in enumerate(queries)])
            out[name] = np.stack([c.vector for c in done])
            if trusts is not None and any("trust" in c.explanation for c in done):  # (a routed method's may not be first)
                trusts[name] = np.array([float(c.explanation.get("trust", 0.0)) for c in done])
            if timings is not None:
                timings[name] = (time.perf_counter() - t) / len(queries) * 1e3
    return out


def query_texts(backbone, queries, batch: int = 256) -> np.ndarray:
    """(Q, D) the embeddings of the queries' modification texts (``text``), what the search hands a
    text-conditioned expander (engine.expand.base.Expander.expand)."""
    out = []
    with torch.no_grad():
        for i in range(0, len(queries), batch):
            emb = backbone.encode_texts([q["text"] for q in queries[i:i + batch]]).embeddings
            out.append(np.asarray(emb.detach().float().cpu().numpy() if torch.is_tensor(emb) else emb, np.float32))
    return np.concatenate(out) if out else np.zeros((0, backbone.embed_dim), np.float32)


def reads_text(expanders: Optional[dict]) -> bool:
    """Whether any of ``expanders`` reads the query's modification text (then :func:`query_texts` is needed)."""
    return any(expander_reads_text(e) for e in (expanders or {}).values())


def rank_queries(qvecs: np.ndarray, queries, gallery, gemb, pos, expanders: Optional[dict] = None,
                 nqe=8, restrict: Optional[np.ndarray] = None, floor=None, density: Optional[np.ndarray] = None,
                 hub: float = 0.0, texts: Optional[np.ndarray] = None, plain: bool = True) -> Dict[str, np.ndarray]:
    """{expander name: best target rank per query (1-based)}; 'none' is the plain ranking (left out with
    ``plain=False`` when expanders are given: a grid over an expander's settings needs only the expanded ranks);
    ``texts`` (Q, D): the queries' modification-text embeddings, handed to the expanders (only text-conditioned
    LAttQE reads them).

    ``nqe``: the neighbours each expander averages, an int or ``nqe(expander name, candidates) -> int`` (the
    page defaults: ``EngineDefaults.gallery_nqe``); ``floor(expander name) -> float``: only neighbours at least
    that close to the query are averaged in, none that close keeps the query (``EngineDefaults.floor_for``).

    ``restrict`` (Q, R) gallery ids: only these candidates can be returned (a compact index's
    Hamming short-list); the others rank last. ``density`` (G,) and ``hub``: the hub correction the page applies
    (``engine.index.hubs``): every score less ``hub * density`` of its item."""
    groups = np.array([g["gallery"] for g in gallery])
    members: Dict[str, np.ndarray] = {}  # gallery group -> its rows, found once per group, not once per query
    names = ["none", *(expanders or {})] if plain or not expanders else list(expanders)
    ranks = {name: np.zeros(len(queries), np.int64) for name in names}
    target_rows = np.zeros(len(gallery), bool)  # one query's targets at a time (set, read, cleared)
    for qi, q in enumerate(queries):
        if q["gallery"] not in members:
            members[q["gallery"]] = np.flatnonzero(groups == q["gallery"])
        cand = members[q["gallery"]]
        cand = cand[cand != pos[q["reference"]]]
        targets = [pos[t] for t in q["targets"]]
        target_rows[targets] = True
        is_target = target_rows[cand]
        target_rows[targets] = False
        vecs = gemb[cand]
        first = vecs @ qvecs[qi]
        penalty = hubs.penalty(first, density[cand], hub) if hub and density is not None else 0.0
        first = first - penalty
        if restrict is not None:
            first = np.where(np.isin(cand, restrict[qi]), first, -np.inf)
        order_all = None
        for name in ranks:
            s = first
            if name != "none":
                k = nqe(name, len(cand)) if callable(nqe) else nqe
                if order_all is None:
                    order_all = np.argsort(-first, kind="stable")
                order = order_all[:k]
                if floor is not None:
                    order = order[first[order] >= floor(name)]
                if len(order):
                    s = vecs @ expand_query(expanders[name], qvecs[qi], vecs[order], first[order],
                                            None if texts is None else texts[qi]).vector - penalty
            r = first_hit_rank(s, is_target)
            ranks[name][qi] = int(r) + 1 if np.isfinite(r) else len(cand) + 1
    return ranks


def hub_grid_ranks(qvecs: np.ndarray, queries, gallery, gemb, pos, density: Optional[np.ndarray],
                   weights: Sequence[float]) -> Dict[float, np.ndarray]:
    """{weight: plain best-target rank per query (1-based)}: what :func:`rank_queries` (``density=density,
    hub=w``, its "none") gives for every weight, from one (B, N) score matrix over the queries' one gallery group
    (N rows) instead of one ranking per query and weight; the reference is masked out of each row. A row is scored
    over the same candidates as :func:`rank_queries` scores it (one product per query, over its group less its
    reference), so the scores, and with them the ranks, are the same to the bit (engine.eval.generalise
    ``choose_hub`` ranks its grid of hub weights with it)."""
    groups = np.array([g["gallery"] for g in gallery])
    names = {q["gallery"] for q in queries}
    if len(names) > 1:
        raise ValueError(f"the queries rank over one gallery group, not {sorted(names)}")
    rows = np.flatnonzero(groups == names.pop()) if names else np.zeros(0, np.int64)
    scores = np.zeros((len(queries), len(rows)), np.result_type(gemb.dtype, qvecs.dtype))
    reference = np.zeros(scores.shape, bool)
    target = np.zeros(scores.shape, bool)
    for i, q in enumerate(queries):
        reference[i] = rows == pos[q["reference"]]
        scores[i, ~reference[i]] = gemb[rows[~reference[i]]] @ qvecs[i]
        target[i] = np.isin(rows, [pos[t] for t in q["targets"]])
    candidates = len(rows) - reference.sum(1)
    out = {}
    for w in weights:
        s = scores - hubs.penalty(scores, density[rows][None], w) if w and density is not None else scores
        r = first_hit_ranks(s, target, exclude=reference)
        out[w] = np.where(np.isfinite(r), r + 1, candidates + 1).astype(np.int64)
    return out


def group_density(gallery, gemb: np.ndarray) -> np.ndarray:
    """(G,) each gallery row's density (``engine.index.hubs.density``) within its own gallery group (the
    rows a query of that group ranks), as the page computes it over its one gallery."""
    groups = np.array([g["gallery"] for g in gallery])
    out = np.zeros(len(gallery), dtype=np.float32)
    for g in np.unique(groups):
        rows = np.flatnonzero(groups == g)
        out[rows] = hubs.density(gemb[rows])
    return out


def recall(ranks: np.ndarray, ks=KS) -> Dict[str, float]:
    """R@K (percent) from 1-based ranks, by the evaluation core (engine.eval.metrics)."""
    return recall_from_ranks(np.asarray(ranks) - 1, ks)


def available_expanders(backbone, settings: Settings, skipped: Optional[dict] = None) -> dict:
    """{name: expander} of every registered expander (but "none") available for ``backbone``; the others'
    reasons go into ``skipped`` as "expander NAME"."""
    out = {}
    for name in EXPANDERS:
        if name == "none":
            continue
        try:
            out[name] = EXPANDERS.get(name)(embed_dim=backbone.embed_dim, checkpoint_dir=search_path(settings),
                                            fingerprint=backbone.fingerprint)
        except ExpanderUnavailable as exc:
            if skipped is not None:
                skipped[f"expander {name}"] = str(exc)
    return out


def _variants(backbone, settings):
    """Extra checkpoints of registered composers to evaluate side by side (e.g. RTIC trained with GCN)."""
    out = {}
    try:
        out["rtic+gcn"] = load_rtic_composer(backbone, search_path(settings), variant="rtic+gcn")
    except ComposerUnavailable:
        pass
    return out
