"""Hubness of a gallery under a set of queries: how unevenly the items appear in the queries' top K.

``N_K(x)`` is the number of queries whose top K hold item ``x`` (its K-occurrence). In a space without hubs
every item is found about equally often; a hub (one picture in the top 5 of unrelated queries) shows as a
long right tail. The figure reported is the skewness of ``N_K`` over the gallery,
``E[(N_K - mu)^3] / sigma^3`` (Radovanovic et al., 2010), and the largest ``N_K`` as a share of the queries.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np


def k_occurrence(scores: np.ndarray, k: int, exclude: Optional[Sequence[int]] = None) -> np.ndarray:
    """(G,) how many of the queries (rows of ``scores`` (Q, G)) have each gallery item in their top ``k``;
    ``exclude[i]``: a gallery column query i may not return (its reference; -1 for none)."""
    s = np.array(scores, dtype=np.float64, copy=True)
    if exclude is not None:
        rows = np.arange(len(s))
        cols = np.asarray(exclude)
        ok = cols >= 0
        s[rows[ok], cols[ok]] = -np.inf
    k = min(k, s.shape[1])
    top = np.argpartition(-s, k - 1, axis=1)[:, :k]
    return np.bincount(top.ravel(), minlength=s.shape[1])


def skewness(counts: np.ndarray) -> float:
    c = np.asarray(counts, dtype=np.float64)
    sd = c.std()
    return float(((c - c.mean()) ** 3).mean() / sd ** 3) if sd > 0 else 0.0


def hubness(scores: np.ndarray, k: int = 10, exclude: Optional[Sequence[int]] = None) -> Dict[str, float]:
    """{"skew": skewness of N_k, "max_share": largest N_k / queries, "k": k}."""
    counts = k_occurrence(scores, k, exclude)
    return {"skew": round(skewness(counts), 3), "max_share": round(float(counts.max()) / max(1, len(scores)), 3),
            "k": k}
