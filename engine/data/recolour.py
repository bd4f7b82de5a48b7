"""Recolour the object in a photo ("make it blue") with a known, checkable answer.

Only the object is changed: its mask comes from the alpha channel of a cut-out, or, for photos on a
white background, from the non-white foreground. Only images where a colour word makes sense are used:
the object must be mostly saturated (greyscale and washed-out objects are skipped) and mostly one hue
(a dominant hue cluster). The dominant hue is rotated to the centre hue of the target colour word;
pixels are shifted in HSV space with a weight that is 1 inside the dominant hue cluster and falls to 0
for other hues, so secondary colours (a green stalk on a red apple) and everything outside the mask
stay bit-identical.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from PIL import Image

# Centre hue (degrees) of each colour word; names are assigned to the nearest centre.
PALETTE = {
    "red": 0.0,
    "orange": 30.0,
    "yellow": 55.0,
    "green": 120.0,
    "cyan": 185.0,
    "blue": 225.0,
    "purple": 275.0,
    "pink": 320.0,
}
MIN_SAT = 0.30          # a pixel counts as "colourful" above this saturation ...
MIN_VAL = 0.30          # ... and this value (brightness)
MIN_COLOURFUL = 0.30    # share of object pixels that must be colourful
MIN_CLUSTER = 0.55      # share of colourful pixels within CLUSTER_DEG of the dominant hue
MIN_CLUSTER_VAL = 0.45  # median brightness of the cluster (dark objects read as brown/black)
MIN_CLUSTER_SAT = 0.50  # median saturation of the cluster (pale or brownish objects are skipped)
CLUSTER_DEG = 35.0      # full shift inside this hue distance ...
FALLOFF_DEG = 60.0      # ... no shift beyond this one
MIN_TARGET_DIST = 60.0  # target colour centre at least this far from the object's hue
MIN_OBJECT_PIXELS = 150


def rgb_to_hsv(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``float [..., 3]`` in [0, 1] -> hue in degrees [0, 360), saturation and value in [0, 1]."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    mx = rgb.max(axis=-1)
    mn = rgb.min(axis=-1)
    delta = mx - mn
    safe = np.where(delta > 0, delta, 1.0)
    h = np.where(mx == r, ((g - b) / safe) % 6.0, 0.0)
    h = np.where(mx == g, (b - r) / safe + 2.0, h)
    h = np.where(mx == b, (r - g) / safe + 4.0, h)
    h = np.where(delta > 0, (h * 60.0) % 360.0, 0.0)
    s = np.where(mx > 0, delta / np.where(mx > 0, mx, 1.0), 0.0)
    return h, s, mx


def hsv_to_rgb(h: np.ndarray, s: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Inverse of :func:`rgb_to_hsv` (hue in degrees)."""
    hp = (h % 360.0) / 60.0
    c = v * s
    x = c * (1.0 - np.abs(hp % 2.0 - 1.0))
    m = v - c
    z = np.zeros_like(h)
    sector = np.floor(hp).astype(int) % 6
    choices = [
        np.stack([c, x, z], -1), np.stack([x, c, z], -1), np.stack([z, c, x], -1),
        np.stack([z, x, c], -1), np.stack([x, z, c], -1), np.stack([c, z, x], -1),
    ]
    out = np.zeros(h.shape + (3,), dtype=np.float64)
    for k, ch in enumerate(choices):
        out = np.where((sector == k)[..., None], ch, out)
    return out + m[..., None]


def hue_distance(a, b):
    """Circular distance in degrees (0..180)."""
    d = np.abs((np.asarray(a, dtype=np.float64) - b) % 360.0)
    return np.minimum(d, 360.0 - d)


def colour_name(hue: float) -> str:
    """Colour word whose centre hue is nearest to ``hue`` (degrees)."""
    return min(PALETTE, key=lambda n: float(hue_distance(hue, PALETTE[n])))


def circular_mean(h: np.ndarray, w: Optional[np.ndarray] = None) -> float:
    w = np.ones_like(h) if w is None else w
    rad = np.deg2rad(h)
    return float(np.rad2deg(np.arctan2((w * np.sin(rad)).sum(), (w * np.cos(rad)).sum())) % 360.0)


def object_mask(img: Image.Image) -> tuple[Optional[np.ndarray], str]:
    """Soft object mask ``float [H, W]`` in [0, 1] and how it was found, or ``(None, reason)``.

    * cut-out: alpha channel with at least 3 % transparent pixels -> alpha / 255;
    * white background: at least 90 % of the border ring near-white -> non-white pixels.
    """
    if img.mode in ("RGBA", "LA", "P"):
        rgba = np.asarray(img.convert("RGBA"))
        alpha = rgba[..., 3].astype(np.float64) / 255.0
        if (alpha < 0.5).mean() >= 0.03:
            mask = alpha
            return (mask, "alpha") if (mask > 0.5).sum() >= MIN_OBJECT_PIXELS else (None, "object too small")
    rgb = np.asarray(img.convert("RGB")).astype(np.float64) / 255.0
    _, s, v = rgb_to_hsv(rgb)
    white = (v > 0.92) & (s < 0.08)
    hgt, wid = white.shape
    ring = max(1, int(round(0.03 * min(hgt, wid))))
    border = np.concatenate([white[:ring].ravel(), white[-ring:].ravel(), white[:, :ring].ravel(), white[:, -ring:].ravel()])
    if border.mean() < 0.9:
        return None, "background is not a cut-out or plain white"
    mask = (~white).astype(np.float64)
    frac = mask.mean()
    if mask.sum() < MIN_OBJECT_PIXELS or frac > 0.97:
        return None, "no separable foreground"
    return mask, "white-background"


