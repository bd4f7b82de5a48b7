"""Context-I2W evaluation: held-out pseudo-word retrieval, the local branch's share, composed retrieval
against the baselines (with ablations) on triplets and on the offline ``cir`` set."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ...compose.base import COMPOSERS, Query
from ...compose.context_i2w import ContextI2WComposer, ContextI2WMapper
from ...data import formats
from ...data.heldout import held_out_cir_images, keep_row
from ...errors import InputError
from ...eval.metrics import first_hit_ranks, recall_from_ranks
from .data import PairFeatures, _batch, image_features, text_embeddings
from .model import pseudo_prompt_embeddings


def _recall(scores: np.ndarray, targets: Sequence[Sequence[int]], ks: Sequence[int],
            exclude: Optional[Sequence[int]] = None) -> Dict[str, float]:
    """R@K (percent): a query counts when any of its targets ranks in the top K (``exclude`` removed)."""
    scores = np.asarray(scores, dtype=np.float64)
    positive = np.zeros(scores.shape, dtype=bool)
    for i, ts in enumerate(targets):
        positive[i, list(ts)] = True
    excluded = None
    if exclude is not None:
        excluded = np.zeros(scores.shape, dtype=bool)
        for i, e in enumerate(exclude):
            if e is not None and e >= 0:
                excluded[i, e] = True
    return recall_from_ranks(first_hit_ranks(scores, positive, excluded), ks)


@torch.no_grad()
def evaluate_pairs(backbone, mapper: ContextI2WMapper, feats: PairFeatures, ks: Sequence[int] = (1, 5, 10),
                   batch_size: int = 64) -> Dict[str, Dict[str, float]]:
    """Held-out pseudo-word retrieval: "a photo of S*" (S* from image i and its caption's context) must find
    image i among the held-out images. The caption's text-only retrieval is reported alongside; the
    image-only baseline is trivially perfect on this task and is therefore not reported."""
    mapper.eval()
    device = backbone.device
    q = []
    for i in range(0, len(feats), batch_size):
        idx = np.arange(i, min(i + batch_size, len(feats)))
        _, tok, ctx = _batch(feats, idx, device)
        q.append(pseudo_prompt_embeddings(backbone, mapper, tok, ctx).float().cpu())
    q = torch.cat(q).numpy()
    gallery = np.asarray(feats.emb, dtype=np.float32)
    targets = [[i] for i in range(len(feats))]
    caps = text_embeddings(backbone, feats.captions)
    return {"context-i2w": _recall(q @ gallery.T, targets, ks), "text (caption)": _recall(caps @ gallery.T, targets, ks)}


def local_share(mapper: ContextI2WMapper, feats: PairFeatures, batch_size: int = 256) -> float:
    """Median over ``feats`` of ||tanh(gate) · local|| / ||global||: how much of S* the local branch carries
    (0 when the gate is closed or the local branch outputs nothing)."""
    mapper.eval()
    ratios = []
    with torch.no_grad():
        for i in range(0, len(feats), batch_size):
            _, tok, ctx = _batch(feats, np.arange(i, min(i + batch_size, len(feats))), mapper.gate.device)
            g, loc = mapper.parts(ctx, tok)
            ratios.append((torch.tanh(mapper.gate) * loc).norm(dim=-1) / g.norm(dim=-1).clamp_min(1e-12))
    return float(torch.cat(ratios).median()) if ratios else float("nan")


def evaluate_context_i2w(backbone, mapper: ContextI2WMapper, triplets: Sequence[dict],
                         gallery: Optional[Sequence[str]] = None, ks: Sequence[int] = (1, 5, 10),
                         alpha: float = 0.5, progress: bool = True,
                         ablations: bool = True) -> Dict[str, Dict[str, float]]:
    """Composed retrieval R@K of Context-I2W and the image-only, text-only and sum baselines; with
    ``ablations`` also Context-I2W with its local branch off and with the image removed.

    ``triplets``: dicts with ``reference`` (image path), ``text`` and ``targets`` (list of image paths)
    or ``target``. ``gallery``: image paths searched (default: every reference and target). The
    reference image itself is removed from each query's ranking (as in CIRR).
    """
    from tqdm.auto import tqdm

    def targets_of(t):
        ts = t.get("targets", t.get("target"))
        return [str(x) for x in (ts if isinstance(ts, (list, tuple)) else [ts])]

    if not triplets:
        raise InputError("no triplets to evaluate")
    if gallery is None:
        seen = {}
        for t in triplets:
            for p in [str(t["reference"])] + targets_of(t):
                seen.setdefault(p, None)
        gallery = list(seen)
    gallery = list(dict.fromkeys(str(g) for g in gallery))
    gallery += [p for p in dict.fromkeys(x for t in triplets for x in targets_of(t)) if p not in set(gallery)]
    pos = {p: i for i, p in enumerate(gallery)}
    refs = sorted({str(t["reference"]) for t in triplets})
    g_emb, _ = image_features(backbone, [Path(p) for p in gallery], progress=progress)
    r_emb, r_tok = image_features(backbone, [Path(p) for p in refs], progress=progress)
    rpos = {p: i for i, p in enumerate(refs)}

    composers = {"context-i2w": ContextI2WComposer(backbone, mapper.eval())}
    if ablations:
        # the local branch switched off (gate 0), and the image removed (every query gets the mean visual
        # tokens of the references, so S* carries nothing of its own image)
        no_local = copy.deepcopy(mapper).eval()
        with torch.no_grad():
            no_local.gate.zero_()
        composers["context-i2w (local branch off)"] = ContextI2WComposer(backbone, no_local)
        composers["context-i2w (image removed)"] = ContextI2WComposer(backbone, mapper.eval())
        mean_tok = torch.from_numpy(np.asarray(r_tok, dtype=np.float32).mean(0))
    for name in ("image", "text", "sum"):
        composers[name] = COMPOSERS.get(name)(backbone)
    vecs = {name: [] for name in composers}
    for t in tqdm(triplets, desc="composed queries", disable=not progress):
        r = rpos[str(t["reference"])]
        query = Query(text=str(t["text"]), image_embedding=torch.from_numpy(np.array(r_emb[r])),
                      image_tokens=torch.from_numpy(np.array(r_tok[r])).float(), has_image=True, alpha=alpha)
        for name, comp in composers.items():
            q = query
            if name == "context-i2w (image removed)":
                q = Query(text=query.text, image_embedding=query.image_embedding, image_tokens=mean_tok,
                          has_image=True, alpha=alpha)
            vecs[name].append(comp.compose(q).vector)
    targets = [[pos[p] for p in targets_of(t) if p in pos] for t in triplets]
    exclude = [pos.get(str(t["reference"]), -1) for t in triplets]
    return {name: _recall(np.stack(v) @ np.asarray(g_emb).T, targets, ks, exclude) for name, v in vecs.items()}




def cir_queries(split: str) -> Dict[str, Tuple[List[dict], List[str]]]:
    """The offline ``cir`` set's split as {gallery name: (triplets, gallery image paths)}."""
    from ...data.builders import ensure_built

    ensure_built("cir")  # the explicit build step (quick when built)
    held = held_out_cir_images()  # the held-out sources (engine.data.heldout) are left out
    groups: Dict[str, Tuple[List[dict], List[str]]] = {}
    for r in formats.load_split("cir", split):
        ts = r.get("targets", r.get("target"))
        ts = ts if isinstance(ts, list) else [ts]
        if not keep_row([r["reference"], *ts], held):
            continue
        trip = {"reference": str(formats.image_path("cir", r["reference"])), "text": r.get("text", ""),
                "targets": [str(formats.image_path("cir", x)) for x in ts]}
        groups.setdefault(r.get("gallery", "all"), ([], []))[0].append(trip)
    try:
        gallery = formats.load_split("cir", f"{split}_gallery")
    except InputError:
        gallery = []
    for g in gallery:
        name = g.get("gallery", "all")
        if name in groups and g["image"] not in held:
            groups[name][1].append(str(formats.image_path("cir", g["image"])))
    return groups


def evaluate_cir(backbone, mapper: ContextI2WMapper, split: str = "test", progress: bool = True) -> Dict[str, dict]:
    """Composed retrieval on the offline ``cir`` split, per gallery and pooled (query-weighted)."""
    out: Dict[str, dict] = {}
    total = 0
    pooled: Dict[str, Dict[str, float]] = {}
    for name, (trip, gallery) in sorted(cir_queries(split).items()):
        res = evaluate_context_i2w(backbone, mapper, trip, gallery or None, progress=progress)
        out[name] = {"n": len(trip), "gallery": len(gallery), "recall": res}
        total += len(trip)
        for method, rec in res.items():
            for k, v in rec.items():
                pooled.setdefault(method, {}).setdefault(k, 0.0)
                pooled[method][k] += v * len(trip)
    out["all"] = {"n": total, "recall": {m: {k: v / max(total, 1) for k, v in r.items()} for m, r in pooled.items()}}
    return out


