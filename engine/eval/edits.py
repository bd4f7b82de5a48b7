"""Which picture edits the backbone can see: the ``edits-seen`` section of ``python -m engine eval offline``.

For every photo of the held-out-domain suite's validation side and every edit below, two figures:

- **cosine**: the mean cosine between the photo's embedding and its edited version's (1.0: the backbone
  cannot tell them apart at all);
- **text picks it**: the share of photos for which the weighted sum of the photo and the edit's words
  ("mirrored", "at night", ...) scores that edit's version highest among the photo's edited versions (the
  original left out, as the page leaves the reference out); chance is one in the number of edits.

The same share for the photo alone (no words) is the baseline: an edit is *seen* when the words raise the share
by at least 10 points and to at least twice chance. One that is not seen is one the page must not promise.
"""
from __future__ import annotations

from typing import Callable, Dict, List

import torch
import torch.nn.functional as F
from PIL import Image, ImageFilter, ImageOps

EDITS: Dict[str, tuple] = {
    # name: (edit of a PIL RGB image, the words a person would type)
    "mirror": (ImageOps.mirror, "mirrored, facing the other way"),
    "upside down": (ImageOps.flip, "upside down"),
    "blur": (lambda im: im.filter(ImageFilter.GaussianBlur(radius=max(2, min(im.size) // 40))), "blurred, out of focus"),
    "negative": (ImageOps.invert, "as a colour negative"),
    "black and white": (lambda im: ImageOps.grayscale(im).convert("RGB"), "in black and white"),
    "darker": (lambda im: im.point(lambda v: int(v * 0.35)), "much darker, at night"),
}


@torch.no_grad()
def _embed(backbone, images: List[Image.Image]) -> torch.Tensor:
    out = [backbone.encode_images(torch.stack([backbone.preprocess(im) for im in images[i : i + 32]]))
           for i in range(0, len(images), 32)]
    return F.normalize(torch.cat(out).float(), dim=-1)


def measure(backbone, photos: List[Image.Image], edits: Dict[str, tuple] = EDITS, alpha: float = 0.5) -> dict:
    """{edit: {"cosine": mean cosine to the original, "text_picks": share (0..1)}} over ``photos``."""
    base = _embed(backbone, photos)
    names = list(edits)
    fns: List[Callable] = [edits[n][0] for n in names]
    versions = torch.stack([_embed(backbone, [fn(im) for im in photos]) for fn in fns], dim=1)  # (P, E, D)
    out = {}
    for j, name in enumerate(names):
        words = edits[name][1]
        text = F.normalize(backbone.encode_texts([words]).embeddings.float(), dim=-1)
        q = F.normalize((1 - alpha) * base + alpha * text, dim=-1)
        picks = (torch.einsum("pd,ped->pe", q, versions).argmax(dim=1) == j).float().mean()
        alone = (torch.einsum("pd,ped->pe", base, versions).argmax(dim=1) == j).float().mean()
        out[name] = {"cosine": round(float((base * versions[:, j]).sum(-1).mean()), 4),
                     "text_picks": round(float(picks), 4), "image_picks": round(float(alone), 4), "words": words}
    return out


def seen(r: dict, n_edits: int) -> bool:
    return r["text_picks"] >= max(2 / n_edits, r["image_picks"] + 0.1)


def suite_photos(limit: int = 120) -> List[Image.Image]:
    from ..data.builders import ensure_built
    from .generalise import SUITE_SETS, held_out_photos

    ensure_built(*SUITE_SETS)  # the explicit build step (quick when built)
    recs = [r for r in held_out_photos() if r["side"] == "val"][:limit]
    photos = []
    for r in recs:
        with Image.open(r["image"]) as im:
            photos.append(im.convert("RGB"))
    return photos


def offline_section(args, ctx):
    backbone = ctx["backbone"]
    photos = suite_photos()
    res = measure(backbone, photos)
    lines = [f"{len(photos)} photos of the held-out-domain suite's validation side, each edited; backbone "
             f"`{backbone.fingerprint}`. *Cosine*: mean cosine of a photo to its edited version (1: the backbone "
             "cannot tell them apart). *Text picks it*: share of photos for which the weighted sum of the photo and "
             f"the words scores that edit's version highest among the {len(res)} edited versions (the original left "
             f"out; chance {100 / len(res):.0f} %).", "",
             "| edit | words | cosine | photo alone picks it | photo + words pick it |", "|---|---|---|---|---|"]
    for name, r in res.items():
        lines.append(f"| {name} | \"{r['words']}\" | {r['cosine']:.3f} | {100 * r['image_picks']:.0f} % | "
                     f"{100 * r['text_picks']:.0f} % |")
    unseen = [n for n in res if not seen(res[n], len(res))]
    lines += ["", "Edits the backbone does not let words find (not seen by the rule above): "
              + (", ".join(unseen) if unseen else "none") + "."]
    return "\n".join(lines), res
