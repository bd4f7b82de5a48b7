"""Context-I2W training recipe: the small mapper configuration, the training config, the contrastive loss,
the pseudo-word prompt embeddings the loss compares, parameter groups and the learning-rate schedule."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from ...compose.context_i2w import ContextI2WMapper, build_prompt

# Small configuration for the packaged offline backbone (checkpoint <= 25 MB as float16).
SMALL_CONFIG = dict(depth=1, heads=4, dim_head=32, num_latents=4, ff_mult=0.5, middle_dim=384, n_layer=2)


@dataclass
class TrainConfig:
    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-4
    weight_decay: float = 0.1
    warmup_steps: int = 50
    seed: int = 0
    grad_clip: float = 1.0
    amp: bool = True  # only used on CUDA
    global_dropout: float = 0.0  # see pseudo_prompt_embeddings
    cosine_weight: float = 0.0  # + this * mean(1 - cos(prompt embedding, image embedding)) (a direct fit)
    gate_init: float = 0.0  # tanh(gate) at the start (the paper's code starts at 0)
    local_zero_init: bool = False  # the local branch's last layer starts at zero (its output starts at 0)


def contrastive_loss(image: torch.Tensor, text: torch.Tensor, scale: float) -> torch.Tensor:
    """Symmetric InfoNCE between matching rows of two L2-normalised batches."""
    logits = scale * image @ text.t()
    target = torch.arange(image.shape[0], device=image.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))



def pseudo_prompt_embeddings(backbone, mapper: ContextI2WMapper, tokens: torch.Tensor, context: torch.Tensor,
                             prompt: Optional[str] = None, global_dropout: float = 0.0) -> torch.Tensor:
    """L2-normalised text embeddings of ``prompt`` (default: the training prompt) with each row's S*.

    ``global_dropout`` (training only): the share of rows whose global branch is dropped, so S* comes
    from the local branch alone for them, so the local branch has to carry the image. With the gate at 0 that
    does nothing (those rows get S* = 0 and the local branch no gradient); it is meant for a gate started open
    (``gate_init``) with the local branch's output started at zero (``local_zero_init``): docs/context_i2w.md."""
    s = mapper(context, tokens, global_dropout)
    prompt = prompt or build_prompt(mapper.config, None)
    return backbone.encode_texts_with_pseudo([prompt] * s.shape[0], s.float())


def _param_groups(mapper: ContextI2WMapper, weight_decay: float):
    decay, no_decay = [], []
    for name, p in mapper.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if (p.dim() < 2 or "norm" in name or name.endswith(".g")) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _schedule(total: int, warmup: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        t = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    return f


