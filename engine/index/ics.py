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

Alternating optimisation (:func:`engine.train.ics.train_ics`): with ``f`` frozen every ``w_i`` is updated by projected
gradient descent (step 0.1, Euclidean projection onto the simplex by the sort-based algorithm,
:func:`project_simplex`, about 10 iterations, :func:`pgd_weights`); then ``f`` is trained for an epoch
with ``w`` fixed on ``mean_i [sum_j w_ij l_ij] + gamma * mean_i Q_i + mu * mean_i N_i``.

This module holds the model, its losses, the codes and the checkpoint format (``ics-<K>-<backbone slug>.safetensors``
+ ``.json`` sidecar with config and backbone fingerprint). Training (PGD weights, :func:`train_ics`) lives in
:mod:`engine.train.ics`, the comparison hashers (LSH, ITQ) in :mod:`engine.index.ics_baselines` and the
Hamming-ranking metrics in :mod:`engine.eval.metrics`.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..checkpoints import file_name, load, make_record, part, write
from ..errors import CheckpointError, InputError

SUPPORTED_BITS = (16, 32, 64, 128)
SMALL_BATCH = 16  # query batches up to this many rows run the hash head without the nn.Module calls


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


# -- distance and likelihood to the hash centres ---------------------------------------------------
def code_distance(h: torch.Tensor, centres: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(B, K) relaxed codes, (M, K) centres in {-1, 1} -> (B, M) BCE distances averaged over bits."""
    p = ((h + 1) / 2).clamp(eps, 1 - eps)
    t = (centres.to(h.dtype) + 1) / 2
    return -(torch.log(p) @ t.T + torch.log1p(-p) @ (1 - t).T) / h.shape[1]


def neg_log_likelihood(d: torch.Tensor, beta: float) -> torch.Tensor:
    """``-log p(d)`` with ``p(d) = 2 / (1 + exp(d / beta))``: 0 at d = 0, increasing, ~d/beta for large d."""
    return F.softplus(d / beta) - math.log(2.0)



# -- the hash head --------------------------------------------------------------
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
        x = np.asarray(vectors, dtype=np.float32)
        if x.ndim == 2 and 0 < len(x) <= SMALL_BATCH and x.shape[1] == self.dim and not self.head.training:
            return pack_bits(self._small_outputs(x) >= 0)
        return pack_bits(self.outputs(x) >= 0)

    def _small_outputs(self, x: np.ndarray) -> np.ndarray:
        """``outputs`` for a few query rows without the module machinery: the same torch kernels (``F.linear``,
        ``relu``) called directly, in inference mode (dropout is the identity in eval). Calling the modules and
        the ``no_grad`` wrapper costs more than the maths for one query (0.17 vs 0.06 ms, one thread)."""
        with torch.inference_mode():
            t = torch.from_numpy(np.ascontiguousarray(x))
            for layer in self.head.net:
                if isinstance(layer, nn.Linear):
                    t = F.linear(t, layer.weight, layer.bias)
                elif not isinstance(layer, nn.Dropout):
                    t = layer(t)
            return t.numpy()

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


# -- checkpoints ---------------------------------------------------------------------------------
def checkpoint_path(checkpoint_dir, bits: int, fingerprint: Optional[str] = None) -> Path:
    """``ics-<K>-<backbone slug>.safetensors`` (the checkpoint layer's naming; plain ``ics-<K>`` without a
    fingerprint)."""
    name = file_name(f"ics-{int(bits)}", fingerprint) if fingerprint else f"ics-{int(bits)}.safetensors"
    return Path(checkpoint_dir) / name




def save_ics(model: ICSModel, path, fingerprint: str, extra: Optional[dict] = None) -> Path:
    """Writes the checkpoint (head weights + centres) in the one record format of :mod:`engine.checkpoints`
    (atomic, ``.json`` sidecar beside it)."""
    path = Path(path).with_suffix(".safetensors")
    state = {f"head.{k}": v for k, v in model.head.state_dict().items()}
    state["centres"] = torch.from_numpy(np.ascontiguousarray(model.centres))
    figures = {**model.record, **(extra or {})}
    for key in ("kind", "fingerprint", "config", "weights", "bits", "embed_dim"):
        figures.pop(key, None)
    recipe = figures.pop("recipe", None) or figures.pop("train", None)
    validation = figures.pop("validation", None)
    record = make_record("ics", fingerprint, asdict(model.config), recipe, validation, bits=model.bits,
                         embed_dim=model.dim, weights=path.name, **figures)
    write(path, state, record)
    model.fingerprint = fingerprint
    return path


def load_ics(path, fingerprint: Optional[str] = None, dim: Optional[int] = None) -> ICSModel:
    """Loads an ICS checkpoint (either file of the pair, any format) through :func:`engine.checkpoints.load`;
    CheckpointError names the file on any problem."""
    path = Path(path).with_suffix(".safetensors")
    if not path.is_file():
        raise CheckpointError(
            f"no ICS checkpoint {path.name} in {path.parent}; "
            f"{part('ics').train_hint(**({'bits': path.stem.split('-')[1]} if '-' in path.stem else {}))} (docs/ics.md)"
        )
    ck = load("ics", path, fingerprint=fingerprint, dim=dim)
    if ck.record["config"].get("locality_bits"):
        raise CheckpointError(f"{path.name}: made by an older version that appended ITQ bits; retrain it with "
                              f"`python -m engine train ics --bits {ck.record['config'].get('bits')}`")
    try:
        config = ICSConfig.from_dict(ck.record["config"])
        head = HashHead(config.dim, config.bits, config.hidden, config.dropout)
        head.load_state_dict({k[5:]: v for k, v in ck.tensors.items() if k.startswith("head.")}, strict=True)
        model = ICSModel(config, head, ck.tensors["centres"].numpy(), fingerprint=ck.record["backbone_fingerprint"])
    except Exception as exc:
        raise CheckpointError(f"{path.name}: ICS weights do not match its config ({exc})") from None
    model.record = ck.record
    return model
