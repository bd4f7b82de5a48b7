"""RTIC evaluation: Recall@K of RTIC models and the training-free baselines (image, text, sum) on a held-out
split (:func:`evaluate_rtic`), per query kind against the gallery of that kind (:func:`evaluate_by_kind`), and
the printed held-out lines of a run (:func:`held_out`)."""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import torch
import torch.nn.functional as F

from ...compose.rtic import RTIC
from ...data.cir_triplets import TripletSet
from ...eval.metrics import first_hit_ranks, recall_from_ranks
from .model import compose_all


@torch.no_grad()
def evaluate_rtic(
    data: TripletSet,
    models: Optional[Dict[str, RTIC]] = None,
    ks: Sequence[int] = (1, 10, 50),
    alpha: float = 0.5,
    exclude_reference: bool = True,
    gallery_ids: Optional[torch.Tensor] = None,
) -> Dict[str, Dict[str, float]]:
    """Recall@K (in %) of the baselines (image, text, sum) and each RTIC model on a held-out split.

    Gallery = ``gallery_ids`` if given, else ``data.gallery`` (the split's gallery), else every
    reference and target image of the split; targets and references are always added to it. One
    query per (reference, text) with all its targets as positives; the reference itself is removed
    from its ranking (``exclude_reference``) unless it is also a target.
    """
    ref_ids, text_ids, targets = data.queries()
    base = gallery_ids if gallery_ids is not None else data.gallery
    parts = [data.ref, data.tgt] + ([base] if base is not None else [])
    gallery_ids = torch.unique(torch.cat(parts))
    position = {int(g): i for i, g in enumerate(gallery_ids)}
    gallery = F.normalize(data.images[gallery_ids].float(), dim=1)
    img = data.images[ref_ids].float()
    txt = data.texts[text_ids].float()
    queries = {
        "image": img,
        "text": txt,
        "sum": (1 - alpha) * F.normalize(img, dim=1) + alpha * F.normalize(txt, dim=1),
    }
    for name, model in (models or {}).items():
        queries[name] = compose_all(model, img, txt)
    positive = torch.zeros(len(ref_ids), len(gallery_ids), dtype=torch.bool)
    for q, tg in enumerate(targets):
        positive[q, [position[t] for t in tg]] = True
    ref_col = torch.tensor([position[int(r)] for r in ref_ids])
    excluded = None
    if exclude_reference:
        rows = torch.arange(len(ref_col))
        excluded = torch.zeros_like(positive)
        excluded[rows, ref_col] = ~positive[rows, ref_col]  # a reference that is also a target stays
        excluded = excluded.numpy()
    out = {}
    for name, q in queries.items():
        scores = (F.normalize(q, dim=1) @ gallery.T).numpy()
        ranks = first_hit_ranks(scores, positive.numpy(), excluded)
        out[name] = {k_: round(v, 2) for k_, v in recall_from_ranks(ranks, ks).items()}
    return out


def evaluate_by_kind(data: TripletSet, triplets, gallery, models, ks=(1, 10, 50)) -> Dict[str, Dict]:
    """Held-out recalls per query kind (``meta['kind']``), each ranked against the gallery of its kind
    (``meta['gallery']``, e.g. twemoji vs photos) when the set defines one."""
    out: Dict[str, Dict] = {}
    kinds = sorted({str(t.meta.get("kind", "")) for t in triplets} - {""})
    key_to_id = {k: i for i, k in enumerate(data.image_keys)}
    for kind in kinds:
        qs = torch.tensor([i for i, t in enumerate(triplets) if t.meta.get("kind") == kind])
        rows = torch.nonzero(torch.isin(data.query, qs)).flatten()
        galleries = {str(triplets[i].meta.get("gallery", "")) for i in qs.tolist()}
        ids = [key_to_id[p] for p, g in gallery if g in galleries and p in key_to_id]
        sub = data.subset(rows)
        sub.gallery = torch.tensor(ids, dtype=torch.int64) if ids else None
        out[kind] = {"queries": int(len(qs)), **evaluate_rtic(sub, models, ks)}
    return out


def held_out(data, triplets, gallery, models, label: str = ""):
    """(recalls per model, recalls per query kind) of ``data`` (None: both empty; no ``triplets``: no kinds),
    printed one line per model and per kind, each line starting with ``label``."""
    metrics = evaluate_rtic(data, models) if data is not None else {}
    by_kind = evaluate_by_kind(data, triplets, gallery, models) if data is not None and triplets is not None else {}
    for name, m in metrics.items():
        print(f"{label}{name:10s} " + "  ".join(f"{k}={v:6.2f}" for k, v in m.items()))
    for kind, ms in by_kind.items():
        print(f"[{label}{kind}: {ms['queries']} queries] " + "  ".join(
            f"{name} R@1/10={m['R@1']:.1f}/{m['R@10']:.1f}" for name, m in ms.items() if name != "queries"))
    return metrics, by_kind
