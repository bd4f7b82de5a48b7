"""Composer interface: (reference image and/or text, options) -> query vector + explanation."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from ..backbones.base import Backbone
from ..errors import InputError
from ..registry import Registry


class ComposerUnavailable(Exception):
    """Raised by a composer factory when it cannot run here (reason in the message)."""


@dataclass
class Query:
    """Everything a composer may use. Image features are computed once by the engine and cached."""

    text: Optional[str] = None
    image_embedding: Optional[torch.Tensor] = None  # (D,) L2-normalised
    image_tokens: Optional[torch.Tensor] = None  # (1 + P, vision_width)
    has_image: bool = False
    alpha: float = 0.5
    negative_text: Optional[str] = None
    options: Dict[str, Any] = field(default_factory=dict)
    # ``text`` encoded once (:func:`encoded_text`), whichever composers (the automatic method and the one it
    # routes to) and the explanation read it; with the encoder's notices (a truncated text...)
    text_embedding: Optional[torch.Tensor] = None
    text_notices: List[str] = field(default_factory=list)


def encoded_text(backbone: Backbone, query: Query) -> Tuple[torch.Tensor, List[str]]:
    """(the (D,) embedding of ``query.text``, the encoder's notices), encoded on the first call for this query
    and reused after."""
    if query.text_embedding is None:
        enc = backbone.encode_texts([query.text])
        query.text_embedding, query.text_notices = enc.embeddings[0], list(enc.notices)
    return query.text_embedding, list(query.text_notices)


@dataclass
class Composition:
    vector: np.ndarray  # (D,) float32, L2-normalised
    explanation: Dict[str, Any] = field(default_factory=dict)
    notices: List[str] = field(default_factory=list)


class Composer(ABC):
    name: str = ""
    label: str = ""
    needs_image: bool = False
    needs_text: bool = False
    uses_alpha: bool = False

    def __init__(self, backbone: Backbone):
        self.backbone = backbone

    @abstractmethod
    def compose(self, query: Query) -> Composition:
        ...

    def compose_many(self, queries: List[Query]) -> List[Composition]:
        """Each query's composition (evaluation's batch path). The learned composers answer queries that have an
        image and a text in batches (one text-encoder pass for many); their vectors equal :meth:`compose`'s and
        each explanation keeps at least the share ``trust`` of the learned correction."""
        return [self.compose(q) for q in queries]

    def check(self, query: Query) -> None:
        if self.needs_image and not query.has_image:
            raise InputError(f"{self.label} needs a reference image")
        if self.needs_text and not (query.text and query.text.strip()):
            raise InputError(f"{self.label} needs a modification text")


def normalise(v: torch.Tensor) -> np.ndarray:
    v = v.detach().float().reshape(-1)
    n = v.norm()
    if not torch.isfinite(n) or n.item() == 0:
        raise InputError("the composed query is empty (all zeros); give an image or a text")
    return (v / n).cpu().numpy().astype(np.float32)


# name -> factory(backbone, checkpoint_dir) -> Composer (raises ComposerUnavailable)
COMPOSERS: Registry[Composer] = Registry("composer")
