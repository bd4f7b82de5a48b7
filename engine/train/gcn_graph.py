"""Sparse correlation graph and GCN stream of RTIC (paper's Algorithm 1 and Sec. 3.3).

Graph construction for N training nodes (node i = training triplet (reference, text, target)):

1. correlation ``C_ij = cos(f_i, f_j)`` of the nodes' stage-1 target features ``f``;
2. binarise: ``A_ij = 1`` iff ``C_ij >= tau`` (i != j), with ``tau`` the k-th largest off-diagonal value,
   ``k = round(density * N * N)`` (capped at N(N-1)), i.e. every node keeps on average ``density * N``
   neighbours (15% by default). ``C`` is symmetric, so ``A`` is too. The diagonal is 1 (C_ii = 1);
   it is kept out of the neighbour count ``n_i`` and is part of the BCE targets;
3. re-weight: ``A'_ii = 1``, ``A'_ij = p * A_ij / n_i`` (p = 0.33);
4. symmetric normalisation: ``Â = D^-1/2 A' D^-1/2`` with ``D_ii = sum_j A'_ij`` (= 1 + p when n_i > 0).

``C`` is never held densely: it is computed in row blocks, twice (a histogram pass that brackets
``tau``, then a pass that keeps only the entries above the bracket), and the result is a CSR matrix
with int32 column indices and float32 values (8 bytes per edge). For FashionIQ (N ~ 18k, 15%) that
is ~49M edges, ~390 MB, instead of 1.3 GB for one dense float32 N x N matrix (and several of them
during a dense construction).
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class CorrelationGraph:
    """The binarised graph (CSR, diagonal included) and the normalised propagation matrix values.

    ``crow``/``col`` index the non-zeros of ``A + I``; ``values`` hold ``Â`` on the same pattern.
    """

    n: int
    crow: torch.Tensor  # (N + 1,) int64
    col: torch.Tensor  # (nnz,) int32 or int64
    values: torch.Tensor  # (nnz,) float32, Â
    tau: float
    degree: torch.Tensor  # (N,) neighbour counts n_i (self excluded)
    density: float
    p: float

    @property
    def nnz(self) -> int:
        return int(self.col.numel())

    @property
    def mean_degree(self) -> float:
        return float(self.degree.float().mean())

    def propagation(self) -> torch.Tensor:
        """Â as a torch sparse CSR tensor (shares storage)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            crow = self.crow.to(self.col.dtype)
            return torch.sparse_csr_tensor(crow, self.col, self.values, (self.n, self.n))

    def propagation_transposed(self) -> torch.Tensor:
        """Âᵀ as sparse CSR on the same pattern (A is symmetric): entry (i, j) holds Â_ji.

        Â_ij = (p / n_i) / (1 + p) off the diagonal, so Âᵀ only swaps n_i for n_j (4 bytes per edge).
        """
        rows = torch.repeat_interleave(torch.arange(self.n), self.crow[1:] - self.crow[:-1])
        cols = self.col.long()
        deg_c = self.degree[cols].to(torch.float32).clamp(min=1)
        vt = torch.where(rows == cols, self.values, self.p / deg_c / (1.0 + self.p))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.sparse_csr_tensor(self.crow.to(self.col.dtype), self.col, vt, (self.n, self.n))

    def binary_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Dense 0/1 rows of ``A + I`` for the given node ids: (len(rows), N) float32 (BCE targets)."""
        out = torch.zeros(len(rows), self.n)
        for r, i in enumerate(rows.tolist()):
            a, b = int(self.crow[i]), int(self.crow[i + 1])
            out[r, self.col[a:b].long()] = 1.0
        return out

    def to_dense(self) -> torch.Tensor:
        """Â densely (small graphs / tests only)."""
        return self.propagation().to_dense()

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.crow, self.col, self.values, self.degree))


def _k_edges(n: int, density: float) -> int:
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density}")
    return max(1, min(n * (n - 1), int(round(density * n * n))))


def _blocks(n: int, block: int) -> Iterable[slice]:
    for start in range(0, n, block):
        yield slice(start, min(n, start + block))


@torch.no_grad()
def _sim_block(f: torch.Tensor, sl: slice) -> torch.Tensor:
    """Cosines of rows ``sl`` against every node; the diagonal is marked 2.0 (cosines are <= 1)."""
    sim = f[sl] @ f.T
    idx = torch.arange(sl.start, sl.stop)
    sim[idx - sl.start, idx] = 2.0
    return sim


def _bracket(f: torch.Tensor, k: int, block: int, bins: int, bar) -> Tuple[float, float]:
    """Pass 1: a histogram of the off-diagonal similarities -> (lower, upper) bounds around the k-th largest."""
    lo_edge, hi_edge = -1.0 - 1e-3, 1.0 + 1e-3
    width = (hi_edge - lo_edge) / bins
    hist = torch.zeros(bins, dtype=torch.float64)
    for sl in _blocks(f.shape[0], block):
        hist += torch.histc(_sim_block(f, sl), bins=bins, min=lo_edge, max=hi_edge).double()  # 2.0 is out of range
        bar.update(1)
    above = torch.flip(torch.cumsum(torch.flip(hist, [0]), 0), [0])  # above[b] = count in bins >= b
    b = int((above >= k).nonzero().max())
    return lo_edge + (b - 2) * width, lo_edge + (b + 3) * width  # margins absorb rounding at the bin edges


def _candidates(f: torch.Tensor, k: int, block: int, bound: float, bound_hi: float, bar) -> Tuple[list, float]:
    """Pass 2: entries >= ``bound`` (diagonal included) as CSR pieces per block, and the exact threshold tau
    (the k-th largest off-diagonal similarity)."""
    pieces = []
    boundary: List[torch.Tensor] = []
    count_hi = 0
    for sl in _blocks(f.shape[0], block):
        sim = _sim_block(f, sl)
        keep = sim >= bound
        r, c = keep.nonzero(as_tuple=True)  # row-major: columns ascending within a row
        vals = sim[r, c]
        off = vals < 1.5
        count_hi += int((off & (vals >= bound_hi)).sum())
        boundary.append(vals[off & (vals < bound_hi)])
        pieces.append((sl, keep.sum(1), c.to(torch.int32), vals))
        del sim, keep, r
        bar.update(1)
    cand = torch.cat(boundary)
    if count_hi < k <= count_hi + cand.numel():
        tau = float(torch.kthvalue(-cand, k - count_hi).values.neg())
    else:  # histogram bracket missed (should not happen): exact selection over every kept value
        allv = torch.cat([v[v < 1.5] for _, _, _, v in pieces])
        tau = float(torch.kthvalue(-allv, k).values.neg())
    return pieces, tau


def _normalised(pieces: list, n: int, tau: float, p: float):
    """Pass 3: binarise (>= tau), re-weight, normalise, block by block in place of the candidates:
    Â_ii = 1 / d_i; Â_ij = (p / n_i) / sqrt(d_i d_j) = (p / n_i) / (1 + p) for an edge (both ends have n > 0).
    Returns (crow, col, values, degree)."""
    degree = torch.zeros(n, dtype=torch.int64)
    cols: List[torch.Tensor] = []
    values: List[torch.Tensor] = []
    for j, (sl, counts, c, vals) in enumerate(pieces):
        rows = torch.repeat_interleave(torch.arange(sl.start, sl.stop), counts)
        on = vals >= tau
        rows, c, vals = rows[on], c[on], vals[on]
        is_self = vals > 1.5
        deg = torch.bincount(rows - sl.start, minlength=sl.stop - sl.start) - 1
        degree[sl] = deg
        deg_r = deg[rows - sl.start].to(torch.float32)
        w = torch.where(is_self, 1.0 / torch.where(deg_r > 0, 1.0 + p, 1.0), p / deg_r.clamp(min=1) / (1.0 + p))
        cols.append(c)
        values.append(w.to(torch.float32))
        pieces[j] = None  # free the candidates of this block
    col = torch.cat(cols)
    del cols
    crow = torch.zeros(n + 1, dtype=torch.int64)
    crow[1:] = torch.cumsum(degree + 1, 0)
    if col.numel() >= 2**31 - 1:
        col = col.to(torch.int64)
    return crow, col, torch.cat(values), degree


def build_graph(
    features: torch.Tensor,
    density: float = 0.15,
    p: float = 0.33,
    block: int = 1024,
    bins: int = 4096,
    progress: bool = False,
) -> CorrelationGraph:
    """Builds the RTIC correlation graph from node features (N, D) (the stage-1 target features).

    Peak memory is about the final CSR (8 bytes per kept edge) plus one block of similarities.
    """
    f = F.normalize(features.detach().float().cpu(), dim=1)
    n = f.shape[0]
    if n < 2:
        raise ValueError("the graph needs at least 2 nodes")
    k = _k_edges(n, density)
    bar = _bar(progress, 2 * math.ceil(n / block), "graph")
    bound, bound_hi = _bracket(f, k, block, bins, bar)
    pieces, tau = _candidates(f, k, block, bound, bound_hi, bar)
    bar.close()
    crow, col, values, degree = _normalised(pieces, n, tau, p)
    return CorrelationGraph(n=n, crow=crow, col=col, values=values, tau=tau, degree=degree, density=density, p=p)


class _Propagate(torch.autograd.Function):
    """Y = Â X with the backward Âᵀ G done by a precomputed transposed CSR (no conversion per step)."""

    @staticmethod
    def forward(ctx, a_hat, a_hat_t, x):
        ctx.a_hat_t = a_hat_t
        return torch.sparse.mm(a_hat, x)

    @staticmethod
    def backward(ctx, grad):
        return None, None, torch.sparse.mm(ctx.a_hat_t, grad)


def propagate(a_hat: torch.Tensor, x: torch.Tensor, a_hat_t: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Â X (differentiable in X); pass Âᵀ to make the backward cheaper."""
    if a_hat_t is None:
        return torch.sparse.mm(a_hat, x)
    return _Propagate.apply(a_hat, a_hat_t, x)


