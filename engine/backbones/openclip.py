"""open_clip backbones: any architecture with a pretrained tag or a local weights file, and tiny
random-weight configurations (``configs/tiny-*.json``) for fast tests."""
from __future__ import annotations

import copy
import logging
import os
import socket
from pathlib import Path
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from PIL import Image

from ..errors import EngineError
from .base import Backbone, TextEncoding, bounded_square, hash_state_dict

log = logging.getLogger(__name__)
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
DEFAULT_ARCH, DEFAULT_TAG = "ViT-B-32", "laion2b_s34b_b79k"
HUB_HOST = "huggingface.co"

# The Context-I2W authors' placeholder for the OpenAI CLIP BPE: the vocabulary's last merge is dropped and
# its id (49405, just below <start_of_text> 49406 and <end_of_text> 49407) becomes a special token, so the
# pseudo-word slot is a token no caption ever produces. Other tokenizers keep ``*`` (documented in
# docs/context_i2w.md).
REPLACE_TOKEN, REPLACE_ID, OPENAI_BPE_VOCAB = "<|replace|>", 49405, 49408


def with_replace_token(tokenizer):
    """A copy of open_clip's OpenAI-BPE ``SimpleTokenizer`` in which ``<|replace|>`` is the single token
    49405 (the id of the dropped last merge), or None when ``tokenizer`` is not that tokenizer."""
    import regex
    from open_clip.tokenizer import SimpleTokenizer

    if type(tokenizer) is not SimpleTokenizer or len(tokenizer.encoder) != OPENAI_BPE_VOCAB:
        return None
    last_merge = max(tokenizer.bpe_ranks, key=tokenizer.bpe_ranks.get)
    freed = "".join(last_merge)
    if tokenizer.encoder.get(freed) != REPLACE_ID:
        return None
    tok = copy.copy(tokenizer)
    tok.bpe_ranks = {m: r for m, r in tokenizer.bpe_ranks.items() if m != last_merge}
    tok.encoder = {t: i for t, i in tokenizer.encoder.items() if t != freed}
    tok.encoder[REPLACE_TOKEN] = REPLACE_ID
    tok.decoder = {i: t for t, i in tok.encoder.items()}
    specials = [tok.decoder[tokenizer.sot_token_id], tok.decoder[tokenizer.eot_token_id], REPLACE_TOKEN]
    tok.cache = {t: t for t in specials}  # words that used the dropped merge are split afresh
    # open_clip's own pre-tokeniser, with the new token matched first ('|' must be escaped)
    tok.pat = regex.compile(regex.escape(REPLACE_TOKEN) + "|" + tokenizer.pat.pattern, tokenizer.pat.flags)
    tok.all_special_ids = [tok.encoder[t] for t in specials]
    return tok


def _register_tiny_configs():
    import open_clip

    if "tiny-vit-a" not in open_clip.list_models():
        open_clip.add_model_config(CONFIG_DIR)


def hub_reachable(timeout: float = 2.0, offline: bool = False) -> bool:
    """True when the model hub answers a TCP connect within ``timeout`` seconds (never retries); False at once
    when ``offline`` (``HF_HUB_OFFLINE=1``: the caller's ``Settings.hf_hub_offline``)."""
    if offline:
        return False
    try:
        with socket.create_connection((HUB_HOST, 443), timeout=timeout):
            return True
    except OSError:
        return False


# open_clip's hub repository of the default weights, so the ``auto`` backbone's "is it cached?" look-up at every
# start need not import open_clip (most of a second) only to find that it is not (a test checks it against
# open_clip's own table)
DEFAULT_HUB_ID = "laion/CLIP-ViT-B-32-laion2B-s34B-b79K/"


def pretrained_hub_id(arch: str, tag: str) -> str:
    """The model-hub repository open_clip downloads (arch, tag) from ("" when none)."""
    if (arch, tag) == (DEFAULT_ARCH, DEFAULT_TAG):
        return DEFAULT_HUB_ID
    from open_clip.pretrained import get_pretrained_cfg

    return (get_pretrained_cfg(arch, tag) or {}).get("hf_hub", "")


def pretrained_cached(arch: str, tag: str) -> bool:
    """True when the weights for (arch, tag) are already in the local hub cache."""
    hub_id = pretrained_hub_id(arch, tag)
    if hub_id:
        from huggingface_hub import try_to_load_from_cache

        parts = hub_id.strip("/").split("/")
        repo = "/".join(parts[:2])
        for fname in ("open_clip_model.safetensors", "open_clip_pytorch_model.bin"):
            hit = try_to_load_from_cache(repo, fname)
            if isinstance(hit, str) and os.path.exists(hit):
                return True
    return False


