"""Hub correction: a gallery item that sits close to many others is pulled down before ranking.

In a high-dimensional space some items (hubs) are near the centre of the data and turn up in the top results of
unrelated queries (``engine.eval.hubness`` measures it). The correction is the gallery side of CSLS (Conneau et
al., 2018, "Word translation without parallel data"): each item ``g`` gets its *density*

    r(g) = mean of the cosines of g to its kappa nearest other gallery items,

and a query ranks the gallery by ``cos(q, g) - weight * r(g)`` (the score a result shows). CSLS's other term, the query's own density,
is the same for every item of one query, so it does not change that query's ranking and is left out. The
density is a property of the gallery alone (no labels, no query log), computed once per gallery; the weight
is chosen per method on the validation side of the held-out-domain suite (``python -m engine eval generalise
--side val --choose``) and stored in the defaults record (``hub_weight``); 0 turns the correction off.

The density is exact (every pair) up to :data:`MAX_ITEMS` items; a larger gallery is not corrected (the pairs
would cost minutes at start) and says so in the engine's info.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

KAPPA = 10
MAX_ITEMS = 20_000
POOL = 200  # first-stage candidates re-ranked with the correction (the whole gallery when it is smaller)
IDENTICAL = 0.99  # a cosine this high is the query's own picture, also when re-encoded after an upload


def density(vectors: np.ndarray, kappa: int = KAPPA, chunk: int = 2048) -> np.ndarray:
    """(N,) float32: the mean cosine of each row of ``vectors`` (N, D), L2-normalised, to its ``kappa`` nearest
    other rows (all of them when there are fewer). Memory: one (chunk, N) block at a time."""
    v = np.ascontiguousarray(vectors, dtype=np.float32)
    n = len(v)
    out = np.zeros(n, dtype=np.float32)
    if n < 2:
        return out
    k = min(int(kappa), n - 1)
    for start in range(0, n, chunk):
        block = v[start:start + chunk] @ v.T
        rows = np.arange(len(block))
        block[rows, start + rows] = -np.inf  # not its own neighbour
        top = np.partition(block, n - k, axis=1)[:, n - k:]
        out[start:start + chunk] = top.mean(axis=1)
    return out


def penalty(scores: np.ndarray, item_density: np.ndarray, weight: float) -> np.ndarray:
    """``weight * density`` of each scored item, none for a score of at least :data:`IDENTICAL` (the query's own
    picture, kept when the reference is not left out: an exact match is not a hub)."""
    return np.where(scores >= IDENTICAL, 0.0, weight * item_density).astype(np.float32)


def corrected(scores: np.ndarray, ids: np.ndarray, item_density: Optional[np.ndarray],
              weight: float) -> Tuple[np.ndarray, np.ndarray]:
    """(scores, ids) of one first-stage search (Q, K) re-sorted by ``score - penalty``, the scores returned
    (ids -1, the index's padding, last with -inf). Unchanged when the weight is 0 or there is no density."""
    if not weight or item_density is None:
        return scores, ids
    valid = ids >= 0
    dens = item_density[np.where(valid, ids, 0)]
    key = np.where(valid, scores - penalty(scores, dens, weight), -np.inf).astype(np.float32)
    order = np.argsort(-key, axis=1, kind="stable")
    return np.take_along_axis(key, order, axis=1), np.take_along_axis(ids, order, axis=1)
