"""RTIC training recipe and losses: :class:`TrainConfig`, the DML and batch-hard triplet losses, the
optimiser with its step decay, and eval-mode composition of many rows (:func:`compose_all`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Optional

import torch
import torch.nn.functional as F

from ...compose.rtic import RTIC
from ...errors import InputError


@dataclass
class TrainConfig:
    epochs: int = 30
    batch_size: int = 64
    optimizer: str = "adamw"  # adamw | sgd
    lr: float = 1e-3
    weight_decay: float = 1e-4
    momentum: float = 0.9
    step_every: int = 10
    step_gamma: float = 1.0 / math.sqrt(2.0)
    loss: str = "dml"  # dml | triplet
    margin: float = 0.2
    cos_weight: float = 0.0  # + cos_weight * mean(1 - cos(composed, target)): keeps outputs near the images
    group_by_reference: bool = False  # batches hold every row of their reference images (its other edits: negatives)
    group_by_photo: bool = False  # batches hold every row of their source photos (the photo and its edited versions)
    seed: int = 0
    # GCN stream
    gcn: bool = False
    gcn_layers: int = 2
    gcn_weight: float = 1.0
    pair_weight: float = 1.0
    density: float = 0.15
    p: float = 0.33
    correlation: str = "target"  # target (stage-1 target features) | composed (stage-1 outputs)
    gcn_init: str = "scratch"  # scratch | stage1
    gcn_epochs: int = 0  # stage-2 epochs (0: same as stage 1)
    gcn_batch_size: int = 0  # stage-2 batch size (0: same as stage 1)
    gcn_control: bool = False  # with gcn_init=stage1: also continue stage 1 without the stream (fair control)
    device: str = "cpu"

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# -- losses ----------------------------------------------------------------------------------------------


def negatives_mask(tgt: torch.Tensor, query: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(B, B) True where column j must not act as a negative of row i (same target or same query, j != i)."""
    same = tgt[:, None] == tgt[None, :]
    if query is not None:
        same = same | (query[:, None] == query[None, :])
    return same & ~torch.eye(len(tgt), dtype=torch.bool, device=tgt.device)


def dml_loss(
    composed: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor, mask: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """mean_i -log softmax_j(scale * cos(composed_i, target_j))[i]; masked columns are excluded."""
    logits = scale * F.normalize(composed, dim=1) @ F.normalize(targets, dim=1).T
    if mask is not None:
        logits = logits.masked_fill(mask, float("-inf"))
    return F.cross_entropy(logits, torch.arange(len(logits), device=logits.device))


def batch_hard_triplet_loss(
    composed: torch.Tensor, targets: torch.Tensor, margin: float = 0.2, mask: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """mean_i max(0, margin + d(i, i) - min_{j != i} d(i, j)) with cosine distance d = 1 - cos."""
    d = 1.0 - F.normalize(composed, dim=1) @ F.normalize(targets, dim=1).T
    excluded = torch.eye(len(d), dtype=torch.bool, device=d.device)
    if mask is not None:
        excluded = excluded | mask
    hardest = d.masked_fill(excluded, float("inf")).min(1).values
    return F.relu(margin + d.diagonal() - hardest).mean()


def pair_loss(model: RTIC, out: torch.Tensor, tgt_emb: torch.Tensor, mask: torch.Tensor, cfg: TrainConfig):
    if cfg.loss == "dml":
        loss = dml_loss(out, tgt_emb, model.logit_scale, mask)
    elif cfg.loss == "triplet":
        loss = batch_hard_triplet_loss(out, tgt_emb, cfg.margin, mask)
    else:
        raise InputError(f"unknown loss {cfg.loss!r}; use dml or triplet")
    if cfg.cos_weight:
        loss = loss + cfg.cos_weight * (1.0 - F.cosine_similarity(out, tgt_emb, dim=1)).mean()
    return loss


# -- optimiser and inference -----------------------------------------------------------------------------


def make_optimizer(params, cfg: TrainConfig):
    if cfg.optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)
    elif cfg.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, foreach=True)
    else:
        raise InputError(f"unknown optimizer {cfg.optimizer!r}; use adamw or sgd")
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=max(1, cfg.step_every), gamma=cfg.step_gamma)
    return opt, sched


@torch.no_grad()
def compose_all(model: RTIC, image: torch.Tensor, text: torch.Tensor, batch: int = 1024) -> torch.Tensor:
    """Eval-mode composed vectors (N, D), L2-normalised."""
    model.eval()
    outs = [model(image[i : i + batch], text[i : i + batch]) for i in range(0, len(image), batch)]
    return F.normalize(torch.cat(outs), dim=1)
