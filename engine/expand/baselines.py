"""Classic query-expansion baselines: AQE, AQEwD and alpha-QE.

All three re-form a query ``q`` from its top-n neighbours ``d_1..d_n`` (rank order) as

    q^ = normalise(q + sum_i w_i d_i)

and differ only in the weights ``w_i`` (the query's own weight is always 1):

* **AQE** (average query expansion, Chum et al. 2007): ``w_i = 1``.
* **AQEwD** (AQE with decay, Gordo et al. 2017): weights fall linearly with rank,
  ``w_i = (n - i + 1) / n`` for rank ``i = 1..n`` (top-1 gets 1, the last one ``1/n``).
* **alpha-QE** (Radenovic et al. 2018): ``w_i = max(sim(q, d_i), 0) ** alpha`` (alpha = 3).

The batched helpers (:func:`baseline_weights`, :func:`expand_batch`) are what evaluation and
database-side augmentation use; the :class:`Expander` classes wrap them for one query.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..errors import InputError
from .base import EXPANDERS, Expander, Expansion, l2n

BASELINES = ("aqe", "aqewd", "alpha-qe")
DEFAULT_ALPHA = 3.0


def baseline_weights(method: str, sims: np.ndarray, alpha: float = DEFAULT_ALPHA) -> np.ndarray:
    """Neighbour weights (..., n) of a baseline method given similarities (..., n) in rank order."""
    sims = np.asarray(sims, dtype=np.float32)
    n = sims.shape[-1]
    if method == "aqe":
        return np.ones_like(sims)
    if method == "aqewd":
        if n == 0:
            return np.zeros_like(sims)
        ranks = np.arange(1, n + 1, dtype=np.float32)
        return np.broadcast_to((n - ranks + 1) / n, sims.shape).astype(np.float32).copy()
    if method == "alpha-qe":
        return np.power(np.clip(sims, 0.0, None), np.float32(alpha)).astype(np.float32)
    raise InputError(f"unknown query expansion {method!r}; known: {', '.join(BASELINES)}")


def combine(query: np.ndarray, neighbours: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """normalise(q + sum_i w_i d_i) for a batch: query (B, D), neighbours (B, n, D), weights (B, n)."""
    q = np.asarray(query, dtype=np.float32)
    nb = np.asarray(neighbours, dtype=np.float32)
    w = np.asarray(weights, dtype=np.float32)
    return l2n(q + np.einsum("bn,bnd->bd", w, nb))


def expand_batch(
    method: str, query: np.ndarray, neighbours: np.ndarray, sims: Optional[np.ndarray] = None,
    alpha: float = DEFAULT_ALPHA,
) -> np.ndarray:
    """Expanded queries (B, D) for a batch. ``sims`` defaults to q . d_i."""
    q = np.asarray(query, dtype=np.float32)
    nb = np.asarray(neighbours, dtype=np.float32)
    if sims is None:
        sims = np.einsum("bd,bnd->bn", q, nb)
    return combine(q, nb, baseline_weights(method, sims, alpha))


def check_inputs(query: np.ndarray, neighbours: np.ndarray, sims: np.ndarray):
    """Validate and convert the arguments of :meth:`Expander.expand`; raises InputError."""
    q = np.asarray(query, dtype=np.float32).reshape(-1)
    nb = np.asarray(neighbours, dtype=np.float32)
    if nb.size == 0:
        nb = nb.reshape(0, q.shape[0])
    if nb.ndim != 2 or nb.shape[1] != q.shape[0]:
        raise InputError(f"neighbours must be (n, {q.shape[0]}); got {tuple(nb.shape)}")
    s = np.asarray(sims if sims is not None else nb @ q, dtype=np.float32).reshape(-1)
    if s.shape[0] != nb.shape[0]:
        raise InputError(f"got {nb.shape[0]} neighbours but {s.shape[0]} similarities")
    if not (np.isfinite(q).all() and np.isfinite(nb).all()):
        raise InputError("query expansion got non-finite vectors")
    return q, nb, s


_FORMULAS = {
    "aqe": "q^ = norm(q + sum_i d_i)",
    "aqewd": "q^ = norm(q + sum_i (n-i+1)/n d_i)",
    "alpha-qe": "q^ = norm(q + sum_i max(s_i,0)^alpha d_i)",
}


class BaselineExpander(Expander):
    """One of AQE / AQEwD / alpha-QE applied to one query."""

    def __init__(self, method: str, alpha: float = DEFAULT_ALPHA):
        if method not in BASELINES:
            raise InputError(f"unknown query expansion {method!r}; known: {', '.join(BASELINES)}")
        self.method = method
        self.alpha = float(alpha)
        self.name = method
        self.label = {"aqe": "AQE", "aqewd": "AQEwD", "alpha-qe": f"alpha-QE (alpha={self.alpha:g})"}[method]

    def expand(self, query, neighbours, sims, text=None) -> Expansion:  # the text is not read
        q, nb, s = check_inputs(query, neighbours, sims)
        w = baseline_weights(self.method, s, self.alpha)
        vec = combine(q[None], nb[None], w[None])[0]
        return Expansion(
            vector=vec,
            weights=w,
            explanation={
                "method": self.method,
                "label": self.label,
                "formula": _FORMULAS[self.method],
                "query_weight": 1.0,
                "n": int(nb.shape[0]),
                "weights": [float(x) for x in w],
            },
        )


def _factory(method: str):
    def make(embed_dim=None, checkpoint_dir=None, fingerprint=None, alpha: float = DEFAULT_ALPHA, **_):
        return BaselineExpander(method, alpha=alpha)

    make.__doc__ = f"Build the {method} expander (needs no checkpoint)."
    return make


for _m in BASELINES:
    EXPANDERS.register(_m)(_factory(_m))
