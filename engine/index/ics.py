"""ICS hashing: Instance-weighted Central Similarity for multi-label retrieval, from the method's equations.

A small hash head ``f`` maps a frozen backbone embedding ``x`` to ``K`` real outputs; training uses the
relaxed code ``h = tanh(f(x))`` in (-1, 1)^K and inference the bits ``b = sign(f(x))``.

Hash centres ``c_j in {-1, +1}^K`` (one per label, fixed before training, :func:`hash_centres`):
rows of a Sylvester Hadamard matrix ``H_K`` when the number of labels ``M <= K``, rows of
``[H_K; -H_K]`` when ``K < M <= 2K``, otherwise (or when ``K`` is not a power of two) i.i.d.
Bernoulli(0.5) bits.

For image ``i`` with labels ``j in L_i`` (``c_i = |L_i|``):

* distance (binary cross-entropy form, averaged over bits)::

      d_ij = -(1/K) sum_k [ (1 + c_jk)/2 log((1 + h_ik)/2) + (1 - c_jk)/2 log((1 - h_ik)/2) ]

  which is 0 when ``h_i = c_j`` and grows as the code leaves the centre;
* likelihood of belonging to centre ``j`` with bandwidth ``beta <= 1`` (sigmoid form, ``p(0) = 1``)::

      p(d) = 2 / (1 + exp(d / beta)),   -log p(d) = softplus(d / beta) - log 2   (>= 0);

* centre weights ``w_i`` on the probability simplex over ``L_i``; per image objective::

      J_i(w) = lambda * sum_j w_ij * l_ij  +  sum_j w_ij log w_ij,    l_ij = -log p(d_ij)

  i.e. the weighted central similarity loss plus a maximum-entropy regulariser (negative Shannon
  entropy) whose strength relative to the loss is ``1 / lambda``.  ``lambda`` is the *sharpness*: a
  small ``lambda`` keeps the weights near uniform and a large one moves all weight to the nearest
  centre (the minimiser is ``softmax(-lambda * l_i)`` restricted to ``L_i``, used in the tests).
  Scaling the data term rather than the entropy keeps the fixed PGD step useful at both ends;
* quantisation loss (as in central similarity quantisation), ``gamma = 0.05``::

      Q_i = (1/K) sum_k log cosh(|h_ik| - 1).

* neighbour term (our addition for the product, weight ``mu``, default 1; 0 = the paper's objective):
  central similarity pulls every image of a label onto the same code, so a class of thousands of
  gallery images becomes one Hamming bucket and a candidate stage that must hold the exact float
  nearest neighbours fails. Within each batch the term matches the code similarity ranking to the
  embedding one, a KL divergence between two softmax neighbour distributions per anchor ``i``::

      P_ij = softmax_j(s_ij / tau),  s_ij = cos(x_i - m, x_j - m)  (m = training mean)
      Q_ij = softmax_j(h_i . h_j / (K tau)),  j != i,   N_i = KL(P_i || Q_i)

Alternating optimisation (:func:`train_ics`): with ``f`` frozen every ``w_i`` is updated by projected
gradient descent (step 0.1, Euclidean projection onto the simplex by the sort-based algorithm,
:func:`project_simplex`, about 10 iterations, :func:`pgd_weights`); then ``f`` is trained for an epoch
with ``w`` fixed on ``mean_i [sum_j w_ij l_ij] + gamma * mean_i Q_i + mu * mean_i N_i``.

The module also holds the comparison hashers (random-projection LSH, ITQ-style PCA hashing), the
retrieval metrics (mAP@N under Hamming ranking, recall of Hamming + re-rank against exact search) and
the checkpoint format (``ics-<K>-<backbone slug>.safetensors`` + ``.json`` sidecar with config and backbone fingerprint).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..errors import CheckpointError, InputError
from ..checkpoints import require_backbone
from ..fileio import atomic_write_bytes as _atomic_write

SUPPORTED_BITS = (16, 32, 64, 128)


# -- hash centres --------------------------------------------------------------------------------
def is_power_of_two(n: int) -> bool:
    return n >= 1 and (n & (n - 1)) == 0


def hadamard(k: int) -> np.ndarray:
    """Sylvester's construction: ``H_1 = [1]``, ``H_2n = [[H, H], [H, -H]]``; (k, k) int8 of +-1."""
    if not is_power_of_two(k):
        raise InputError(f"a Sylvester Hadamard matrix needs a power of two, got {k}")
    h = np.ones((1, 1), dtype=np.int8)
    while h.shape[0] < k:
        h = np.block([[h, h], [h, -h]]).astype(np.int8)
    return h


