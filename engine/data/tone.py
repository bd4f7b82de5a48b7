"""Whole-picture edits of a photo with a known answer: black-and-white, night, sepia and colour tints.

Used to validate the packaged backbone's light / tone concepts (``engine eval concepts``), to train RTIC on
tone edits (the offline CIR set has colour edits but no tone edits) and by the held-out-domain suite
(``engine eval generalise``). Edits work on float RGB in [0, 1], shape (..., 3, H, W):

- ``bw``: the Rec. 601 luma in every channel;
- ``night``: a darker, bluer picture (gamma 1.8, scaled to 35 %, then blue raised and red lowered), the way
  a night photograph of the same scene tends to look;
- ``sepia``: the luma mapped onto a brown ramp (the usual sepia toning matrix);
- ``tint-red`` / ``tint-green`` / ``tint-blue``: a strong colour cast, 55 % of the picture plus 45 % of its
  luma in the tint's colour, so the detail stays and the whole picture takes the colour;
- light and geometry (the open-vocabulary set, ``engine.data.open_vocab``, and the suite's ``light`` kind):
  ``bright`` (gamma 0.5, then x 1.25: overexposed), ``dark`` (gamma 1.6, then x 0.55), ``faded`` (25 % of the
  saturation, lifted blacks: washed out), ``contrast`` (the distance from mid-grey doubled), ``blur`` (a 9-pixel
  box blur, three passes per side of 224), ``flip`` (mirrored left to right), ``upside-down`` (turned
  180 degrees) and ``negative`` (1 - the picture).

``--tone-edits`` trains on ``bw`` and ``night`` (:data:`TONE_TEXTS`); ``--open-vocab`` trains on every edit but the
tints, in open phrasings (``engine.data.open_vocab``); the tints exist for evaluation.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..config import cache_dir
from ..fileio import atomic_path
from .cir_triplets import Triplet
from .formats import image_path, load_split
from .heldout import is_held_out

TONE_TEXTS = {
    "bw": ("in black and white", "as a black and white photo"),
    "night": ("at night", "the same scene at night"),
}


TINTS = {"tint-red": (1.0, 0.12, 0.12), "tint-green": (0.12, 0.85, 0.12), "tint-blue": (0.12, 0.25, 1.0)}
# every edit :func:`photo_edit` knows; the training phrasings exist for TONE_TEXTS' kinds only
LIGHT_EDITS = ("bright", "dark", "faded", "contrast", "blur", "flip", "upside-down", "negative")
PHOTO_EDITS = ("bw", "night", "sepia", *TINTS, *LIGHT_EDITS)


def _luma(rgb: torch.Tensor) -> torch.Tensor:
    return 0.299 * rgb[..., 0:1, :, :] + 0.587 * rgb[..., 1:2, :, :] + 0.114 * rgb[..., 2:3, :, :]


def tone_edit(rgb: torch.Tensor, kind: str) -> torch.Tensor:
    """The training edits only (``bw``, ``night``); :func:`photo_edit` has every edit."""
    if kind not in TONE_TEXTS:
        raise ValueError(f"unknown tone edit {kind!r}; choose one of {', '.join(TONE_TEXTS)}")
    return photo_edit(rgb, kind)


def photo_edit(rgb: torch.Tensor, kind: str) -> torch.Tensor:
    if kind in TINTS:
        tint = torch.tensor(TINTS[kind], dtype=rgb.dtype, device=rgb.device).view(3, 1, 1)
        return (0.55 * rgb.clamp(0, 1) + 0.45 * _luma(rgb.clamp(0, 1)) * tint * 1.6).clamp(0, 1)
    if kind == "sepia":
        ramp = torch.tensor([1.07, 0.95, 0.74], dtype=rgb.dtype, device=rgb.device).view(3, 1, 1)
        return (_luma(rgb.clamp(0, 1)) * ramp).clamp(0, 1)
    if kind == "bw":
        return _luma(rgb).expand_as(rgb).clone()
    if kind == "night":
        tint = torch.tensor([0.8, 0.9, 1.25], dtype=rgb.dtype, device=rgb.device).view(3, 1, 1)
        return ((rgb.clamp(0, 1) ** 1.8) * 0.35 * tint).clamp(0, 1)
    if kind in LIGHT_EDITS:
        return _light_edit(rgb.clamp(0, 1), kind)
    raise ValueError(f"unknown photo edit {kind!r}; choose one of {', '.join(PHOTO_EDITS)}")


def _light_edit(rgb: torch.Tensor, kind: str) -> torch.Tensor:
    """The light / geometry edits of :data:`LIGHT_EDITS` (input already clamped to [0, 1])."""
    if kind == "bright":
        return (rgb ** 0.5 * 1.25).clamp(0, 1)
    if kind == "dark":
        return (rgb ** 1.6) * 0.55
    if kind == "faded":
        luma = _luma(rgb)
        return (0.15 + 0.8 * (luma + 0.25 * (rgb - luma))).clamp(0, 1)
    if kind == "contrast":
        return ((rgb - 0.5) * 2.0 + 0.5).clamp(0, 1)
    if kind == "flip":
        return rgb.flip(-1)
    if kind == "upside-down":
        return rgb.flip(-1).flip(-2)
    if kind == "negative":
        return 1.0 - rgb
    return _box_blur(rgb, passes=max(1, round(3 * max(rgb.shape[-2:]) / 224)))


def _box_blur(rgb: torch.Tensor, passes: int, size: int = 9) -> torch.Tensor:
    """Repeated ``size`` x ``size`` box blur (edges replicated): close to a Gaussian after a few passes."""
    x = rgb.reshape(-1, 1, *rgb.shape[-2:])
    kernel = torch.full((1, 1, size, size), 1.0 / size ** 2, dtype=rgb.dtype, device=rgb.device)
    for _ in range(passes):
        x = torch.nn.functional.conv2d(torch.nn.functional.pad(x, (size // 2,) * 4, mode="replicate"), kernel)
    return x.reshape(rgb.shape)


# -- tone-edit triplets of the offline CIR set (RTIC training with --tone-edits, and its validation) --------

TONE_EDITS = tuple(TONE_TEXTS)
TONE_GALLERY = "tone"


def edited_file(src, kind: str, root=None):
    """Path of the ``kind`` version of the image file ``src``, written on first use (a PNG named after the
    source's content hash under ``<cache>/tone/<kind>/``, so every backbone embeds and caches it like any
    other file). The edit is applied to the decoded picture (alpha composited on white) at its own size."""
    import numpy as np
    from PIL import Image

    from ..images import load_image, sha256_file

    if kind not in PHOTO_EDITS:
        raise ValueError(f"unknown photo edit {kind!r}; choose one of {', '.join(PHOTO_EDITS)}")
    folder = Path(root) if root is not None else cache_dir() / "tone"
    out = folder / kind / f"{sha256_file(src)[:20]}.png"
    if not out.is_file():
        rgb = torch.from_numpy(np.asarray(load_image(src), dtype=np.float32) / 255.0).permute(2, 0, 1)
        edited = (photo_edit(rgb, kind).permute(1, 2, 0).numpy() * 255.0).round().clip(0, 255).astype(np.uint8)
        with atomic_path(out) as tmp:
            Image.fromarray(edited).save(tmp, format="PNG")
    return out


def tone_queries(n_photos: int, edits=TONE_EDITS):
    """``(photo index, edit, text)`` of every tone-edit query over ``n_photos`` photos, edit by edit: from
    each photo to its ``edit`` version, the text one of that edit's phrasings (alternating over the photos).
    ``""`` in ``edits`` (the photo as it is) makes no queries."""
    return [(i, e, TONE_TEXTS[e][i % len(TONE_TEXTS[e])]) for e in edits if e for i in range(n_photos)]


def tone_triplets(photos, edits=TONE_EDITS, root=None):
    """Tone-edit queries over a list of photo files: from each photo to each of its edited versions, the
    text one of that edit's phrasings (alternating over the photos), the target its own edited version.

    Returns ``(triplets, gallery)``: :class:`engine.data.cir_triplets.Triplet` records (``meta``:
    ``kind`` = the edit, ``gallery`` = "tone") and the gallery ``[(path, "tone")]`` holding every photo in
    every version (the original and each edit), so a photo's other versions are its hardest negatives."""
    photos = [str(p) for p in photos]
    versions = {e: [str(edited_file(p, e, root)) for p in photos] for e in edits}
    triplets = [Triplet(f"tone:{e}:{i}", photos[i], text, [versions[e][i]], {"kind": e, "gallery": TONE_GALLERY})
                for i, e, text in tone_queries(len(photos), edits)]
    gallery = [(p, TONE_GALLERY) for p in photos] + [(v, TONE_GALLERY) for e in edits for v in versions[e]]
    return triplets, gallery


def offline_cir_photos(split: str, hold_out: bool = False):
    """The photo files of one split of the offline CIR set: its gallery's ``photos`` entries (originals and
    recoloured versions; the Twemoji drawings are left out, as ``eval concepts`` does). ``hold_out``: without
    the held-out sources' photos (``engine.data.heldout``; RTIC's training and validation)."""
    paths = [image_path("cir", g["image"]) for g in load_split("cir", f"{split}_gallery")
             if g.get("gallery") == "photos" and not (hold_out and is_held_out(g.get("source", "")))]
    return [p for p in paths if p.is_file()]
