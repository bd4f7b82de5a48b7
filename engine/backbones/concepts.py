"""Colour, light and tone concepts measured from pixels, for the packaged backbone's bridge.

The packaged image embedding is a mixture of named concepts in the text encoder's space. ImageNet classes
name *what* is in the picture, not its colour or light; the detectors here add *how it looks*, each
concept named in words and embedded by the same text encoder:

- **object colour**: basic colour terms of the salient region (pixels that differ from the border's
  colour, which separates a cut-out from its background; a centre prior when nothing stands out);
- **scene colour**: the same terms over the whole picture;
- **light and tone**: night (dark overall), daylight (bright overall), black-and-white (no chroma).

Colour naming is a soft nearest-prototype model in CIE Lab: each pixel belongs to every basic colour term
with weight ``exp(-d^2 / 2 sigma^2)`` (normalised), ``d`` the distance to the term's prototype with
lightness counted at half weight (hue and chroma decide colour names more than lightness does; black,
grey and white are still separated by it). The prototypes are the sRGB focal colours below converted to
Lab. Everything is a few tensor operations on the already-preprocessed pixels: no weights, no hub.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, List

import torch
import torch.nn.functional as F

# Basic colour terms (Berlin & Kay's eleven, plus cyan, a term the offline recolour edits use) and a focal
# sRGB colour for each.
COLOUR_TERMS: Dict[str, tuple] = {
    "black": (20, 20, 20),
    "grey": (128, 128, 128),
    "white": (245, 245, 245),
    "red": (200, 30, 35),
    "orange": (240, 135, 25),
    "yellow": (240, 215, 35),
    "green": (50, 155, 60),
    "cyan": (30, 185, 195),
    "blue": (35, 80, 200),
    "purple": (125, 45, 160),
    "pink": (240, 140, 185),
    "brown": (125, 80, 40),
}
OBJECT_PROMPT = "a {} object"
SCENE_PROMPT = "a mostly {} picture"
LIGHT_PROMPTS = {
    "night": "a photo at night, dark",
    "daylight": "a bright photo in daylight",
    "black-and-white": "a black and white photo",
}


@dataclass(frozen=True)
class ConceptWeights:
    """How much each concept group counts in the image embedding (each group's mixture is unit length
    before weighting, then the sum is renormalised). ``sigma`` is the colour-naming width in Lab units."""

    classes: float = 1.0
    object_colour: float = 0.0
    scene_colour: float = 0.0
    light: float = 0.0
    sigma: float = 12.0

    def tag(self) -> str:
        return ",".join(f"{k}={v:g}" for k, v in asdict(self).items())

    @property
    def any(self) -> bool:
        return bool(self.object_colour or self.scene_colour or self.light)


def concept_prompts() -> List[str]:
    """Every phrase the detectors need embedded, in the order :func:`concept_scores` returns scores."""
    return ([OBJECT_PROMPT.format(t) for t in COLOUR_TERMS] + [SCENE_PROMPT.format(t) for t in COLOUR_TERMS]
            + list(LIGHT_PROMPTS.values()))


def srgb_to_lab(rgb: torch.Tensor) -> torch.Tensor:
    """(..., 3) sRGB in [0, 1] -> (..., 3) CIE Lab (D65)."""
    rgb = rgb.clamp(0, 1)
    lin = torch.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    m = torch.tensor([[0.4124564, 0.3575761, 0.1804375],
                      [0.2126729, 0.7151522, 0.0721750],
                      [0.0193339, 0.1191920, 0.9503041]], dtype=rgb.dtype, device=rgb.device)
    xyz = lin @ m.T / torch.tensor([0.95047, 1.0, 1.08883], dtype=rgb.dtype, device=rgb.device)
    eps = 216 / 24389
    f = torch.where(xyz > eps, xyz.clamp(min=1e-12) ** (1 / 3), (24389 / 27 * xyz + 16) / 116)
    return torch.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]), 200 * (f[..., 1] - f[..., 2])], -1)


def _prototypes(dtype, device) -> torch.Tensor:
    rgb = torch.tensor(list(COLOUR_TERMS.values()), dtype=dtype, device=device) / 255.0
    return srgb_to_lab(rgb)  # (T, 3)


def colour_memberships(lab: torch.Tensor, sigma: float) -> torch.Tensor:
    """(..., 3) Lab -> (..., T) soft membership of each basic colour term (rows sum to 1)."""
    proto = _prototypes(lab.dtype, lab.device)
    scale = torch.tensor([0.5, 1.0, 1.0], dtype=lab.dtype, device=lab.device)
    x, p = lab * scale, proto * scale
    d2 = (x * x).sum(-1, keepdim=True) - 2 * x @ p.T + (p * p).sum(-1)  # (..., T), one matmul
    return torch.softmax(-d2 / (2 * sigma * sigma), dim=-1)


def salient_weights(lab: torch.Tensor) -> torch.Tensor:
    """(B, H, W, 3) Lab -> (B, H, W) weights of the salient region (sum 1 per image).

    Pixels far (in Lab) from the median colour of a thin border frame are the object; a mild centre prior
    breaks ties; when almost nothing (< 2 %) or almost everything (> 90 %) stands out, the centre prior
    alone decides.
    """
    b, h, w, _ = lab.shape
    fh, fw = max(1, h // 25), max(1, w // 25)
    frame = torch.cat([lab[:, :fh].reshape(b, -1, 3), lab[:, -fh:].reshape(b, -1, 3),
                       lab[:, :, :fw].reshape(b, -1, 3), lab[:, :, -fw:].reshape(b, -1, 3)], dim=1)
    border = frame.median(dim=1).values  # (B, 3)
    dist = (lab - border[:, None, None, :]).norm(dim=-1)
    fg = torch.sigmoid((dist - 15.0) / 3.0)
    ys = torch.linspace(-1, 1, h, dtype=lab.dtype, device=lab.device)
    xs = torch.linspace(-1, 1, w, dtype=lab.dtype, device=lab.device)
    centre = torch.exp(-(ys[:, None] ** 2 + xs[None, :] ** 2) / (2 * 0.5 ** 2))  # (H, W)
    share = fg.mean(dim=(1, 2))
    use_fg = ((share > 0.02) & (share < 0.90)).to(lab.dtype)[:, None, None]
    wts = use_fg * fg * (0.5 + 0.5 * centre) + (1 - use_fg) * centre
    return wts / wts.sum(dim=(1, 2), keepdim=True).clamp(min=1e-12)


def concept_scores(rgb: torch.Tensor, sigma: float = 12.0, max_side: int = 64) -> Dict[str, torch.Tensor]:
    """(B, 3, H, W) sRGB in [0, 1] -> per-image concept scores.

    ``object`` and ``scene``: (B, T) colour-term distributions (rows sum to 1); ``light``: (B, 3) scores in
    [0, 1] for night, daylight and black-and-white. Pictures are measured at ``max_side`` pixels at most
    (colour statistics need no detail; it keeps the cost per image small).
    """
    if max(rgb.shape[-2:]) > max_side:
        rgb = torch.nn.functional.interpolate(rgb, size=(max_side, max_side), mode="area")
    lab = srgb_to_lab(rgb.permute(0, 2, 3, 1).float())
    member = colour_memberships(lab, sigma)  # (B, H, W, T)
    sal = salient_weights(lab)
    obj = (member * sal[..., None]).sum(dim=(1, 2))
    scene = member.mean(dim=(1, 2))
    light_l = lab[..., 0].mean(dim=(1, 2))  # 0..100
    chroma = lab[..., 1:].norm(dim=-1).flatten(1)
    c90 = chroma.quantile(0.9, dim=1)
    night = torch.sigmoid((30.0 - light_l) / 5.0)
    day = torch.sigmoid((light_l - 60.0) / 6.0)
    bw = torch.sigmoid((8.0 - c90) / 2.0)
    return {"object": obj, "scene": scene, "light": torch.stack([night, day, bw], dim=-1)}


def mix(class_part: torch.Tensor, scores: Dict[str, torch.Tensor], concept_text: torch.Tensor,
        weights: ConceptWeights) -> torch.Tensor:
    """The image embedding: weighted sum of unit-length concept-group mixtures, renormalised.

    ``class_part``: (B, D) unit-length class mixture; ``concept_text``: (len(concept_prompts()), D)
    unit-length phrase embeddings.
    """
    t = len(COLOUR_TERMS)
    obj_text, scene_text, light_text = concept_text[:t], concept_text[t : 2 * t], concept_text[2 * t :]
    out = weights.classes * class_part
    if weights.object_colour:
        out = out + weights.object_colour * F.normalize(scores["object"].to(obj_text.dtype) @ obj_text, dim=-1)
    if weights.scene_colour:
        out = out + weights.scene_colour * F.normalize(scores["scene"].to(scene_text.dtype) @ scene_text, dim=-1)
    if weights.light:
        out = out + weights.light * (scores["light"].to(light_text.dtype) @ light_text)
    return F.normalize(out, dim=-1)