def hash_centres(num_labels: int, bits: int, seed: int = 0) -> Tuple[np.ndarray, str]:
    """(num_labels, bits) float32 centres in {-1, +1} and the strategy used.

    ``hadamard``: distinct rows of ``H_K`` (M <= K); ``hadamard2``: distinct rows of ``[H_K; -H_K]``
    (K < M <= 2K); ``bernoulli``: i.i.d. fair bits otherwise or when K is not a power of two.
    Balanced rows (as many +1 as -1) are preferred: the all-ones row of ``H_K`` (and its negation)
    is only used when every other row is already taken.
    """
    if num_labels < 1:
        raise InputError("hash centres need at least one label")
    if bits < 1:
        raise InputError(f"the code length must be positive, got {bits}")
    rng = np.random.default_rng(seed)
    if is_power_of_two(bits) and num_labels <= 2 * bits:
        h = hadamard(bits).astype(np.float32)
        if num_labels <= bits:
            pool, strategy = h, "hadamard"
        else:
            pool, strategy = np.concatenate([h, -h]), "hadamard2"
        balanced = np.flatnonzero(pool.sum(1) == 0)
        unbalanced = np.setdiff1d(np.arange(len(pool)), balanced)
        order = np.concatenate([rng.permutation(balanced), rng.permutation(unbalanced)])
        rows = rng.permutation(order[:num_labels])
        return pool[rows].copy(), strategy
    centres = np.where(rng.random((num_labels, bits)) < 0.5, -1.0, 1.0).astype(np.float32)
    return centres, "bernoulli"


# -- simplex projection and centre weights --------------------------------------------------------
def project_simplex(v: torch.Tensor, mask: Optional[torch.Tensor] = None, radius=1.0) -> torch.Tensor:
    """Euclidean projection of each row of ``v`` onto ``{w >= 0, sum w = radius}`` (sort-based).

    With ``mask`` (bool, same shape) only the masked coordinates are free; the others are 0. Sort the
    free coordinates descending (``u``), find the largest ``rho`` with
    ``u_rho - (sum_{r<=rho} u_r - radius) / rho > 0``, shift by ``theta = (sum_{r<=rho} u_r - radius)/rho``
    and clip at 0. Rows without any free coordinate come back as zeros. ``radius`` may be a (B, 1)
    tensor (one radius per row).
    """
    v = torch.as_tensor(v)
    squeeze = v.dim() == 1
    if squeeze:
        v = v[None]
        mask = None if mask is None else torch.as_tensor(mask)[None]
    if mask is None:
        mask = torch.ones_like(v, dtype=torch.bool)
    mask = mask.to(torch.bool)
    if isinstance(radius, torch.Tensor):
        radius = radius.to(v.dtype).reshape(-1, 1)
    big = torch.finfo(v.dtype).max / 4
    vm = torch.where(mask, v, torch.full_like(v, -big))
    u, _ = torch.sort(vm, dim=1, descending=True)
    free = mask.sum(1, keepdim=True)
    u = torch.where(torch.arange(v.shape[1], device=v.device)[None] < free, u, torch.zeros_like(u))
    css = torch.cumsum(u, dim=1) - radius
    ranks = torch.arange(1, v.shape[1] + 1, device=v.device, dtype=v.dtype)[None]
    cond = (u - css / ranks > 0) & (ranks <= free)
    rho = cond.to(v.dtype).cumsum(1).argmax(1, keepdim=True)  # last True (cond is a prefix)
    theta = css.gather(1, rho) / (rho + 1).to(v.dtype)
    w = torch.clamp(v - theta, min=0) * mask
    w = torch.where(free > 0, w, torch.zeros_like(w))
    return w[0] if squeeze else w


