"""RTIC: residual text-image composer (Shin et al., "RTIC: Residual Learning for Text and Image
Composition using Graph Convolutional Network", Appendix B / Table 6), as a supervised composer.

The model works on the frozen backbone's L2-normalised image and text embeddings (both of size
``D_V = backbone.embed_dim``)::

    x    = F(v_src, t)              fusion: concat(t, v) -> BatchNorm -> LeakyReLU -> Linear(2D -> D)
    X^0  = x
    X^k  = X^(k-1) + E^k(X^(k-1))   n error-encoding blocks (inner skip; switch ``inner_skip``)
    s    = G(x)                     channel-wise gate in (0, 1): Linear, BN, LeakyReLU, Linear, Sigmoid
    v~   = (1 - s) * X^n + s * v_src

Ablation switches (``RTICConfig``): ``inner_skip=False`` drops the "+ X^(k-1)" of every block;
``gating=False`` drops the gate and returns ``v~ = X^n``.

Optional trainable projections: ``text_proj`` maps the text embedding before fusion (query side
only, safe); ``image_proj`` maps the reference embedding *only where it enters the fusion* -- the
gated skip keeps the raw ``v_src`` so that the output stays in the backbone's image space, where the
gallery index lives (gallery vectors are never re-projected).

Checkpoints are ``rtic[-gcn]-<backbone>.safetensors`` files of the one checkpoint layer
(:mod:`engine.checkpoints`, parts ``rtic`` and ``rtic+gcn``): :func:`save_rtic` writes the record format,
:func:`load_rtic` / :func:`find_rtic` read it (older formats are refused). The composer factory
registered as ``"rtic"`` loads the one matching the live backbone, else raises :class:`ComposerUnavailable`.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..checkpoints import describe_search_path, figures_of, find, load, load_first, make_record, part, write
from ..errors import CheckpointError
from .anchor import Anchor, AnchoredComposer, load_anchor, operation_text, prior_only, split_state
from .base import COMPOSERS, ComposerUnavailable, Composition, Query, encoded_text, normalise

LEGACY_NEGATIVE_SLOPE = 0.2  # the slope of checkpoints whose config does not record one


@dataclass
class RTICConfig:
    """Architecture of one RTIC model (stored in every checkpoint)."""

    dim: int = 512  # D_V: the backbone's joint embedding size
    text_dim: Optional[int] = None  # D_T; defaults to ``dim`` (joint space backbones)
    n_blocks: int = 4
    inner_skip: bool = True
    gating: bool = True
    # LeakyReLU slope: PyTorch's default 0.01, as in the authors' code (the paper's Table 6 gives none).
    negative_slope: float = 0.01
    text_proj: bool = False
    image_proj: bool = False
    init_temperature: float = 10.0  # initial logit scale of the DML loss (learnable)

    def __post_init__(self) -> None:
        if self.text_dim is None:
            self.text_dim = self.dim
        if self.dim < 2 or self.dim % 2:
            raise ValueError(f"RTIC needs an even embedding size >= 2, got {self.dim}")
        if self.n_blocks < 0:
            raise ValueError("n_blocks must be >= 0")

    @classmethod
    def from_dict(cls, data: dict) -> "RTICConfig":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        # checkpoints written before the slope was recorded were trained with 0.2
        values.setdefault("negative_slope", LEGACY_NEGATIVE_SLOPE)
        return cls(**values)


class Fusion(nn.Module):
    """F: concat(text, image) -> BatchNorm -> LeakyReLU -> Linear(D_T + D_V -> D_V)."""

    def __init__(self, dim: int, text_dim: int, slope: float):
        super().__init__()
        self.bn = nn.BatchNorm1d(text_dim + dim)
        self.act = nn.LeakyReLU(slope)
        self.fc = nn.Linear(text_dim + dim, dim)

    def forward(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        return self.fc(self.act(self.bn(torch.cat([text, image], dim=-1))))


class ErrorEncoder(nn.Module):
    """E: Linear D->D/2, BN, LeakyReLU, Linear D/2->D/2, BN, LeakyReLU, Linear D/2->D."""

    def __init__(self, dim: int, slope: float):
        super().__init__()
        half = dim // 2
        self.net = nn.Sequential(
            nn.Linear(dim, half),
            nn.BatchNorm1d(half),
            nn.LeakyReLU(slope),
            nn.Linear(half, half),
            nn.BatchNorm1d(half),
            nn.LeakyReLU(slope),
            nn.Linear(half, dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Gate(nn.Module):
    """G: Linear D->D, BN, LeakyReLU, Linear D->D, Sigmoid."""

    def __init__(self, dim: int, slope: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, dim), nn.BatchNorm1d(dim), nn.LeakyReLU(slope), nn.Linear(dim, dim), nn.Sigmoid()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class RTIC(nn.Module):
    """The composer network. ``forward(image, text)`` -> composed vector (B, D_V), not normalised."""

    def __init__(self, config: RTICConfig):
        super().__init__()
        self.config = config
        d, dt, a = config.dim, config.text_dim, config.negative_slope
        self.text_proj = nn.Linear(dt, dt) if config.text_proj else None
        self.image_proj = nn.Linear(d, d) if config.image_proj else None
        for proj in (self.text_proj, self.image_proj):
            if proj is not None:  # start as the identity map
                nn.init.eye_(proj.weight)
                nn.init.zeros_(proj.bias)
        self.fusion = Fusion(d, dt, a)
        self.blocks = nn.ModuleList(ErrorEncoder(d, a) for _ in range(config.n_blocks))
        self.gate = Gate(d, a) if config.gating else None
        # learnable temperature of the DML loss (log of the logit scale); unused at inference
        self.log_scale = nn.Parameter(torch.tensor(float(config.init_temperature)).log())

    def compose(self, image: torch.Tensor, text: torch.Tensor) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Returns (v~ (B, D), gate s (B, D) or None)."""
        v_in = self.image_proj(image) if self.image_proj is not None else image
        t_in = self.text_proj(text) if self.text_proj is not None else text
        x = self.fusion(v_in, t_in)
        h = x
        for block in self.blocks:
            h = h + block(h) if self.config.inner_skip else block(h)
        if self.gate is None:
            return h, None
        s = self.gate(x)
        return self.mix(h, image, s), s

    @staticmethod
    def mix(residual: torch.Tensor, v_src: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """The gated skip: v~ = (1 - s) * X^n + s * v_src."""
        return (1.0 - s) * residual + s * v_src

    def forward(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        return self.compose(image, text)[0]

    @property
    def logit_scale(self) -> torch.Tensor:
        return self.log_scale.exp().clamp(max=100.0)


def count_parameters(module: nn.Module, exclude: Tuple[str, ...] = ("log_scale",)) -> int:
    """Trainable parameters, without the loss temperature (not part of the architecture)."""
    return sum(p.numel() for n, p in module.named_parameters() if p.requires_grad and n not in exclude)


# -- checkpoints: the one layer (engine.checkpoints) -------------------------------------------------


VARIANTS = ("rtic", "rtic+gcn")  # the parts of engine.checkpoints.PARTS an RTIC file is (its record's "part")


def save_rtic(path: os.PathLike, model: RTIC, fingerprint: str, backbone_name: str = "",
              extra: Optional[dict] = None, anchor: Optional[Anchor] = None, variant: Optional[str] = None) -> Path:
    """Writes the checkpoint in the one record format (:func:`engine.checkpoints.write`: atomic, ``.json``
    sidecar beside it). ``variant``: "rtic" or "rtic+gcn" (default: ``extra``'s ``part`` / ``variant``, else
    "rtic"); ``extra``: the trainer's figures (its ``train_config`` becomes the recipe) or a loaded record being
    saved again (engine.train.anchor_fit); ``anchor``: the prior anchor (engine.compose.anchor) stored with the
    weights (tensors ``anchor.*``, its ramps as the record's ``anchor``)."""
    extra = extra or {}
    variant = variant or extra.get("part") or extra.get("variant") or "rtic"
    if variant not in VARIANTS:
        raise ValueError(f"unknown RTIC variant {variant!r}; use one of {VARIANTS}")
    recipe = extra.get("recipe") or extra.get("train_config")
    validation = extra.get("validation")
    figures = figures_of(extra, "anchor", "anchor_vocab", "anchor_routes", "train_config")  # made again below
    record = make_record(variant, fingerprint, asdict(model.config), recipe, validation, backbone_name, **figures)
    state = dict(model.state_dict())
    if anchor is not None:
        record["anchor"] = anchor.config.to_dict()
        record.update(anchor.record_extra())
        state.update(anchor.tensors())
    return write(path, state, record)


def load_rtic(path: os.PathLike, fingerprint: Optional[str] = None) -> Tuple[RTIC, dict]:
    """Loads a model in eval mode through :func:`engine.checkpoints.load` (the record format; an older file is
    refused); CheckpointError names the file on a fingerprint mismatch or damaged weights (the prior anchor
    stored beside the weights is read by :func:`engine.compose.anchor.load_anchor`)."""
    ck = load("rtic", Path(path).with_suffix(".safetensors"), fingerprint=fingerprint)
    try:
        model = RTIC(RTICConfig.from_dict(ck.record["config"]))
        model.load_state_dict(split_state(ck.tensors))
    except Exception as exc:
        raise CheckpointError(f"{ck.path.name}: weights do not match the stored config ({exc})") from None
    model.eval()
    return model, ck.record


def find_rtic(fingerprint: Optional[str], checkpoint_dir=None, variant: Optional[str] = None
              ) -> List[Tuple[Path, dict]]:
    """[(path, record)] of the RTIC checkpoints on the search path trained for ``fingerprint``, best first by
    the layer's tie rule (:func:`engine.checkpoints.find`: search-path position, then plain RTIC before
    RTIC+GCN -- never stored test-split numbers --, then file name); ``variant``: only that part."""
    return [(p, r) for p, r in find("rtic", fingerprint, checkpoint_dir) if variant in (None, r["part"])]


# -- the composer ---------------------------------------------------------------------------------------


class RTICComposer(AnchoredComposer):
    """RTIC as a correction of the weighted sum (engine.compose.anchor): the learned vector is mixed into the
    prior by the query's familiarity; with the image or the text missing the prior alone is used."""

    name, label = "rtic", "RTIC (learned residual composer)"

    def __init__(self, backbone, model: RTIC, record: Optional[dict] = None, top_channels: int = 5,
                 anchor: Optional[Anchor] = None):
        super().__init__(backbone)
        self.model = model.eval()
        self.record = record or {}
        self.anchor = anchor
        self.top_channels = top_channels
        if model.config.dim != backbone.embed_dim:
            raise CheckpointError(
                f"RTIC checkpoint has D={model.config.dim}, backbone {backbone.name} has {backbone.embed_dim}"
            )
        if self.record.get("part") == "rtic+gcn":
            self.label = "RTIC + GCN (learned residual composer)"

    @torch.no_grad()
    def compose(self, query: Query) -> Composition:
        if not (query.has_image and query.text and query.text.strip()):
            return prior_only(self, query, "RTIC corrects a composition of an image and a text")
        emb, notices = encoded_text(self.backbone, query)
        text = emb.detach().float().cpu().reshape(1, -1)
        image = query.image_embedding.detach().float().cpu().reshape(1, -1)
        out, s = self.model.compose(image, text)
        anchored = {}
        if self.anchor is not None:
            out, anchored = self.anchor.explain_blend(image, text, out,
                                                      operation_text(self.anchor, self.backbone, [query.text]))
        vec = normalise(out[0])
        delta = torch.from_numpy(vec) - F.normalize(image[0], dim=0)
        order = delta.abs().argsort(descending=True)[: self.top_channels]
        explanation: Dict[str, object] = {
            "formula": "q = (1 - s) * X^n + s * v_ref" if s is not None else "q = X^n (no gate)",
            **anchored,
            "gate_mean": float(s.mean()) if s is not None else None,
            "top_changed_channels": [{"channel": int(i), "change": round(float(delta[i]), 4)} for i in order],
            "prompt": query.text,
            "checkpoint": self.record.get("file", ""),
            "variant": self.record.get("part", "rtic"),
        }
        return Composition(vec, explanation, notices)

    batch = 256

    def learned_batch(self, chunk: List[Query], image: torch.Tensor, texts: List[str]) -> tuple:
        text = self.backbone.encode_texts(texts).embeddings.detach().float().cpu()
        return self.model.compose(image, text)[0], text


def load_rtic_composer(backbone, checkpoint_dir=None, variant: Optional[str] = None) -> RTICComposer:
    """Loads the RTIC checkpoint for ``backbone`` from ``checkpoint_dir`` (default: the checkpoint layer's search
    path, :func:`engine.checkpoints.search_dirs`).

    ``variant``: ``"rtic"`` or ``"rtic+gcn"`` to pick one; None takes the plain RTIC checkpoint when
    there is one (never chosen by test-split numbers), else the GCN-trained one.
    """
    found = find_rtic(backbone.fingerprint, checkpoint_dir, variant)
    if not found:
        raise ComposerUnavailable(
            f"no RTIC checkpoint for {backbone.name} in {describe_search_path(checkpoint_dir)}; {part('rtic').train_hint()}"
        )
    def one(path):  # in the layer's tie rule: search path, plain RTIC first, name; a damaged one passed over
        model, record = load_rtic(path, backbone.fingerprint)
        anchor = load_anchor(path, record)  # CheckpointError naming the file when unreadable
        return RTICComposer(backbone, model, record, anchor=anchor)

    return load_first(found, one, "RTIC")


COMPOSERS.register("rtic")(lambda backbone, checkpoint_dir=None: load_rtic_composer(backbone, checkpoint_dir))
