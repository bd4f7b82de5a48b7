"""Light and tone edits of a photo with a known answer: black-and-white and night.

Used to validate the packaged backbone's light / tone concepts (``engine eval concepts``): the offline CIR
set has colour edits but no tone edits. Edits work on float RGB in [0, 1], shape (..., 3, H, W):

- ``bw``: the Rec. 601 luma in every channel;
- ``night``: a darker, bluer picture (gamma 1.8, scaled to 35 %, then blue raised and red lowered), the way
  a night photograph of the same scene tends to look.
"""
from __future__ import annotations

import torch

TONE_TEXTS = {
    "bw": ("in black and white", "as a black and white photo"),
    "night": ("at night", "the same scene at night"),
}


def tone_edit(rgb: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "bw":
        y = 0.299 * rgb[..., 0:1, :, :] + 0.587 * rgb[..., 1:2, :, :] + 0.114 * rgb[..., 2:3, :, :]
        return y.expand_as(rgb).clone()
    if kind == "night":
        tint = torch.tensor([0.8, 0.9, 1.25], dtype=rgb.dtype, device=rgb.device).view(3, 1, 1)
        return ((rgb.clamp(0, 1) ** 1.8) * 0.35 * tint).clamp(0, 1)
    raise ValueError(f"unknown tone edit {kind!r}; choose one of {', '.join(TONE_TEXTS)}")
