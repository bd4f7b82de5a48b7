"""Routing a learned composer's trust by the *operation* a text asks for.

A learned composer can be better than the weighted sum at some operations (Context-I2W at replacing the
object; RTIC at recolouring) and worse at others, whatever words the text uses. The router reads the
operation from the text embedding: a linear classifier ``p = softmax(W t + b)`` over operation classes
(colour, category, light:<edit>, undo, compose-object, compose-look, and the in-domain kinds), trained on
texts written from templates and open vocabularies alone (``engine.train.router``: no picture needed, and
never a validation or test word or template). Each class has a trust ``w_k`` chosen on validation
(``engine.train.anchor_fit``); a query's share of the learned correction is ``tau = sum_k p_k w_k`` (times
the anchor's image ramp). The tensors travel in the composer's checkpoint (``anchor.route_*``), the class
names in its record (``anchor_routes``).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch


class Router:
    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, classes: Sequence[str],
                 trust: Optional[torch.Tensor] = None):
        k = len(classes)
        if weight.ndim != 2 or weight.shape[0] != k or bias.shape != (k,):
            raise ValueError(f"router tensors do not match its {k} classes")
        self.weight, self.bias = weight.float(), bias.float()
        self.classes: List[str] = list(classes)
        self.trust = torch.zeros(k) if trust is None else trust.float().reshape(k).clamp(0.0, 1.0)
        if not torch.isfinite(self.weight).all() or not torch.isfinite(self.bias).all():
            raise ValueError("router tensors are not finite")

    def probabilities(self, text: torch.Tensor) -> torch.Tensor:
        """(B, D) text embeddings -> (B, K) operation probabilities."""
        t = torch.nn.functional.normalize(text.float(), dim=-1)
        return torch.softmax(t[:, : self.weight.shape[1]] @ self.weight.T + self.bias, dim=-1)

    def share(self, text: torch.Tensor) -> torch.Tensor:
        """(B,) sum_k p_k w_k."""
        return self.probabilities(text) @ self.trust

    def top(self, text: torch.Tensor) -> Tuple[str, float]:
        p = self.probabilities(text[:1])[0]
        i = int(p.argmax())
        return self.classes[i], float(p[i])

    def tensors(self, prefix: str) -> dict:
        return {prefix + "route_w": self.weight.contiguous(), prefix + "route_b": self.bias.contiguous(),
                prefix + "route_trust": self.trust.contiguous()}
