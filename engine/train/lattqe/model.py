"""LAttQE training recipe and losses: :class:`TrainConfig`, the contrastive / ranking / weight losses and
the sampler of neighbours, positives and hard negatives."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch

from ...errors import InputError
from ...expand.dba import knn


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


class Sampler:
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
