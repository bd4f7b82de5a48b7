"""Training-free composers: image only, text only, weighted sum (optional negative text)."""
from __future__ import annotations

from typing import List

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

    def compose_many(self, queries: List[Query]) -> List[Composition]:
        if not all(q.text and q.text.strip() for q in queries):
            return super().compose_many(queries)
        return [Composition(normalise(e), {"formula": "q = f_txt(text)", "prompt": q.text})
                for q, e in zip(queries, _encode_all(self.backbone, queries))]


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

    def compose_many(self, queries: List[Query]) -> List[Composition]:
        """With an image and a text each and no negative text (the evaluation's queries): the texts encoded in
        batches, each vector as :meth:`compose` makes it."""
        if not all(q.has_image and q.text and q.text.strip() and not (q.negative_text or "").strip()
                   and 0.0 <= float(q.alpha) <= 1.0 for q in queries):
            return super().compose_many(queries)
        txt = _encode_all(self.backbone, queries)
        return [Composition(normalise((1 - q.alpha) * q.image_embedding.float().cpu() + q.alpha * t),
                            {"formula": "q = (1-a)*img + a*txt", "prompt": q.text})
                for q, t in zip(queries, txt)]


def _encode_all(backbone, queries: List[Query], batch: int = 256) -> torch.Tensor:
    """(Q, D) the queries' texts encoded in batches of ``batch`` (float32, on the CPU)."""
    return torch.cat([backbone.encode_texts([q.text for q in queries[i:i + batch]]).embeddings.float().cpu()
                      for i in range(0, len(queries), batch)])


COMPOSERS.register("image")(lambda backbone, checkpoint_dir=None: ImageOnly(backbone))
COMPOSERS.register("text")(lambda backbone, checkpoint_dir=None: TextOnly(backbone))
COMPOSERS.register("sum")(lambda backbone, checkpoint_dir=None: WeightedSum(backbone))