def code_distance(h: torch.Tensor, centres: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(B, K) relaxed codes, (M, K) centres in {-1, 1} -> (B, M) BCE distances averaged over bits."""
    p = ((h + 1) / 2).clamp(eps, 1 - eps)
    t = (centres.to(h.dtype) + 1) / 2
    return -(torch.log(p) @ t.T + torch.log1p(-p) @ (1 - t).T) / h.shape[1]


def neg_log_likelihood(d: torch.Tensor, beta: float) -> torch.Tensor:
    """``-log p(d)`` with ``p(d) = 2 / (1 + exp(d / beta))``: 0 at d = 0, increasing, ~d/beta for large d."""
    return F.softplus(d / beta) - math.log(2.0)


def weight_objective(w: torch.Tensor, losses: torch.Tensor, mask: torch.Tensor, lam: float) -> torch.Tensor:
    """Per-row ``lam * sum_j w_j l_j + sum_j w_j log w_j`` over the masked (label) coordinates."""
    w = w * mask
    wlogw = torch.where(w > 0, w * torch.log(w.clamp_min(1e-30)), torch.zeros_like(w))
    return lam * (w * torch.where(mask, losses, torch.zeros_like(losses))).sum(1) + wlogw.sum(1)


def uniform_weights(mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(torch.float32)
    return mask / mask.sum(1, keepdim=True).clamp_min(1)


def pgd_weights(
    losses: torch.Tensor,
    mask: torch.Tensor,
    lam: float,
    w0: Optional[torch.Tensor] = None,
    steps: int = 10,
    lr: float = 0.1,
    max_halvings: int = 20,
    floor: float = 1e-6,
    history: Optional[List[torch.Tensor]] = None,
) -> torch.Tensor:
    """Minimise :func:`weight_objective` over the simplex on each row's labels by projected gradient descent.

    ``w <- P(w - lr * grad J(w))`` with ``grad J = lam * l + log w + 1``. The entropy gradient is
    unbounded at 0, so the iterates live on the slightly shrunk simplex ``{w_j >= floor, sum w = 1}``
    (the optimum ``softmax(-lam l)`` is strictly positive anyway); its Euclidean projection is
    ``floor + P_r(v - floor)`` with ``P_r`` the sort-based projection onto the simplex of radius
    ``r = 1 - c_i * floor``. A row whose step would raise its objective halves its own step until it
    does not (at most ``max_halvings`` times, else the row keeps its weights and stops): the
    objective never increases. ``history`` (if a list) receives the (B,) objective before the first
    and after every step.
    """
    mask = mask.to(torch.bool)
    losses = losses.detach().to(torch.float64)
    count = mask.sum(1, keepdim=True).to(torch.float64)
    floor = min(float(floor), 0.5 / max(float(count.max()), 1.0))
    radius = (1 - count * floor).clamp_min(0)

    def proj(v, rows):
        return (project_simplex(v - floor, mask[rows], radius[rows]) + floor) * mask[rows]

    all_rows = torch.ones(mask.shape[0], dtype=torch.bool)
    w = uniform_weights(mask).to(torch.float64) if w0 is None else proj(w0.to(torch.float64), all_rows)
    obj = weight_objective(w, losses, mask, lam)
    if history is not None:
        history.append(obj.clone())
    active = torch.ones(w.shape[0], dtype=torch.bool)  # rows still moving
    for _ in range(steps):
        grad = lam * losses + torch.log(w.clamp_min(floor)) + 1.0
        step = torch.full((w.shape[0], 1), float(lr), dtype=w.dtype)
        todo = active.clone()
        new_w, new_obj = w.clone(), obj.clone()
        for _ in range(max_halvings):
            cand = proj(w[todo] - step[todo] * grad[todo], todo)
            cobj = weight_objective(cand, losses[todo], mask[todo], lam)
            ok = cobj <= obj[todo] + 1e-12
            idx = torch.nonzero(todo).flatten()
            new_w[idx[ok]] = cand[ok]
            new_obj[idx[ok]] = cobj[ok]
            todo[idx[ok]] = False
            if not bool(todo.any()):
                break
            step[todo] = step[todo] / 2
        active &= ~todo  # no step lowered the objective: the row has converged
        w, obj = new_w, new_obj
        if history is not None:
            history.append(obj.clone())
    return w.to(torch.float32)


# -- the hash head and its training --------------------------------------------------------------
@dataclass
class ICSConfig:
    """Everything needed to rebuild and retrain the model (stored with each checkpoint)."""

    dim: int = 512  # backbone embedding size
    bits: int = 64
    num_labels: int = 1
    hidden: int = 1024  # 0 = a single linear layer
    dropout: float = 0.1
    beta: float = 0.5  # bandwidth of the likelihood (<= 1)
    lam: float = 2.0  # sharpness of the centre weights (regulariser strength 1/lam)
    gamma: float = 0.05  # quantisation loss weight
    epochs: int = 100
    batch_size: int = 256
    lr: float = 1e-3
    weight_decay: float = 1e-5
    pgd_steps: int = 10
    pgd_lr: float = 0.1
    seed: int = 0
    neighbour_weight: float = 1.0  # mu: weight of the neighbour-ranking term (0 = central similarity only)
    neighbour_tau: float = 0.05  # temperature of both neighbour distributions
    centre_strategy: str = ""  # filled in by training

    @classmethod
    def from_dict(cls, d: dict) -> "ICSConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def validate(self) -> None:
        if self.bits < 1 or self.dim < 1 or self.num_labels < 1:
            raise InputError(f"invalid ICS sizes: dim={self.dim}, bits={self.bits}, labels={self.num_labels}")
        if not 0 < self.beta <= 1:
            raise InputError(f"beta must be in (0, 1], got {self.beta}")
        if self.lam <= 0:
            raise InputError(f"lambda must be positive, got {self.lam}")
        if self.bits % 8:
            raise InputError(f"the code length must be a multiple of 8 bits, got {self.bits}")
        if self.neighbour_weight < 0 or self.neighbour_tau <= 0:
            raise InputError(f"need neighbour_weight >= 0 and neighbour_tau > 0, got "
                             f"{self.neighbour_weight}, {self.neighbour_tau}")


class HashHead(nn.Module):
    """Frozen-embedding -> K real outputs (MLP with one hidden layer, or linear when hidden = 0)."""

    def __init__(self, dim: int, bits: int, hidden: int = 1024, dropout: float = 0.1):
        super().__init__()
        if hidden > 0:
            self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, bits))
        else:
            self.net = nn.Sequential(nn.Linear(dim, bits))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def pack_bits(positive: np.ndarray) -> np.ndarray:
    """(N, K) bool (bit = 1 where the output is >= 0) -> (N, K/8) uint8, the FAISS binary code layout."""
    positive = np.ascontiguousarray(positive, dtype=bool)
    if positive.shape[1] % 8:
        raise InputError(f"binary codes need a multiple of 8 bits, got {positive.shape[1]}")
    return np.packbits(positive, axis=1, bitorder="little")


def unpack_signs(codes: np.ndarray, bits: int) -> np.ndarray:
    """(N, K/8) uint8 -> (N, K) float32 in {-1, +1}."""
    b = np.unpackbits(np.ascontiguousarray(codes, dtype=np.uint8), axis=1, bitorder="little")[:, :bits]
    return b.astype(np.float32) * 2 - 1


class Hasher:
    """Anything that turns float vectors (N, D) into packed binary codes (N, bits/8)."""

    name = "hasher"
    bits: int
    dim: int

    def encode(self, vectors: np.ndarray) -> np.ndarray:
        raise NotImplementedError  # each hasher defines its own projection

    def identity(self) -> str:
        """Short hash of the hasher's parameters: codes made by another identity are stale."""
        return self.name


class ICSModel(Hasher):
    """A trained hash head plus its centres and config; the code of an item is ``sign(f(x))``, K bits."""

    name = "ics"

    def __init__(self, config: ICSConfig, head: HashHead, centres: np.ndarray, fingerprint: str = "",
                 record: Optional[dict] = None):
        self.config = config
        self.head = head.eval()
        self.centres = np.asarray(centres, dtype=np.float32)
        self.fingerprint = fingerprint
        self.record = record or {}
        self.bits, self.dim = config.bits, config.dim

    @torch.no_grad()
    def outputs(self, vectors: np.ndarray, batch: int = 65536) -> np.ndarray:
        """Raw head outputs (N, K) float32 (sign = bit, tanh = relaxed code)."""
        x = np.asarray(vectors, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise InputError(f"the ICS hash head expects vectors of size {self.dim}, got shape {x.shape}")
        self.head.eval()
        out = [self.head(torch.from_numpy(np.ascontiguousarray(x[i:i + batch]))).numpy()
               for i in range(0, len(x), batch)]
        return np.concatenate(out) if out else np.zeros((0, self.bits), np.float32)

    def encode(self, vectors: np.ndarray) -> np.ndarray:
        return pack_bits(self.outputs(vectors) >= 0)

    def identity(self) -> str:
        h = hashlib.sha256()
        for k, v in sorted(self.head.state_dict().items()):
            h.update(k.encode())
            h.update(v.detach().cpu().contiguous().numpy().tobytes())
        return "ics-" + h.hexdigest()[:16]


def labels_to_matrix(labels: Sequence[Sequence[int]], num_labels: Optional[int] = None) -> np.ndarray:
    """Lists of label ids -> (N, M) bool multi-hot matrix."""
    m = num_labels if num_labels is not None else 1 + max((max(ls) for ls in labels if len(ls)), default=-1)
    out = np.zeros((len(labels), max(m, 1)), dtype=bool)
    for i, ls in enumerate(labels):
        if len(ls):
            out[i, list(ls)] = True
    return out


def _check_training_arrays(embeddings: np.ndarray, labels: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    x = np.asarray(embeddings, dtype=np.float32)
    y = np.asarray(labels)
    if y.ndim == 1:  # single-label ids -> one-hot (the c_i = 1 case)
        y = labels_to_matrix([[int(v)] for v in y])
    y = y.astype(bool)
    if x.ndim != 2 or y.ndim != 2 or len(x) != len(y):
        raise InputError(f"embeddings {x.shape} and labels {y.shape} do not line up")
    if len(x) < 2:
        raise InputError("ICS training needs at least two labelled embeddings")
    if not np.isfinite(x).all():
        raise InputError("the training embeddings hold non-finite values")
    keep = y.any(1)
    if not keep.any():
        raise InputError("no training item has a label")
    return x[keep], y[keep]


def relaxed_losses(h: torch.Tensor, centres: torch.Tensor, cfg: ICSConfig) -> Tuple[torch.Tensor, torch.Tensor]:
    """(B, M) per-centre losses ``l_ij = -log p(d_ij)`` and (B,) quantisation losses of relaxed codes ``h``."""
    ell = neg_log_likelihood(code_distance(h, centres), cfg.beta)
    quant = torch.log(torch.cosh(h.abs() - 1)).mean(1)
    return ell, quant


def neighbour_loss(targets: torch.Tensor, h: torch.Tensor, tau: float) -> torch.Tensor:
    """Mean over anchors of ``KL(P_i || Q_i)``: ``P_i`` = softmax over the other batch items of the
    target similarities ``targets`` (B, B) / tau, ``Q_i`` = the same of the relaxed code similarities
    ``h_i . h_j / K``. Zero when the two similarity rows agree up to a constant per row."""
    b, k = h.shape
    if b < 2:
        return h.sum() * 0.0
    off = ~torch.eye(b, dtype=torch.bool, device=h.device)
    t = targets[off].view(b, b - 1) / tau
    c = (h @ h.T)[off].view(b, b - 1) / (k * tau)
    p = F.softmax(t, dim=1)
    return (p * (F.log_softmax(t, dim=1) - F.log_softmax(c, dim=1))).sum(1).mean()


def train_ics(
    embeddings: np.ndarray,
    labels: np.ndarray,
    config: Optional[ICSConfig] = None,
    progress: bool = True,
    device: str = "cpu",
) -> ICSModel:
    """Alternating optimisation of the centre weights (PGD, head frozen) and the hash head (weights fixed).

    ``labels``: (N, M) multi-hot bool, or (N,) integer class ids (single-label). Items without any
    label are dropped. The returned model's ``record['history']`` holds per-epoch losses.
    """
    from tqdm.auto import tqdm

    x_np, y_np = _check_training_arrays(embeddings, labels)
    cfg = ICSConfig(**asdict(config)) if config is not None else ICSConfig()
    cfg.dim, cfg.num_labels = int(x_np.shape[1]), int(y_np.shape[1])
    cfg.validate()
    torch.manual_seed(cfg.seed)
    centres_np, cfg.centre_strategy = hash_centres(cfg.num_labels, cfg.bits, cfg.seed)
    head = HashHead(cfg.dim, cfg.bits, cfg.hidden, cfg.dropout).to(device)
    centres = torch.from_numpy(centres_np).to(device)
    x = torch.from_numpy(x_np).to(device)
    mask = torch.from_numpy(y_np).to(device)
    w = uniform_weights(mask).to(device)
    mean = x.mean(0)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    n = len(x)
    history = []
    bar = tqdm(range(cfg.epochs), desc=f"ICS-{cfg.bits}", disable=not progress)
    for epoch in bar:
        # (1) centre weights with f frozen
        head.eval()
        with torch.no_grad():
            ell = torch.cat([relaxed_losses(torch.tanh(head(x[i:i + 8192])), centres, cfg)[0]
                             for i in range(0, n, 8192)])
        before = weight_objective(w.double(), ell.double(), mask, cfg.lam).mean().item()
        w = pgd_weights(ell.cpu(), mask.cpu(), cfg.lam, w0=w.cpu(), steps=cfg.pgd_steps, lr=cfg.pgd_lr).to(device)
        after = weight_objective(w.double(), ell.double(), mask, cfg.lam).mean().item()
        # (2) the head with w fixed
        head.train()
        perm = torch.randperm(n, generator=gen).to(device)
        total, total_q, total_n, batches = 0.0, 0.0, 0.0, 0
        for i in range(0, n, cfg.batch_size):
            idx = perm[i:i + cfg.batch_size]
            h = torch.tanh(head(x[idx]))
            ell_b, quant = relaxed_losses(h, centres, cfg)
            central = (w[idx] * ell_b).sum(1).mean()
            loss = central + cfg.gamma * quant.mean()
            if cfg.neighbour_weight > 0:
                xc = F.normalize(x[idx] - mean, dim=1)
                neigh = neighbour_loss(xc @ xc.T, h, cfg.neighbour_tau)
                loss = loss + cfg.neighbour_weight * neigh
                total_n += neigh.item()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += central.item()
            total_q += quant.mean().item()
            batches += 1
        wm = w[mask.sum(1) > 1]
        max_w = float(wm.max(1).values.mean()) if len(wm) else 1.0
        history.append({"epoch": epoch + 1, "central": total / batches, "quant": total_q / batches,
                        "neighbour": total_n / batches,
                        "weight_objective_before": before, "weight_objective_after": after,
                        "mean_max_weight_multilabel": max_w})
        bar.set_postfix(central=f"{total / batches:.4f}", quant=f"{total_q / batches:.4f}",
                        neighbour=f"{total_n / batches:.4f}")
    head.eval()
    record = {"history": history, "train_items": int(n)}
    return ICSModel(cfg, head.cpu(), centres_np, record=record)


# -- checkpoints ---------------------------------------------------------------------------------
def checkpoint_path(checkpoint_dir, bits: int, fingerprint: Optional[str] = None) -> Path:
    """``ics-<K>-<backbone slug>.safetensors`` (the checkpoint layer's naming; plain ``ics-<K>`` without a
    fingerprint)."""
    from ..checkpoints import file_name

    name = file_name(f"ics-{int(bits)}", fingerprint) if fingerprint else f"ics-{int(bits)}.safetensors"
    return Path(checkpoint_dir) / name




def save_ics(model: ICSModel, path, fingerprint: str, extra: Optional[dict] = None) -> Path:
    """Write ``path`` (.safetensors: head weights + centres) and its ``.json`` sidecar, both atomically."""
    from safetensors.torch import save

    path = Path(path).with_suffix(".safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {f"head.{k}": v.detach().cpu().contiguous() for k, v in model.head.state_dict().items()}
    state["centres"] = torch.from_numpy(np.ascontiguousarray(model.centres))
    config = asdict(model.config)
    meta = {"kind": "ics", "fingerprint": fingerprint, "config": json.dumps(config)}
    _atomic_write(path, save(state, metadata=meta))
    record = {"kind": "ics", "fingerprint": fingerprint, "bits": model.bits, "embed_dim": model.dim,
              "config": config, "weights": path.name, **model.record, **(extra or {})}
    _atomic_write(path.with_suffix(".json"), json.dumps(record, indent=1).encode())
    model.fingerprint = fingerprint
    return path


def load_ics(path, fingerprint: Optional[str] = None, dim: Optional[int] = None) -> ICSModel:
    """Load an ICS checkpoint (either file of the pair); CheckpointError names the file on any problem."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(path).with_suffix(".safetensors")
    if not path.is_file():
        raise CheckpointError(
            f"no ICS checkpoint {path.name} in {path.parent}; train one with "
            f"`python -m engine train ics --bits {path.stem.split('-')[-1]}` (see docs/ics.md)"
        )
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        if meta.get("kind") != "ics":
            raise ValueError("not an ICS checkpoint")
        raw_config = json.loads(meta["config"])
        if raw_config.get("locality_bits"):
            raise ValueError("made by an older version that appended ITQ bits; retrain it")
        config = ICSConfig.from_dict(raw_config)
        state = load_file(str(path))
    except Exception as exc:  # damaged, truncated or foreign file
        raise CheckpointError(f"{path.name}: unreadable ICS checkpoint ({exc})") from None
    stored_fp = meta.get("fingerprint", "")
    require_backbone(path, stored_fp, fingerprint, f"python -m engine train ics --bits {config.bits}")
    if dim is not None and int(config.dim) != int(dim):
        raise CheckpointError(f"{path.name} expects {config.dim}-d embeddings, the index has {dim}-d")
    try:
        head = HashHead(config.dim, config.bits, config.hidden, config.dropout)
        head.load_state_dict({k[5:]: v for k, v in state.items() if k.startswith("head.")}, strict=True)
        centres = state["centres"].numpy()
        model = ICSModel(config, head, centres, fingerprint=stored_fp)
    except Exception as exc:
        raise CheckpointError(f"{path.name}: ICS weights do not match its config ({exc})") from None
    record = {}
    side = path.with_suffix(".json")
    if side.is_file():
        try:
            record = json.loads(side.read_text())
        except (OSError, ValueError):
            record = {}
    model.record = record
    return model


# -- comparison hashers --------------------------------------------------------------------------
class LSHHasher(Hasher):
    """Sign of random Gaussian projections (SimHash): data-independent, untrained."""

    name = "lsh"

    def __init__(self, dim: int, bits: int, seed: int = 0):
        self.dim, self.bits, self.seed = dim, bits, seed
        self.projection = np.random.default_rng(seed).standard_normal((dim, bits)).astype(np.float32)

    def encode(self, vectors):
        return pack_bits(np.asarray(vectors, dtype=np.float32) @ self.projection >= 0)

    def identity(self):
        return f"lsh-{self.dim}-{self.bits}-{self.seed}"


class ITQHasher(Hasher):
    """ITQ-style PCA hashing: centre, project on the top-K principal axes, learn a rotation R that
    minimises ``||B - V R||_F`` by alternating ``B = sign(V R)`` and ``R = U W^T`` from the SVD
    ``V^T B = U S W^T`` (orthogonal Procrustes)."""

    name = "itq"

    def __init__(self, train: np.ndarray, bits: int, iterations: int = 50, seed: int = 0):
        x = np.asarray(train, dtype=np.float64)
        if bits > x.shape[1]:
            raise InputError(f"ITQ needs bits <= embedding size ({x.shape[1]}), got {bits}")
        self.dim, self.bits = x.shape[1], bits
        self.mean = x.mean(0)
        xc = x - self.mean
        _, _, vt = np.linalg.svd(xc, full_matrices=False)
        self.pca = vt[:bits].T
        v = xc @ self.pca
        rng = np.random.default_rng(seed)
        r, _ = np.linalg.qr(rng.standard_normal((bits, bits)))
        for _ in range(iterations):
            b = np.where(v @ r >= 0, 1.0, -1.0)
            u, _, wt = np.linalg.svd(v.T @ b)
            r = u @ wt
        self.rotation = r
        self.projection = (self.pca @ r).astype(np.float32)
        self.offset = (self.mean @ self.pca @ r).astype(np.float32)

    def encode(self, vectors):
        return pack_bits(np.asarray(vectors, dtype=np.float32) @ self.projection - self.offset >= 0)

    def identity(self):
        return "itq-" + hashlib.sha256(self.projection.tobytes()).hexdigest()[:16]


# -- metrics -------------------------------------------------------------------------------------
def hamming_distances(query_codes: np.ndarray, db_codes: np.ndarray, bits: int) -> np.ndarray:
    """(Q, N) Hamming distances via the +-1 identity ``ham = (K - <s_q, s_d>) / 2``."""
    sq, sd = unpack_signs(query_codes, bits), unpack_signs(db_codes, bits)
    return np.rint((bits - sq @ sd.T) / 2).astype(np.int32)


def average_precision_at(order: np.ndarray, relevant: np.ndarray, top: int) -> np.ndarray:
    """mAP@N pieces: ``order`` (Q, N) ranked db ids, ``relevant`` (Q, Ndb) bool -> (Q,) AP@top.

    ``AP@N = sum_{k<=N} P@k * rel_k / sum_{k<=N} rel_k`` (0 when nothing relevant is retrieved).
    """
    top = min(top, order.shape[1])
    rel = np.take_along_axis(relevant, order[:, :top], axis=1).astype(np.float64)
    hits = np.cumsum(rel, axis=1)
    prec = hits / np.arange(1, top + 1)[None]
    n_rel = rel.sum(1)
    return np.where(n_rel > 0, (prec * rel).sum(1) / np.maximum(n_rel, 1), 0.0)


def map_at_n(query_labels: np.ndarray, db_labels: np.ndarray, top: int, *, query_codes=None, db_codes=None,
             bits: int = 0, query_vectors=None, db_vectors=None, chunk: int = 256) -> float:
    """mAP@top: relevant = shares at least one label. Ranking by Hamming distance of the codes (ties by
    db order, stable) or, with ``query_vectors``/``db_vectors``, by inner product."""
    ql, dl = np.asarray(query_labels, bool), np.asarray(db_labels, bool)
    aps = []
    for s in range(0, len(ql), chunk):
        if query_vectors is not None:
            sim = np.asarray(query_vectors[s:s + chunk], np.float32) @ np.asarray(db_vectors, np.float32).T
            order = np.argsort(-sim, axis=1, kind="stable")
        else:
            dist = hamming_distances(query_codes[s:s + chunk], db_codes, bits)
            order = np.argsort(dist, axis=1, kind="stable")
        relevant = (ql[s:s + chunk].astype(np.float32) @ dl.T.astype(np.float32)) > 0
        aps.append(average_precision_at(order, relevant, top))
    return float(np.concatenate(aps).mean()) if aps else 0.0
