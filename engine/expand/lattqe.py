"""LAttQE: learned attention-based query expansion (Gordo et al., ECCV 2020), from the paper's equations.

The query ``q`` and its top-k neighbours ``d_1..d_k`` (rank order) form a sequence of k + 1
tokens. A learnable positional encoding ``p_i`` is added to the i-th token (the query at
position 0) and a stack of transformer encoders (width = embedding size) transforms them into
``q~, d~_1..d~_k``. The neighbour weights are ``w_i = cos(q~, d~_i)`` and the expanded query is

    q^ = normalise(q + sum_i w_i d_i)

built from the ORIGINAL neighbours, so it stays in the gallery's embedding space.

Keeping the query. The paper's weights can be negative, and a model trained where most neighbours are
relevant expands every query, which lowers mAP where they are not. Checkpoints trained since
``weight_floor`` exists use ``w_i = max(0, cos - tau) / (1 - tau)``: training runs with ``tau = 0`` (no
negative weights), then ``tau`` is chosen on the validation classes (largest mAP at nQE 8 and 64; ties
go to the larger ``tau``); ``tau = 1`` keeps the query unchanged, so on validation LAttQE is never below
no expansion. ``weight_floor = None`` (older checkpoints) is the paper's raw cosine. A linear head
on ``d~_i`` predicts whether neighbour i is relevant (auxiliary BCE loss, training only, off by default). The
same model applied to gallery items gives LAttDBA (see :mod:`engine.expand.dba`).

Text-conditioned LAttQE (``config.text_token``, expander ``lattqe-text``): the query's modification text is a
second token, ``[q, t, d_1..d_k]``, marked by a learned type embedding; a query without a text leaves it out (masked),
so the same model expands image-only queries. Trained on composed queries (``python -m engine train lattqe
--composed``, :mod:`engine.train.lattqe.composed`). ``config.width`` projects the tokens to a smaller encoder width.
The ``lattqe`` expander only takes image-only checkpoints and ``lattqe-text`` only text ones (one part, one loader).

Checkpoints: the one record format of :mod:`engine.checkpoints` (``lattqe-<backbone>.safetensors`` with its
record in the metadata, ``.json`` sidecar beside it); files of the older format (record only in the sidecar)
are refused with the command that retrains them. :func:`load_lattqe` refuses a checkpoint made for another backbone fingerprint with a
:class:`~engine.errors.CheckpointError` naming the file.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from torch import nn

from ..errors import CheckpointError, InputError
from .base import EXPANDERS, Expander, ExpanderUnavailable, Expansion, l2n
from .baselines import check_inputs
from ..checkpoints import find, load, make_record, part, write


@dataclass
class LAttQEConfig:
    """Architecture of the model (stored in the checkpoint's JSON)."""

    dim: int
    layers: int = 3
    heads: int = 8
    ff_dim: int = 0  # 0 -> same as dim
    dropout: float = 0.1
    max_positions: int = 129  # query + up to 128 neighbours
    positional: bool = True
    trained_max_k: int = 64  # neighbours beyond this rank reuse the last trained position
    weight_floor: Optional[float] = None  # None: raw cosine weights; tau: max(0, cos - tau) / (1 - tau)
    dba_weight_floor: Optional[float] = None  # the floor when the model expands gallery items (LAttDBA)
    text_token: bool = False  # the query's modification text is a token of the sequence (text-conditioned LAttQE)
    width: int = 0  # 0: the encoder works at the embedding size; else every token is projected to this width

    def __post_init__(self):
        if self.width < 0:
            raise ValueError(f"width must be 0 (the embedding size) or more, got {self.width}")
        if (self.width or self.dim) % self.heads:
            raise ValueError(f"encoder width {self.width or self.dim} is not divisible by heads={self.heads}")
        for name in ("weight_floor", "dba_weight_floor"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= float(v) <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {v}")

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "LAttQEConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def floor_weights(cos: torch.Tensor, floor: Optional[float]) -> torch.Tensor:
    """Neighbour weights from cosines: unchanged for ``floor`` None, else ``max(0, cos - floor) / (1 - floor)``
    (all zero at ``floor`` 1: the query is kept)."""
    if floor is None:
        return cos
    if floor >= 1.0:
        return torch.zeros_like(cos)
    return torch.clamp(cos - floor, min=0.0) / (1.0 - floor)


class LAttQEModel(nn.Module):
    """Transformer encoder over [query, (text,) neighbours] giving per-neighbour weights.

    With ``config.text_token`` the second token is the query's modification text (its embedding, centred on
    the training texts' mean), marked by a learned type embedding instead of a position; a query without a text
    leaves that token out (padded), so the model still expands image-only queries. ``config.width`` > 0
    projects every token to that width first (a small encoder over large embeddings)."""

    def __init__(self, config: LAttQEConfig):
        super().__init__()
        self.config = config
        d = config.dim
        w = config.width or d
        self.scale = math.sqrt(d)  # unit-norm inputs -> entries of order 1
        self.pos = nn.Parameter(torch.randn(config.max_positions, w) * 0.1)
        # Fixed input centre (the training gallery's mean embedding; zeros = none). Embedding spaces
        # often share one dominant direction (all cosine similarities ~0.8); the encoder sees
        # normalise(x - centre) so that its tokens differ. The expansion itself uses the raw vectors.
        self.register_buffer("center", torch.zeros(d))
        if config.width:
            self.proj = nn.Linear(d, w, bias=False)
        if config.text_token:
            self.text_type = nn.Parameter(torch.randn(w) * 0.1)
            self.register_buffer("text_center", torch.zeros(d))  # the training texts' mean embedding
        layer = nn.TransformerEncoderLayer(
            d_model=w, nhead=config.heads, dim_feedforward=config.ff_dim or w,
            dropout=config.dropout, batch_first=True,
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=config.layers, enable_nested_tensor=False)
        self.head = nn.Linear(w, 1)  # relevance classifier, training only

    def _tokens(self, x: torch.Tensor, center: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.normalize(x - center, dim=-1, eps=1e-12) * self.scale
        return self.proj(x) if self.config.width else x

    def positions(self, k: int) -> torch.Tensor:
        idx = torch.arange(k + 1).clamp(max=min(self.config.trained_max_k, self.config.max_positions - 1))
        return self.pos[idx]

    def forward(
        self, query: torch.Tensor, neighbours: torch.Tensor, mask: Optional[torch.Tensor] = None,
        text: Optional[torch.Tensor] = None, text_mask: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """query (B, D), neighbours (B, k, D), mask (B, k) True = present; ``text`` (B, D) the modification
        texts' embeddings and ``text_mask`` (B,) True = the query has one (a text model only; ignored otherwise).

        Returns (weights (B, k), zero where masked; relevance logits (B, k)).
        """
        b, k, _ = neighbours.shape
        dev = neighbours.device
        x = self._tokens(torch.cat([query[:, None, :], neighbours], dim=1), self.center)
        if self.config.positional:
            x = x + self.positions(k)[None]
        present = torch.ones(b, k, dtype=torch.bool, device=dev) if mask is None else mask.bool()
        lead = [torch.ones(b, 1, dtype=torch.bool, device=dev)]  # the query is always there
        if self.config.text_token:
            if text is None:
                text, has = torch.zeros_like(query), torch.zeros(b, dtype=torch.bool, device=dev)
            else:
                has = torch.ones(b, dtype=torch.bool, device=dev) if text_mask is None else text_mask.bool()
            t = self._tokens(text, self.text_center) + self.text_type
            x = torch.cat([x[:, :1], t[:, None, :], x[:, 1:]], dim=1)
            lead.append(has[:, None])
        pad = None
        if mask is not None or len(lead) > 1:
            pad = ~torch.cat([*lead, present], dim=1)
        y = self.encoder(x, src_key_padding_mask=pad)
        qt, dt = y[:, 0], y[:, len(lead):]
        w = floor_weights(torch.nn.functional.cosine_similarity(qt[:, None, :], dt, dim=-1, eps=1e-8),
                          self.config.weight_floor)
        if mask is not None:
            w = w * mask.to(w.dtype)
        return w, self.head(dt).squeeze(-1)

    def expand(
        self, query: torch.Tensor, neighbours: torch.Tensor, mask: Optional[torch.Tensor] = None,
        text: Optional[torch.Tensor] = None, text_mask: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Expanded queries (B, D) L2-normalised, weights (B, k), relevance logits (B, k)."""
        w, logits = self(query, neighbours, mask, text, text_mask)
        v = query + torch.einsum("bk,bkd->bd", w, neighbours)
        return torch.nn.functional.normalize(v, dim=-1, eps=1e-12), w, logits


@torch.no_grad()
def expand_numpy(model: LAttQEModel, query: np.ndarray, neighbours: np.ndarray, batch: int = 256,
                 text: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Batched inference: query (B, D), neighbours (B, k, D) -> (expanded (B, D), weights (B, k)); ``text``
    (B, D): the queries' modification texts (read by a text model only; None: no query has one).
    At weight floor 1 every weight is 0 whatever the encoder says: the query comes back without running it."""
    if model.config.weight_floor is not None and model.config.weight_floor >= 1.0:
        return l2n(query), np.zeros(np.asarray(neighbours).shape[:2], np.float32)
    model.eval()
    dev = next(model.parameters()).device
    outs, ws = [], []
    for s in range(0, len(query), batch):
        q = torch.as_tensor(np.ascontiguousarray(query[s:s + batch]), dtype=torch.float32, device=dev)
        n = torch.as_tensor(np.ascontiguousarray(neighbours[s:s + batch]), dtype=torch.float32, device=dev)
        t = None if text is None else torch.as_tensor(np.ascontiguousarray(text[s:s + batch]), dtype=torch.float32,
                                                      device=dev)
        v, w, _ = model.expand(q, n, text=t)
        outs.append(v.cpu().numpy())
        ws.append(w.cpu().numpy())
    d = query.shape[-1]
    k = neighbours.shape[1] if neighbours.ndim == 3 else 0
    if not outs:
        return np.zeros((0, d), np.float32), np.zeros((0, k), np.float32)
    return np.concatenate(outs).astype(np.float32), np.concatenate(ws).astype(np.float32)


# -- checkpoints -----------------------------------------------------------------------------



def save_lattqe(model: LAttQEModel, path: Path, fingerprint: str, extra: Optional[Dict[str, Any]] = None) -> Path:
    """Writes the checkpoint in the one record format (:func:`engine.checkpoints.write`, atomic; ``.json``
    sidecar beside it). ``extra``: the trainer's figures; ``train`` becomes the recipe, ``val_map`` /
    ``val_map_none`` / ``val_map_aqe`` the validation scores (and stay as keys, read by the notes below)."""
    extra = dict(extra or {})
    recipe = extra.pop("train", None)
    names = {"val_map": "lattqe", "val_map_none": "none", "val_map_aqe": "aqe"}
    scores = {names[k]: float(extra[k]) for k in names if k in extra}
    validation = extra.pop("validation", None) or (
        {"split": "val", "metric": "mAP", "scores": scores} if len(scores) >= 2 else None)
    path = Path(path).with_suffix(".safetensors")
    record = make_record("lattqe", fingerprint, asdict(model.config), recipe, validation,
                         embed_dim=model.config.dim, weights=path.name, **extra)
    return write(path, dict(model.state_dict()), record)


def load_lattqe(path: Path, fingerprint: Optional[str] = None, device: str = "cpu"
                ) -> Tuple[LAttQEModel, Dict[str, Any]]:
    """Loads a checkpoint (either file of the pair) through :func:`engine.checkpoints.load`;
    CheckpointError names the file (another backbone, damaged or mismatched weights)."""
    ck = load("lattqe", Path(path).with_suffix(".safetensors"), fingerprint=fingerprint)
    try:
        model = LAttQEModel(LAttQEConfig.from_dict(ck.record["config"]))
        model.load_state_dict(ck.tensors, strict=True)
    except Exception as exc:  # mismatched file
        raise CheckpointError(f"{ck.path.name}: cannot load LAttQE weights ({exc})") from exc
    ck.record.setdefault("weights", ck.path.name)
    return model.to(device).eval(), ck.record


def find_checkpoints(checkpoint_dir, fingerprint: Optional[str] = None, embed_dim: Optional[int] = None,
                     text: bool = False) -> List[Tuple[Path, Dict[str, Any]]]:
    """[(path, record)] of the LAttQE checkpoints on the search path for ``fingerprint`` / ``embed_dim``, best
    first by the layer's tie rule (:func:`engine.checkpoints.find`); ``text``: the text-conditioned ones
    (``config.text_token``) instead of the image-only ones."""
    return [(p, r) for p, r in find("lattqe", fingerprint, checkpoint_dir, dim=embed_dim)
            if bool(r["config"].get("text_token")) == bool(text)]


# -- the expander ------------------------------------------------------------------------------

def _formula(floor: Optional[float]) -> str:
    if floor is None:
        return "q^ = norm(q + sum_i cos(q~, d~_i) d_i)"
    if floor >= 1.0:
        return "q^ = q (weight floor 1: no expansion helped on validation, the query is kept)"
    return f"q^ = norm(q + sum_i w_i d_i), w_i = max(0, cos(q~, d~_i) - {floor:g}) / (1 - {floor:g})"


class LAttQEExpander(Expander):
    name, label = "lattqe", "LAttQE (learned attention)"

    def __init__(self, model: LAttQEModel, record: Optional[Dict[str, Any]] = None):
        self.model = model.eval()
        self.record = record or {}

    @torch.no_grad()
    def expand(self, query, neighbours, sims, text=None) -> Expansion:
        q, nb, _ = check_inputs(query, neighbours, sims)
        if q.shape[0] != self.model.config.dim:
            raise InputError(f"LAttQE model expects {self.model.config.dim}-d vectors, got {q.shape[0]}-d")
        t = None
        if text is not None and self.model.config.text_token:  # an image-only model does not read the text
            t = np.asarray(text, dtype=np.float32).reshape(-1)
            if t.shape[0] != q.shape[0] or not np.all(np.isfinite(t)):
                raise InputError(f"the text embedding must be a finite {q.shape[0]}-d vector like the query")
            t = t[None]
        vec, w = expand_numpy(self.model, q[None], nb[None], text=t)
        return Expansion(
            vector=vec[0],
            weights=w[0],
            explanation={
                "method": "lattqe",
                "label": self.label,
                "formula": _formula(self.model.config.weight_floor),
                "query_weight": 1.0,
                "n": int(nb.shape[0]),
                "weights": [float(x) for x in w[0]],
                "checkpoint": self.record.get("weights", ""),
                **({"text_token": t is not None} if self.model.config.text_token else {}),
            },
        )


class LAttQETextExpander(LAttQEExpander):
    """LAttQE whose sequence holds the query's modification text as a token (``config.text_token``): the
    attention can weigh the neighbours that agree with the edit. Image-only queries run without that token."""

    name, label = "lattqe-text", "LAttQE with the text (learned attention)"
    reads_text = True


@EXPANDERS.register("lattqe")
def make_lattqe(embed_dim=None, checkpoint_dir=None, fingerprint=None, **_):
    """LAttQE from the first matching checkpoint on the search path; ExpanderUnavailable if none."""
    hits = find_checkpoints(checkpoint_dir, fingerprint, embed_dim)
    if not hits:
        where = Path(checkpoint_dir).name if checkpoint_dir else "no checkpoint folder"
        raise ExpanderUnavailable(
            f"no LAttQE checkpoint for backbone {fingerprint or '?'} ({embed_dim or '?'}-d) in {where}; "
            f"{part('lattqe').train_hint()}"
        )
    best = hits[0][0]  # the layer's tie rule, never file mtime
    try:
        model, record = load_lattqe(best, fingerprint=fingerprint)
    except CheckpointError as exc:
        raise ExpanderUnavailable(str(exc)) from exc
    return LAttQEExpander(model, record)


TEXT_TRAIN = "python -m engine train lattqe --composed"


@EXPANDERS.register("lattqe-text")
def make_lattqe_text(embed_dim=None, checkpoint_dir=None, fingerprint=None, **_):
    """Text-conditioned LAttQE from the first matching checkpoint (``config.text_token``) on the search path;
    ExpanderUnavailable if none."""
    hits = find_checkpoints(checkpoint_dir, fingerprint, embed_dim, text=True)
    if not hits:
        where = Path(checkpoint_dir).name if checkpoint_dir else "no checkpoint folder"
        raise ExpanderUnavailable(
            f"no text-conditioned LAttQE checkpoint for backbone {fingerprint or '?'} ({embed_dim or '?'}-d) in "
            f"{where}; train one with `{TEXT_TRAIN}`")
    try:
        model, record = load_lattqe(hits[0][0], fingerprint=fingerprint)
    except CheckpointError as exc:
        raise ExpanderUnavailable(str(exc)) from exc
    return LAttQETextExpander(model, record)


def validation_shortfall(record: Optional[Dict[str, Any]]) -> Optional[str]:
    """One plain sentence when the checkpoint's own validation queries (the held-out classes that picked its
    epoch; ``val_map`` / ``val_map_none`` in the sidecar) scored lower with LAttQE than without expansion;
    None when it did not, or when the record has no such figures."""
    try:
        with_qe, none = float(record["val_map"]), float(record["val_map_none"])
    except (KeyError, TypeError, ValueError):
        return None
    if with_qe >= none:
        return None
    return (f"on its validation queries it scored below no expansion "
            f"(mAP {with_qe:.3f} vs {none:.3f}), so it may make results worse")


def keeps_query_note(record: Optional[Dict[str, Any]]) -> Optional[str]:
    """One plain sentence when the checkpoint's weight floor, chosen on validation, is 1: it then returns every
    query unchanged (the sentence says which validation ruled expansion out). None otherwise."""
    floor = ((record or {}).get("config") or {}).get("weight_floor")
    if floor is None or float(floor) < 1.0:
        return None
    guard = ((record or {}).get("floor_selection") or {}).get("cir_guard")
    if guard:
        return ("for this backbone it keeps the query unchanged: on validation, every amount of expansion made "
                "some search method's composed results worse")
    return ("for this backbone it keeps the query unchanged: no amount of expansion scored above plain search "
            "on its validation classes")


@contextlib.contextmanager
def gallery_side(model: "LAttQEModel"):
    """Within the block the model uses its LAttDBA floor (``dba_weight_floor``, chosen on validation apart
    from the query-side one) when that is set."""
    saved = model.config.weight_floor
    if model.config.dba_weight_floor is not None:
        model.config.weight_floor = model.config.dba_weight_floor
    try:
        yield model
    finally:
        model.config.weight_floor = saved
