"""Query-expansion interface: re-form a query from its top results."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

import numpy as np

from ..registry import Registry


class ExpanderUnavailable(Exception):
    """Raised by an expander factory when it cannot run here (e.g. no checkpoint)."""


@dataclass
class Expansion:
    vector: np.ndarray  # (D,) float32, L2-normalised, in the gallery's embedding space
    weights: np.ndarray  # (n,) weight given to each neighbour (rank order)
    explanation: Dict[str, Any] = field(default_factory=dict)


class Expander(ABC):
    name: str = ""
    label: str = ""
    reads_text: bool = False  # True: expand() uses the query's modification-text embedding (the search encodes it)

    @abstractmethod
    def expand(self, query: np.ndarray, neighbours: np.ndarray, sims: np.ndarray,
               text: Optional[np.ndarray] = None) -> Expansion:
        """query (D,), neighbours (n, D) in rank order, sims (n,) their similarity to the query; ``text`` (D,):
        the embedding of the query's modification text (None for an image-only query). Only an expander that
        reads the text (text-conditioned LAttQE) uses it; the others ignore it."""


def expander_reads_text(expander) -> bool:
    """Whether ``expander`` reads the query's modification text (``reads_text``; a plugin that does not subclass
    :class:`Expander` and has no such attribute does not)."""
    return bool(getattr(expander, "reads_text", False))


def expand_query(expander, query: np.ndarray, neighbours: np.ndarray, sims: np.ndarray, text=None) -> Expansion:
    """``expander.expand`` with the modification text's embedding handed only to an expander that reads it
    (``reads_text``): one written to the three-argument ``expand(query, neighbours, sims)`` keeps working. The one
    call the search and the evaluations make."""
    if expander_reads_text(expander):
        return expander.expand(query, neighbours, sims, text=text)
    return expander.expand(query, neighbours, sims)


def l2n(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32)
    n = np.linalg.norm(v, axis=-1, keepdims=True)
    return v / np.maximum(n, 1e-12)


class NoExpansion(Expander):
    name, label = "none", "No expansion"

    def expand(self, query, neighbours, sims, text=None):
        return Expansion(l2n(query), np.zeros(len(neighbours), np.float32), {})


# name -> factory(embed_dim, checkpoint_dir, fingerprint) -> Expander (raises ExpanderUnavailable)
EXPANDERS: Registry[Expander] = Registry("expander")
EXPANDERS.register("none")(lambda embed_dim=None, checkpoint_dir=None, fingerprint=None: NoExpansion())
