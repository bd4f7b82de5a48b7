"""Database-side augmentation (DBA): every gallery vector replaced by its own expansion.

Each gallery item ``x`` is treated as a query over the rest of the gallery: its top-k
neighbours (itself excluded) are found by exact inner product and ``x`` is replaced by the
expansion of the chosen method (ADBA = AQE, alpha-DBA = alpha-QE, LAttDBA = LAttQE model).
This is computed once at index time; the result is stored as a separate index variant.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch
from tqdm.auto import tqdm

from ..errors import InputError
from .base import l2n
from .baselines import BASELINES, DEFAULT_ALPHA, expand_batch
from .lattqe import expand_numpy, gallery_side

DBA_METHODS = BASELINES + ("lattqe",)


def knn(queries: np.ndarray, gallery: np.ndarray, k: int, self_ids: Optional[np.ndarray] = None,
        chunk: int = 1024) -> Tuple[np.ndarray, np.ndarray]:
    """Exact top-k by inner product: (scores (Q, k), ids (Q, k)), best first.

    ``self_ids[j]`` (if given) is the gallery id of query j, excluded from its results.
    """
    g = torch.as_tensor(np.ascontiguousarray(gallery, dtype=np.float32))
    k = int(min(k, g.shape[0] - (1 if self_ids is not None else 0)))
    scores, ids = [], []
    for s in range(0, len(queries), chunk):
        q = torch.as_tensor(np.ascontiguousarray(queries[s:s + chunk], dtype=np.float32))
        sim = q @ g.T
        if self_ids is not None:
            rows = torch.arange(sim.shape[0])
            sim[rows, torch.as_tensor(self_ids[s:s + chunk], dtype=torch.long)] = -float("inf")
        v, i = torch.topk(sim, k, dim=1)
        scores.append(v.numpy())
        ids.append(i.numpy())
    return np.concatenate(scores), np.concatenate(ids)


def dba_vectors(embeddings: np.ndarray, method: str, k: int, alpha: float = DEFAULT_ALPHA,
                model=None, batch: int = 512, progress: bool = True) -> np.ndarray:
    """(N, D) L2-normalised gallery -> (N, D) augmented gallery (each row its own expansion).

    ``method`` is one of aqe, aqewd, alpha-qe, lattqe (LAttDBA: needs ``model``, an
    :class:`engine.expand.lattqe.LAttQEModel` of matching width).
    """
    x = np.asarray(embeddings, dtype=np.float32)
    if x.ndim != 2 or len(x) == 0:
        raise InputError(f"DBA needs a non-empty (N, D) array; got shape {x.shape}")
    if method not in DBA_METHODS:
        raise InputError(f"unknown DBA method {method!r}; known: {', '.join(DBA_METHODS)}")
    if method == "lattqe":
        if model is None:
            raise InputError("LAttDBA needs a trained LAttQE model")
        if model.config.dim != x.shape[1]:
            raise InputError(f"LAttQE model is {model.config.dim}-d but the gallery is {x.shape[1]}-d")
    k = int(min(k, len(x) - 1))
    if k <= 0:
        return l2n(x)
    out = np.empty_like(x)
    steps = range(0, len(x), batch)
    for s in tqdm(steps, desc=f"DBA ({method}, k={k})", disable=not progress, leave=False):
        ids_self = np.arange(s, min(s + batch, len(x)))
        sims, ids = knn(x[ids_self], x, k, self_ids=ids_self)
        if method == "lattqe":
            with gallery_side(model):
                out[ids_self] = expand_numpy(model, x[ids_self], x[ids])[0]
        else:
            out[ids_self] = expand_batch(method, x[ids_self], x[ids], sims, alpha)
    return out
