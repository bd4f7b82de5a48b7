"""Anchoring a learned composer to its training-free prior.

A learned composer (RTIC, Context-I2W) is fitted to the texts and pictures of its training data. Outside
them (a photo of a real scene, a word no training text uses) its output can be worse than the weighted sum,
which already knows what any word means in the backbone's joint space. So the product never uses the
learned vector alone; it uses a correction of the prior, shrunk by how familiar the query is::

    p  = normalise((1 - a) * img + a * txt)              the training-free prior (the weighted sum)
    l  = normalise(learned composer(img, txt))
    f_t = max cosine of txt to the training texts         (text familiarity)
    f_v = max cosine of img to the training-image prototypes   (image familiarity, k-means centres)
    tau = weight * ramp(f_t; text_lo, text_hi) * ramp(f_v; image_lo, image_hi)
    q  = normalise((1 - tau) * p + tau * l)

**Operation familiarity.** A composer trained on "make it cyan" knows the operation "make it <colour>" whatever
the colour is called, so a text can also be judged by its *operation*: its content words (the words that are
not shared by several training texts, e.g. colour and object names) replaced by ``something`` before encoding
("make it teal" -> "make it something"), against a bank of the training texts masked the same way. When the
fit turns it on (``op = 1``), ``f_t`` is that familiarity, so a known operation with a new word is trusted
while a new operation is not. The words kept are stored with the anchor (the record's ``anchor_vocab``).

``ramp(f; lo, hi)`` rises linearly from 0 at ``lo`` to 1 at ``hi`` (a ramp with ``hi <= lo`` is a step at
``hi``; ``lo = hi = -1`` switches that factor off). On a query like the training data ``tau`` is ``weight``;
on an unfamiliar one it falls to 0 and the composer returns the prior. The banks are stored in the
composer's checkpoint (tensors ``anchor.text_bank``, ``anchor.image_bank``) and the ramps in its record
(``anchor``); the ramps and the weight are chosen on validation data held out by domain
(``engine.train.anchor_fit``), never on a test split.
"""
from __future__ import annotations

import re
from abc import abstractmethod
from collections import Counter
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

import torch
import torch.nn.functional as F
from safetensors import safe_open

from ..errors import CheckpointError
from .base import Composer, Composition, Query, normalise
from .baselines import WeightedSum
from .router import Router

PREFIX = "anchor."
STEP_TOLERANCE = 1e-4
MASK = "something"
_WORD = re.compile(r"[a-z]+(?:[-'][a-z]+)*")


def words_of(text: str) -> List[str]:
    return _WORD.findall(text.lower())


def operation_vocabulary(texts: Iterable[str], min_texts: int = 2) -> List[str]:
    """The words of at least ``min_texts`` distinct training texts (the operations' own words: "make", "it",
    "photo", "night"...); the others (a colour or an object named once) are content words."""
    counts = Counter(w for t in set(texts) for w in set(words_of(t)))
    return sorted(w for w, n in counts.items() if n >= min_texts)


def mask_content(text: str, vocab) -> str:
    """``text`` with every word outside ``vocab`` replaced by :data:`MASK` (runs of them by one)."""
    out: List[str] = []
    for w in words_of(text):
        tok = w if w in vocab else MASK
        if not (tok == MASK and out and out[-1] == MASK):
            out.append(tok)
    return " ".join(out) or MASK


@dataclass
class AnchorConfig:
    weight: float = 1.0
    text_lo: float = -1.0
    text_hi: float = -1.0
    image_lo: float = -1.0
    image_hi: float = -1.0
    alpha: float = 0.5          # the prior's text weight
    op: float = 0.0             # 1: text familiarity is operation familiarity (content words masked)
    route: float = 0.0          # 1: the share is the operation router's (engine.compose.router) times the image ramp
    visual_from: float = 0.0    # > 0: the first dimension of the backbone's visual block, whose prior weight the
    #                             router sets apart from the text weight (see prior()); 0: one text weight

    @classmethod
    def from_dict(cls, data: dict) -> "AnchorConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in (data or {}).items() if k in known})

    def to_dict(self) -> dict:
        """The record's ``anchor``; ``op`` only when on (records written before it existed stay the same)."""
        return {k: round(float(v), 6) for k, v in asdict(self).items() if k not in ("op", "route", "visual_from") or v}