@dataclass(frozen=True)
class ObjectColour:
    """Colour analysis of an object: dominant hue and the colour word that names it."""

    hue: float
    name: str
    colourful_share: float
    cluster_share: float
    mask_kind: str


def analyse(img: Image.Image) -> tuple[Optional[ObjectColour], str]:
    """Dominant object colour, or ``(None, reason)`` when recolouring would not make sense."""
    mask, kind = object_mask(img)
    if mask is None:
        return None, kind
    rgb = np.asarray(img.convert("RGB")).astype(np.float64) / 255.0
    h, s, v = rgb_to_hsv(rgb)
    obj = mask > 0.5
    colourful = obj & (s > MIN_SAT) & (v > MIN_VAL)
    n_obj, n_col = int(obj.sum()), int(colourful.sum())
    if n_obj == 0 or n_col / n_obj < MIN_COLOURFUL:
        return None, "object is greyscale or washed out"
    hc, sc = h[colourful], s[colourful]
    hist, _ = np.histogram(hc, bins=36, range=(0.0, 360.0), weights=sc)
    smooth = hist + np.roll(hist, 1) + np.roll(hist, -1)
    peak = (np.argmax(smooth) + 0.5) * 10.0
    near = hue_distance(hc, peak) <= CLUSTER_DEG
    dominant = circular_mean(hc[near], sc[near])
    cluster = hue_distance(hc, dominant) <= CLUSTER_DEG
    share = float(cluster.mean())
    if share < MIN_CLUSTER:
        return None, "object has several colours"
    if float(np.median(v[colourful][cluster])) < MIN_CLUSTER_VAL:
        return None, "object colour too dark to name"
    if float(np.median(sc[cluster])) < MIN_CLUSTER_SAT:
        return None, "object colour too pale or brownish to name"
    return ObjectColour(dominant, colour_name(dominant), n_col / n_obj, share, kind), "ok"


def target_colours(analysis: ObjectColour) -> list[str]:
    """Colour words far enough (>= MIN_TARGET_DIST degrees) from the object's own hue."""
    return [n for n, c in PALETTE.items() if float(hue_distance(c, analysis.hue)) >= MIN_TARGET_DIST]


def shift_weights(img: Image.Image, analysis: ObjectColour, hue: Optional[np.ndarray] = None) -> np.ndarray:
    """Per-pixel share of the hue rotation: mask x hue proximity to the dominant hue."""
    mask, _ = object_mask(img)
    if hue is None:
        hue, _, _ = rgb_to_hsv(np.asarray(img.convert("RGB")).astype(np.float64) / 255.0)
    h = hue
    d = hue_distance(h, analysis.hue)
    prox = np.clip((FALLOFF_DEG - d) / (FALLOFF_DEG - CLUSTER_DEG), 0.0, 1.0)
    return (mask if mask is not None else np.zeros(h.shape)) * prox


def recolour(img: Image.Image, colour: str, analysis: ObjectColour) -> Image.Image:
    """Rotate the object's dominant hue to the centre of ``colour``; everything else is left unchanged.

    Returns an image of the same mode (RGB or RGBA); the alpha channel is copied as is.
    """
    if colour not in PALETTE:
        raise ValueError(f"unknown colour {colour!r}; choose one of {', '.join(PALETTE)}")
    return recolour_to(img, analysis, PALETTE[colour])


def recolour_to(img: Image.Image, analysis: ObjectColour, hue: float,
                sat_val: Optional[tuple[float, float]] = None) -> Image.Image:
    """Rotate the object's dominant hue to ``hue`` (degrees); with ``sat_val`` (a named colour's HSV saturation
    and value, e.g. an XKCD colour's), also scale the dominant cluster's saturation and value so that their
    medians move to the colour's, with the same per-pixel weight as the hue. Only the object changes."""
    has_alpha = img.mode in ("RGBA", "LA") or (img.mode == "P" and "transparency" in img.info)
    mode = "RGBA" if has_alpha else "RGB"
    src = np.asarray(img.convert(mode)).copy()
    rgb = src[..., :3].astype(np.float64) / 255.0
    h, s, v = rgb_to_hsv(rgb)
    w = shift_weights(img, analysis, hue=h)
    delta = ((hue - analysis.hue + 180.0) % 360.0) - 180.0
    changed = w > 0
    wc, sc, vc = w[changed], s[changed], v[changed]
    if sat_val is not None:
        core = w > 0.5
        s_gain = sat_val[0] / max(float(np.median(s[core])), 1e-3) if core.any() else 1.0
        v_gain = sat_val[1] / max(float(np.median(v[core])), 1e-3) if core.any() else 1.0
        sc = np.clip(sc * (1.0 + wc * (s_gain - 1.0)), 0.0, 1.0)
        vc = np.clip(vc * (1.0 + wc * (v_gain - 1.0)), 0.0, 1.0)
    new_rgb = hsv_to_rgb(h[changed] + delta * wc, sc, vc)
    out = src.copy()
    out[..., :3][changed] = np.clip(np.rint(new_rgb * 255.0), 0, 255).astype(np.uint8)
    return Image.fromarray(out, mode=mode)
