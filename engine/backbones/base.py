"""The one interface every vision-language backbone implements."""
from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch
from PIL import Image


@dataclass
class TextEncoding:
    """Normalised text embeddings plus notices (e.g. 'text truncated to 77 tokens')."""

    embeddings: torch.Tensor  # (B, D), L2-normalised
    notices: List[str]


class Backbone(ABC):
    """A frozen image/text encoder pair sharing one embedding space.

    Attributes every implementation sets:
      name          registry name plus variant, e.g. ``open_clip:ViT-B-32/laion2b_s34b_b79k``
      embed_dim     size of the joint (image/text) embedding
      vision_width  width of the visual tokens returned by :meth:`encode_images_with_tokens`
      token_dim     width of the text encoder's input token embeddings (pseudo-words live here)
      context_length  maximum number of text tokens
      placeholder   the text token that a pseudo-word replaces (a single token, e.g. ``*``)
      device        torch device string
      logit_scale   temperature the backbone was trained with (for contrastive losses)
      why           why this backbone is the live one (set by the factory; shown by ``info``)
    """

    name: str
    embed_dim: int
    vision_width: int
    token_dim: int
    context_length: int
    placeholder: str = "*"
    device: str = "cpu"
    logit_scale: float = 100.0
    why: str = ""

    # -- images -------------------------------------------------------------------------
    @abstractmethod
    def preprocess(self, image: Image.Image) -> torch.Tensor:
        """PIL RGB image -> (C, H, W) float tensor ready for :meth:`encode_images`."""

    @abstractmethod
    def encode_images_with_tokens(self, pixels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(B, C, H, W) -> (embeddings (B, D) L2-normalised, visual tokens (B, 1 + P, vision_width)).

        Token 0 is the global token and tokens 1.. are patch tokens, all taken before the
        vision tower's final norm/projection.
        """

    def encode_images(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.encode_images_with_tokens(pixels)[0]

    # -- texts --------------------------------------------------------------------------
    @abstractmethod
    def encode_texts(self, texts: Sequence[str]) -> TextEncoding:
        """Texts -> L2-normalised embeddings (B, D); over-long texts are truncated with a notice."""

    @abstractmethod
    def encode_texts_with_pseudo(self, texts: Sequence[str], pseudo: torch.Tensor) -> torch.Tensor:
        """Encode texts whose placeholder token is replaced by ``pseudo[i]`` (B, token_dim).

        Every text must contain the placeholder exactly once. Differentiable w.r.t. ``pseudo``.
        Returns L2-normalised embeddings (B, D).
        """

    @abstractmethod
    def word_token_embedding(self, word: str) -> torch.Tensor:
        """Input token embedding (token_dim,) of a word that the tokenizer keeps as one token."""

    @abstractmethod
    def count_tokens(self, text: str) -> int:
        """Number of tokens of ``text`` including special tokens."""

    # -- identity -----------------------------------------------------------------------
    @property
    @abstractmethod
    def fingerprint(self) -> str:
        """``name@hash`` where hash covers the weights; stored with every index and checkpoint."""

    def describe(self) -> dict:
        return {
            "name": self.name,
            "fingerprint": self.fingerprint,
            "embed_dim": self.embed_dim,
            "vision_width": self.vision_width,
            "token_dim": self.token_dim,
            "device": self.device,
            "why": self.why,
        }


def bounded_square(image: Image.Image, max_aspect: float = 2.0) -> Image.Image:
    """Crop an elongated image to its central square before a short-side resize + centre crop.

    Those transforms keep only the central square anyway; cropping first bounds their memory whatever the
    aspect ratio (scaling a 4000x1 strip's short side to 224 would make an 896000x224 image). Images
    within ``max_aspect`` are returned unchanged, so ordinary photos give bit-identical pixels."""
    w, h = image.size
    side = min(w, h)
    if side < 1 or max(w, h) <= max_aspect * side:
        return image
    left, top = (w - side) // 2, (h - side) // 2
    return image.crop((left, top, left + side, top + side))


def hash_state_dict(state: dict) -> str:
    """Short, order-independent hash of a module's weights."""
    h = hashlib.sha256()
    for key in sorted(state):
        t = state[key]
        if not isinstance(t, torch.Tensor):
            continue
        h.update(key.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
