"""Routing a learned composer's trust by the *operation* a text asks for.

A learned composer can be better than the weighted sum at some operations (Context-I2W at replacing the
object; RTIC at recolouring) and worse at others, whatever words the text uses. The router reads the
operation from the text embedding: a linear classifier ``p = softmax(W t + b)`` over operation classes
(colour, category, light:<edit>, undo, compose-object, compose-look, and the in-domain kinds), trained on
texts written from templates and open vocabularies alone (``engine.train.router``: no picture needed, and
never a validation or test word or template). Each class has a trust ``w_k`` chosen on validation
(``engine.train.anchor_fit``); a query's share of the learned correction is ``tau = sum_k p_k w_k`` (times
the anchor's image ramp). Each class can also carry the prior's own text weight ``a_k`` (also chosen on
validation): the training-free prior a composer is anchored to is then ``normalise((1 - a) img + a txt)`` with
``a = sum_k p_k a_k``, so "a cat instead" leans on the words (a new object owes little to the reference's
look) and "the same car in red" keeps the reference. On a backbone with a visual block each class can also carry
that block's weight ``v_k`` (``v = sum_k p_k v_k``; engine.compose.anchor.prior), so "the same view by night"
follows the words in the named block and still keeps this very photo in the visual one. The tensors travel in the composer's checkpoint (``anchor.route_*``), the class
names in its record (``anchor_routes``).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch


class Router:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, classes: Sequence[str],
                 trust: Optional[torch.Tensor] = None, alpha: Optional[torch.Tensor] = None,
                 visual: Optional[torch.Tensor] = None):
        k = len(classes)
        if weight.ndim != 2 or weight.shape[0] != k or bias.shape != (k,):
            raise ValueError(f"router tensors do not match its {k} classes")
        self.weight, self.bias = weight.float(), bias.float()
        self.classes: List[str] = list(classes)
        self.trust = torch.zeros(k) if trust is None else trust.float().reshape(k)
        # the prior's text weight per operation (None: the anchor's one alpha for every operation)
        self.alpha = None if alpha is None else alpha.float().reshape(k)
        # the prior's visual-block weight per operation (None: the plain sum's 1 - text weight)
        self.visual = None if visual is None or alpha is None else visual.float().reshape(k)
        for t in (self.weight, self.bias, self.trust, *(x for x in (self.alpha, self.visual) if x is not None)):
            if not torch.isfinite(t).all():
                raise ValueError("router tensors are not finite")
        self.trust = self.trust.clamp(0.0, 1.0)
        self.alpha = None if self.alpha is None else self.alpha.clamp(0.0, 1.0)
        self.visual = None if self.visual is None else self.visual.clamp(0.0, 2.0)

    def probabilities(self, text: torch.Tensor) -> torch.Tensor:
        """(B, D) text embeddings -> (B, K) operation probabilities."""
        t = torch.nn.functional.normalize(text.float(), dim=-1)
        return torch.softmax(t[:, : self.weight.shape[1]] @ self.weight.T + self.bias, dim=-1)

    def share(self, text: torch.Tensor) -> torch.Tensor:
        """(B,) sum_k p_k w_k."""
        return self.probabilities(text) @ self.trust

    def text_weight(self, text: torch.Tensor) -> Optional[torch.Tensor]:
        """(B,) the prior's text weight sum_k p_k a_k (None when the router carries no per-operation weights)."""
        return None if self.alpha is None else self.probabilities(text) @ self.alpha

    def visual_weight(self, text: torch.Tensor) -> Optional[torch.Tensor]:
        """(B,) the prior's visual-block weight sum_k p_k v_k (None without per-operation ones)."""
        return None if self.visual is None else self.probabilities(text) @ self.visual

    def top(self, text: torch.Tensor) -> Tuple[str, float]:
        p = self.probabilities(text[:1])[0]
        i = int(p.argmax())
        return self.classes[i], float(p[i])

    def tensors(self, prefix: str) -> dict:
        out = {prefix + "route_w": self.weight.contiguous(), prefix + "route_b": self.bias.contiguous(),
               prefix + "route_trust": self.trust.contiguous()}
        if self.alpha is not None:
            out[prefix + "route_alpha"] = self.alpha.contiguous()
        if self.visual is not None:
            out[prefix + "route_visual"] = self.visual.contiguous()
        return out