class OpenClipBackbone(Backbone):
    placeholder = "*"

    def __init__(self, arch: str = DEFAULT_ARCH, pretrained: Optional[str] = DEFAULT_TAG, device: str = "cpu",
                 precision: Optional[str] = None, seed: int = 0):
        import open_clip

        _register_tiny_configs()
        if precision is None:
            precision = "fp16" if device.startswith("cuda") else "fp32"
        if not pretrained:
            torch.manual_seed(seed)  # random weights are reproducible, so is their fingerprint
        try:
            model, _, preprocess = open_clip.create_model_and_transforms(
                arch, pretrained=pretrained or None, device=device, precision=precision
            )
        except RuntimeError as exc:
            raise EngineError(f"could not load open_clip {arch} / {pretrained}: {exc}") from None
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        if not hasattr(model, "token_embedding") or not hasattr(model.visual, "_embeds"):
            raise EngineError(f"open_clip {arch}: only CLIP models with a ViT image tower are supported")
        self._preprocess = preprocess
        self.tokenizer = open_clip.get_tokenizer(arch)
        replace_tok = with_replace_token(self.tokenizer)
        if replace_tok is not None and model.token_embedding.weight.shape[0] == OPENAI_BPE_VOCAB:
            self.tokenizer, self.placeholder = replace_tok, REPLACE_TOKEN
        self.device, self.precision = device, precision
        tag = pretrained if pretrained and not os.path.exists(str(pretrained)) else (
            Path(pretrained).name if pretrained else "random")
        self.name = f"open_clip:{arch}/{tag}"
        self.embed_dim = int(model.text_projection.shape[1] if model.text_projection is not None
                             else model.token_embedding.weight.shape[1])
        self.vision_width = int(model.visual.class_embedding.shape[0])
        self.token_dim = int(model.token_embedding.weight.shape[1])
        self.context_length = int(model.context_length)
        self.logit_scale = float(model.logit_scale.exp().item())
        ids = self.tokenizer.encode(self.placeholder) if hasattr(self.tokenizer, "encode") else None
        self.placeholder_id = int(ids[0]) if ids and len(ids) == 1 else int(self.tokenizer([self.placeholder])[0, 1])
        self._fp = f"{self.name}@{hash_state_dict(model.state_dict())}"

    @property
    def fingerprint(self) -> str:
        return self._fp

    @property
    def cast_dtype(self):
        return self.model.transformer.get_cast_dtype()

    # -- images ------------------------------------------------------------------------
    def preprocess(self, image: Image.Image) -> torch.Tensor:
        return self._preprocess(bounded_square(image).convert("RGB"))

    def encode_images_with_tokens(self, pixels) -> Tuple[torch.Tensor, torch.Tensor]:
        visual = self.model.visual
        with torch.no_grad():
            x = visual._embeds(pixels.to(self.device, dtype=self.cast_dtype))
            x = visual.transformer(x)
            tokens = x  # global (class) token + patch tokens, before ln_post
            pooled, _ = visual._pool(x)
            if visual.proj is not None:
                pooled = pooled @ visual.proj
        return F.normalize(pooled.float(), dim=-1), tokens.float()

    # -- texts -------------------------------------------------------------------------
    def _tokens(self, texts):
        notices = []
        for t in texts:
            n = self.count_tokens(t)
            if n > self.context_length:
                notices.append(f"text truncated to {self.context_length} tokens (it had {n})")
        return self.tokenizer(list(texts)).to(self.device), notices

    def _encode_token_embeddings(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        m = self.model
        x = x + m.positional_embedding.to(x.dtype)
        x = m.transformer(x, attn_mask=m.attn_mask)
        x = m.ln_final(x)
        from open_clip.transformer import text_global_pool

        x = text_global_pool(x, ids, m.text_pool_type, eos_token_id=getattr(m, "text_eos_id", None))
        if m.text_projection is not None:
            x = m.text_projection(x) if isinstance(m.text_projection, torch.nn.Linear) else x @ m.text_projection
        return F.normalize(x.float(), dim=-1)

    def encode_texts(self, texts):
        ids, notices = self._tokens(texts)
        with torch.no_grad():
            emb = self._encode_token_embeddings(self.model.token_embedding(ids).to(self.cast_dtype), ids)
        return TextEncoding(emb, notices)

    def encode_texts_with_pseudo(self, texts, pseudo):
        ids, _ = self._tokens(texts)
        where = ids == self.placeholder_id
        if not bool((where.sum(1) == 1).all()):
            raise EngineError(f"every prompt must contain the placeholder {self.placeholder!r} exactly once")
        x = self.model.token_embedding(ids).to(self.cast_dtype)
        x = torch.where(where.unsqueeze(-1), pseudo.to(x.dtype).unsqueeze(1).expand_as(x), x)
        return self._encode_token_embeddings(x, ids)

    def word_token_embedding(self, word):
        ids = self.tokenizer.encode(word)
        if len(ids) != 1:
            raise EngineError(f"{word!r} is not a single token for this tokenizer")
        return self.model.token_embedding.weight[ids[0]].detach().float().clone()

    def count_tokens(self, text):
        return len(self.tokenizer.encode(text)) + 2