class GCNStream(nn.Module):
    """Training-only stream: a second composer maps node features, GCN layers propagate over Â.

    ``W = Â ReLU(... ReLU(Â H W_1) ...) W_L`` with ``H = composer(node image, node text)``; logits for a
    batch are ``main_stream_outputs @ W.T`` (B, N), trained with BCE against the binarised graph rows.
    """

    def __init__(self, composer: nn.Module, dim: int, layers: int = 2):
        super().__init__()
        self.composer = composer
        self.layers = nn.ModuleList(nn.Linear(dim, dim, bias=False) for _ in range(max(1, layers)))

    def forward(
        self, node_image: torch.Tensor, node_text: torch.Tensor, a_hat: torch.Tensor,
        a_hat_t: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        h = self.composer(node_image, node_text)
        for i, layer in enumerate(self.layers):
            h = propagate(a_hat, layer(h), a_hat_t)
            if i + 1 < len(self.layers):
                h = F.relu(h)
        return h


def gcn_bce_loss(main_out: torch.Tensor, w: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """BCE between ``main_out @ W.T`` (B, N) and 0/1 graph rows (B, N)."""
    return F.binary_cross_entropy_with_logits(main_out @ w.T, targets)


def _status_kb(key: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Resets the kernel's peak-RSS counter of this process (Linux >= 4.0); False where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def measure_gcn_memory(
    sizes: Iterable[int] = (1000, 2000, 4000, 8000, 12000, 18000),
    dim: int = 512,
    density: float = 0.15,
    clusters: int = 40,
    seed: int = 0,
    progress: bool = True,
    on_row=None,
) -> List[Dict[str, float]]:
    """Memory of the GCN stage vs N on synthetic clustered features.

    For each N: builds the sparse graph and reports its exact tensor bytes, the dense alternative
    (one N x N float32), the activations of one GCN-stream step (composer outputs + 2 GCN layers,
    N x D float32 each, forward only), the measured peak RSS above the pre-build RSS during the
    construction (Linux: the peak counter is reset before each N; includes the block-wise similarity
    buffers and temporary index arrays) and the construction time.
    """
    out = []
    g = torch.Generator().manual_seed(seed)
    for n in sizes:
        centres = torch.randn(clusters, dim, generator=g)
        feats = centres[torch.randint(clusters, (n,), generator=g)] + 0.8 * torch.randn(n, dim, generator=g)
        base = _status_kb("VmRSS")
        can_reset = _reset_peak_rss()
        t0 = time.perf_counter()
        graph = build_graph(feats, density=density, progress=progress)
        seconds = time.perf_counter() - t0
        peak = _status_kb("VmHWM")
        row = {
            "N": n,
            "edges": graph.nnz,
            "mean_degree_fraction": graph.mean_degree / n,
            "graph_MB": graph.nbytes() / 2**20,
            "dense_matrix_MB": n * n * 4 / 2**20,
            "activations_MB": 3 * n * dim * 4 / 2**20,
            "build_peak_MB": (peak - base) / 1024 if (can_reset and peak and base) else float("nan"),
            "build_s": seconds,
        }
        out.append(row)
        if on_row is not None:
            on_row(row)
        del graph, feats
    return out


def _bar(enabled: bool, total: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, leave=False)