def ramp(f: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    if lo <= -1.0 and hi <= -1.0:
        return torch.ones_like(f)
    if hi <= lo:  # a step; the tolerance keeps a text equal to a bank entry at familiarity 1 whatever the
        return (f >= hi - STEP_TOLERANCE).to(f.dtype)  # batch it was encoded in (padding moves the last bits)
    return ((f - lo) / (hi - lo)).clamp(0.0, 1.0)


def familiarity(x: torch.Tensor, bank: Optional[torch.Tensor]) -> torch.Tensor:
    """(B,) largest cosine of each row of ``x`` (B, D) to the rows of ``bank`` (M, D); 1 without a bank."""
    if bank is None or bank.numel() == 0:
        return torch.ones(x.shape[0])
    return (F.normalize(x.float(), dim=-1) @ F.normalize(bank.float(), dim=-1).T).max(dim=-1).values


def prior(image: torch.Tensor, text: torch.Tensor, alpha, visual=None, split: int = 0) -> torch.Tensor:
    """(B, D) the normalised weighted sum of normalised image and text embeddings; ``alpha`` (the text's weight)
    is one number or one per query (B,).

    **Channel-aware prior** (``visual`` given, ``split`` > 0): a backbone whose image embeddings end in a visual
    block that texts leave at zero (the packaged backbone's visual channel, engine.backbones.visual) has the
    plain sum's visual block at ``(1 - alpha)`` times the reference's, so a text weight high enough to take the
    words' object or edit also drops what the reference looks like. Here the dimensions from ``split`` on are
    ``visual`` times the reference's instead (one number or (B,)): "the same view by night" can follow the
    words in the named block and still keep this very photo in the visual one. ``visual = 1 - alpha`` is the
    plain sum."""
    a = alpha.float().reshape(-1, 1) if isinstance(alpha, torch.Tensor) else float(alpha)
    img, txt = F.normalize(image.float(), dim=-1), F.normalize(text.float(), dim=-1)
    p = (1 - a) * img + a * txt
    if visual is not None and 0 < split < p.shape[-1]:
        b = visual.float().reshape(-1, 1) if isinstance(visual, torch.Tensor) else float(visual)
        p = torch.cat([p[:, :split], b * img[:, split:]], dim=-1)
    return F.normalize(p, dim=-1)


class Anchor:
    """The banks and ramps of one composer (see the module text)."""

    def __init__(self, config: Optional[AnchorConfig] = None, text_bank: Optional[torch.Tensor] = None,
                 image_bank: Optional[torch.Tensor] = None, op_bank: Optional[torch.Tensor] = None,
                 vocab: Sequence[str] = (), router=None):
        self.config = config or AnchorConfig()
        self.text_bank = None if text_bank is None else F.normalize(text_bank.float(), dim=-1)
        self.image_bank = None if image_bank is None else F.normalize(image_bank.float(), dim=-1)
        self.op_bank = None if op_bank is None else F.normalize(op_bank.float(), dim=-1)
        self.vocab = frozenset(vocab)
        self.router = router  # engine.compose.router.Router or None

    @property
    def routed(self) -> bool:
        return bool(self.config.route) and self.router is not None

    @property
    def uses_operations(self) -> bool:
        return bool(self.config.op) and self.op_bank is not None and bool(self.vocab)

    def mask(self, text: str) -> str:
        return mask_content(text, self.vocab)

    def familiarities(self, image: torch.Tensor, text: torch.Tensor, op_text: Optional[torch.Tensor] = None):
        """(text familiarity, image familiarity); the text's is its operation's when the anchor uses them
        (``op_text``: the embeddings of the masked texts, :func:`operation_text`)."""
        if self.uses_operations and op_text is not None:
            return familiarity(op_text, self.op_bank), familiarity(image, self.image_bank)
        return familiarity(text, self.text_bank), familiarity(image, self.image_bank)

    def text_weight(self, text: torch.Tensor):
        """The prior's text weight: one per query (B,) from the router's per-operation weights when it has them,
        else the config's one ``alpha``."""
        if self.routed:
            a = self.router.text_weight(text)
            if a is not None:
                return a
        return self.config.alpha

    def visual_weight(self, text: torch.Tensor):
        """The prior's visual-block weight per query (B,) from the router's per-operation weights (see
        :func:`prior`); None (the plain sum) when the anchor does not set it apart."""
        if self.routed and self.config.visual_from > 0:
            return self.router.visual_weight(text)
        return None

    def prior(self, image: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """(B, D) the training-free prior this anchor blends with (:func:`prior` at its weights)."""
        return prior(image, text, self.text_weight(text), self.visual_weight(text), int(self.config.visual_from))

    def trust(self, image: torch.Tensor, text: torch.Tensor, op_text: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(B,) the share tau of the learned correction for each query."""
        c = self.config
        ft, fv = self.familiarities(image, text, op_text)
        if self.routed:
            return self.router.share(text) * ramp(fv, c.image_lo, c.image_hi)
        return c.weight * ramp(ft, c.text_lo, c.text_hi) * ramp(fv, c.image_lo, c.image_hi)

    def blend(self, image: torch.Tensor, text: torch.Tensor, learned: torch.Tensor,
              tau: Optional[torch.Tensor] = None) -> torch.Tensor:
        """(B, D) normalise((1 - tau) * prior + tau * normalise(learned))."""
        tau = self.trust(image, text) if tau is None else tau
        p = self.prior(image, text)
        return F.normalize((1 - tau)[:, None] * p + tau[:, None] * F.normalize(learned.float(), dim=-1), dim=-1)

    def explain_blend(self, image: torch.Tensor, text: torch.Tensor, learned: torch.Tensor,
                      op_text: Optional[torch.Tensor] = None):
        """(blended (B, D), explanation of the first query: familiarities, trust, formula)."""
        ft, fv = self.familiarities(image, text, op_text)
        tau = self.trust(image, text, op_text)
        expl = {"anchor": "q = normalise((1 - tau) * weighted sum + tau * learned)",
                "trust": round(float(tau[0]), 4), "text_familiarity": round(float(ft[0]), 4),
                "image_familiarity": round(float(fv[0]), 4)}
        if self.routed:
            name, prob = self.router.top(text)
            expl["operation"] = {"name": name, "probability": round(prob, 3),
                                 "trust": round(float(self.router.trust[self.router.classes.index(name)]), 3)}
            a = self.text_weight(text)
            expl["prior_text_weight"] = round(float(a[0] if isinstance(a, torch.Tensor) else a), 3)
            v = self.visual_weight(text)
            if v is not None:
                expl["prior_visual_weight"] = round(float(v[0]), 3)
        elif self.uses_operations and op_text is not None:
            expl["familiarity_of"] = "the operation (content words masked)"
        return self.blend(image, text, learned, tau), expl

    def record_extra(self) -> dict:
        """What the composer's record stores beside ``anchor`` (the config)."""
        out = {"anchor_vocab": sorted(self.vocab)} if self.vocab else {}
        if self.router is not None:
            out["anchor_routes"] = list(self.router.classes)
        return out

    # -- storage inside the composer's checkpoint ---------------------------------------------------------

    def tensors(self) -> Dict[str, torch.Tensor]:
        out = {}
        if self.text_bank is not None:
            out[PREFIX + "text_bank"] = self.text_bank.contiguous()
        if self.image_bank is not None:
            out[PREFIX + "image_bank"] = self.image_bank.contiguous()
        if self.op_bank is not None:
            out[PREFIX + "op_bank"] = self.op_bank.contiguous()
        if self.router is not None:
            out.update(self.router.tensors(PREFIX))
        return out


def operation_text(anchor: Optional[Anchor], backbone, texts: Sequence[str]) -> Optional[torch.Tensor]:
    """(B, D) embeddings of ``texts`` with their content words masked, when ``anchor`` judges operations."""
    if anchor is None or not anchor.uses_operations:
        return None
    return backbone.encode_texts([anchor.mask(t) for t in texts]).embeddings.detach().float().cpu()



def blend_many(anchor: Optional[Anchor], backbone, image: torch.Tensor, text: torch.Tensor, learned: torch.Tensor,
               texts: Sequence[str]):
    """((B, D) the anchored vectors, (B,) each query's share tau) for a batch (tau 1 without an anchor: the
    learned vectors as they are)."""
    if anchor is None:
        return learned, torch.ones(learned.shape[0])
    tau = anchor.trust(image, text, operation_text(anchor, backbone, texts))
    return anchor.blend(image, text, learned, tau), tau


def composable(queries) -> bool:
    """Whether every query has an image and a text (a learned composer's batch path; else one at a time)."""
    return all(q.has_image and q.text and q.text.strip() for q in queries)


class AnchoredComposer(Composer):
    """A learned composer with an optional :class:`Anchor` (``self.anchor``): the batch path they share. Per
    chunk of :attr:`batch` queries the subclass's :meth:`learned_batch` gives the learned vectors, and the
    anchor blends them with the prior as :meth:`compose` does one query at a time."""

    anchor: Optional[Anchor] = None
    batch = 64

    def batchable(self, queries: List[Query]) -> bool:
        return composable(queries)

    @abstractmethod
    def learned_batch(self, chunk: List[Query], image: torch.Tensor, texts: List[str]) -> tuple:
        """((B, D) learned vectors, (B, D) the texts' embeddings or None when the composer did not encode them
        itself) for one chunk; ``image``: the (B, D) reference embeddings."""

    @torch.no_grad()
    def compose_many(self, queries: List[Query]) -> List[Composition]:
        if not self.batchable(queries):
            return super().compose_many(queries)
        out: List[Composition] = []
        for i in range(0, len(queries), self.batch):
            chunk = queries[i : i + self.batch]
            texts = [q.text for q in chunk]
            image = torch.stack([q.image_embedding.detach().float().cpu().reshape(-1) for q in chunk])
            vec, text = self.learned_batch(chunk, image, texts)
            if text is None and self.anchor is not None:
                text = self.backbone.encode_texts(texts).embeddings.float().cpu()
            vec, tau = blend_many(self.anchor, self.backbone, image, text, vec, texts)
            out += [Composition(normalise(v), {"trust": round(float(t), 4)} if self.anchor is not None else {})
                    for v, t in zip(vec, tau)]
        return out


def split_state(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """``state`` without the anchor's tensors (what the composer's own module loads)."""
    return {k: v for k, v in state.items() if not k.startswith(PREFIX)}


def load_anchor(path, record: dict) -> Optional[Anchor]:
    """The anchor stored in a composer's checkpoint file (None for one written before anchoring existed);
    CheckpointError naming the file when it is there but cannot be read."""
    if not isinstance(record.get("anchor"), dict):
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            keys = set(f.keys())
            text = f.get_tensor(PREFIX + "text_bank") if PREFIX + "text_bank" in keys else None
            image = f.get_tensor(PREFIX + "image_bank") if PREFIX + "image_bank" in keys else None
            ops = f.get_tensor(PREFIX + "op_bank") if PREFIX + "op_bank" in keys else None
            route = {k: f.get_tensor(PREFIX + k) for k in ("route_w", "route_b", "route_trust", "route_alpha", "route_visual")
                     if PREFIX + k in keys}
        vocab = record.get("anchor_vocab") or ()
        if not (isinstance(vocab, (list, tuple)) and all(isinstance(w, str) for w in vocab)):
            raise ValueError("anchor_vocab is not a list of words")
        router = None
        if {"route_w", "route_b", "route_trust"} <= set(route):
            router = Router(route["route_w"], route["route_b"], record.get("anchor_routes") or [], route["route_trust"],
                            route.get("route_alpha"), route.get("route_visual"))
        return Anchor(AnchorConfig.from_dict(record["anchor"]), text, image, ops, vocab, router)
    except Exception as exc:
        raise CheckpointError(f"{Path(path).name}: its prior anchor cannot be read ({exc.__class__.__name__})") from None


def kmeans_prototypes(x: torch.Tensor, k: int = 64, iters: int = 25, seed: int = 0) -> torch.Tensor:
    """(min(k, N), D) spherical k-means centres of the normalised rows of ``x`` (the image bank)."""
    x = F.normalize(x.float(), dim=-1)
    g = torch.Generator().manual_seed(seed)
    k = min(k, x.shape[0])
    centres = x[torch.randperm(x.shape[0], generator=g)[:k]].clone()
    for _ in range(iters):
        assign = (x @ centres.T).argmax(dim=-1)
        for j in range(k):
            members = x[assign == j]
            if len(members):
                centres[j] = F.normalize(members.mean(dim=0), dim=0)
    return centres


def prior_only(composer, query, why: str):
    """The composition a learned composer returns when it has nothing to correct (the image or the text is
    missing): the weighted sum at the anchor's text weight (0.5 without an anchor), saying so."""
    anchor = getattr(composer, "anchor", None)
    q = replace(query, alpha=anchor.config.alpha if anchor is not None else 0.5)
    comp = WeightedSum(composer.backbone).compose(q)
    query.text_embedding, query.text_notices = q.text_embedding, q.text_notices
    comp.explanation = {**comp.explanation, "prior_only": f"{why}; with one of them missing the training-free "
                        "composition is used", "trust": 0.0}
    return comp
