"""Training-free composers: image only, text only, weighted sum (optional negative text)."""
from __future__ import annotations

import torch

from ..errors import InputError
from .base import COMPOSERS, Composer, Composition, Query, encoded_text, normalise


class ImageOnly(Composer):
    name, label, needs_image = "image", "Image only", True

    def compose(self, query: Query) -> Composition:
        self.check(query)
        return Composition(normalise(query.image_embedding), {"formula": "q = f_img(reference)"})


class TextOnly(Composer):
    name, label, needs_text = "text", "Text only", True

    def compose(self, query: Query) -> Composition:
        self.check(query)
        emb, notices = encoded_text(self.backbone, query)
        return Composition(normalise(emb), {"formula": "q = f_txt(text)", "prompt": query.text}, notices)


class WeightedSum(Composer):
    """q = normalise((1 - a) * img + a * txt - a * neg); with one input missing it degrades to the other."""

    name, label, uses_alpha = "sum", "Image + text (weighted sum)", True

    def compose(self, query: Query) -> Composition:
        a = float(query.alpha)
        if not 0.0 <= a <= 1.0:
            raise InputError(f"alpha must be in [0, 1], got {a}")
        has_text = bool(query.text and query.text.strip())
        if not query.has_image and not has_text:
            raise InputError("give a reference image, a modification text, or both")
        notices = []
        d = self.backbone.embed_dim
        img = query.image_embedding.float() if query.has_image else torch.zeros(d)
        txt = torch.zeros(d)
        if has_text:
            txt, notices = encoded_text(self.backbone, query)
            txt = txt.float().cpu()
        neg = torch.zeros(d)
        if query.negative_text and query.negative_text.strip():
            enc = self.backbone.encode_texts([query.negative_text])
            neg = enc.embeddings[0].float().cpu()
            notices += enc.notices
        wi = (1 - a) if query.has_image else 0.0
        wt = a if has_text else 0.0
        if query.has_image and not has_text:
            wi = 1.0
        if has_text and not query.has_image:
            wt = 1.0
        wn = wt if query.negative_text and query.negative_text.strip() else 0.0
        vec = wi * img.cpu() + wt * txt - wn * neg
        expl = {
            "formula": "q = (1-a)*img + a*txt - a*neg",
            "weights": {"image": wi, "text": wt, "negative": wn},
            "prompt": query.text or "",
        }
        return Composition(normalise(vec), expl, notices)


COMPOSERS.register("image")(lambda backbone, checkpoint_dir=None: ImageOnly(backbone))
COMPOSERS.register("text")(lambda backbone, checkpoint_dir=None: TextOnly(backbone))
COMPOSERS.register("sum")(lambda backbone, checkpoint_dir=None: WeightedSum(backbone))
