"""Context-I2W: context-dependent image-to-word mapping for zero-shot composed image retrieval
(Tang et al., AAAI 2024), as a composer.

The mapper turns the visual tokens of the reference image into one pseudo-word token S* in the
text encoder's token-embedding space; S* depends on a *context embedding* c (the frozen text
encoder's embedding of a prompt that holds the placeholder in place of the subject)::

    x      = (W_R t_i) * (W_c c)          Intent View Selector: weight-normalised "rotation" W_R of every
                                          visual token t_i, modulated element-wise by the projected context
    L^0    = learnable latents (n, W)     Visual Target Extractor: ``depth`` blocks of
    L^k    = L' + FF(L'),  L' = L^(k-1) + Attn(q = L^(k-1), kv = [x_patches ; L^(k-1)])
    local  = mean_n LN(L^depth)
    g      = MLP_g(LN_g(x_0) P_g)         global branch (class token)
    l      = MLP_l(LN_l(local) P_l)       local branch
    S*     = g + tanh(gate) * l           the gate starts at 0, so training starts from the global branch

At inference the context is the text encoder's embedding of ``template`` (default
``"a photo of * , {text}"``) with the modification text, and the query vector is the text
encoder's embedding of the same prompt with S* written over the placeholder. Templates mark the slot
with ``*``; the prompt carries the backbone's placeholder token there: ``<|replace|>`` (id 49405, as in
the authors' code) with the OpenAI CLIP BPE, ``*`` with other tokenizers. The gallery is
searched by text-to-image similarity.

Note on scale: every path from ``c`` to S* goes through a LayerNorm (``LN_g`` on the class token, the
extractor's token norm on the patches), so S* does not depend on the length of ``c``; our backbones
return L2-normalised text embeddings, the authors' code fed unnormalised ones, and the two agree.

Checkpoints are ``context_i2w-<backbone>.safetensors`` in the one record format of :mod:`engine.checkpoints`
(:func:`save_context_i2w`, :func:`load_context_i2w`; the record, in the metadata and the ``.json`` sidecar, holds
the config with the template, the placeholder and its token id, the backbone fingerprint, the recipe and the
trainer's figures; files of the older format 1 are refused). :func:`load_authors_checkpoint` maps the authors'
released ``IM2TEXT_OWM_Attn`` state dict (ViT-L/14) onto :class:`ContextI2WMapper`, weight-norm parameters
included.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..checkpoints import describe_search_path, figures_of, find, load, load_first, make_record, part, write
from ..errors import CheckpointError, InputError
from .anchor import Anchor, AnchoredComposer, load_anchor, operation_text, prior_only, split_state
from .base import COMPOSERS, ComposerUnavailable, Composition, Query, encoded_text, normalise

TEMPLATE_MARK = "*"  # where S* goes in a written template; the prompt holds the placeholder token there
DEFAULT_TEMPLATE = "a photo of * , {text}"
DEFAULT_TRAIN_PROMPT = "a photo of *"


@dataclass
class ContextI2WConfig:
    """Architecture and prompts of one mapper (stored in every checkpoint)."""

    vision_width: int  # width of the visual tokens (backbone.vision_width)
    token_dim: int  # width of the text encoder's token embeddings: S* lives here
    context_dim: int  # size of the context embedding (backbone.embed_dim)
    proj_dim: Optional[int] = None  # output of the branch projections P_g / P_l (default: token_dim)
    middle_dim: int = 512  # hidden width of the branch MLPs
    n_layer: int = 2  # Linear-Dropout-ReLU layers per branch MLP
    dropout: float = 0.1
    depth: int = 6  # Visual Target Extractor blocks
    heads: int = 8
    dim_head: int = 64
    num_latents: int = 4
    ff_mult: float = 4  # feed-forward width = int(vision_width * ff_mult)
    placeholder: str = "*"
    template: str = DEFAULT_TEMPLATE  # inference prompt; ``*`` = where S* goes, ``{text}`` = modification
    train_prompt: str = DEFAULT_TRAIN_PROMPT  # prompt whose embedding is matched to the image in training

    def __post_init__(self) -> None:
        if self.proj_dim is None:
            self.proj_dim = self.token_dim
        for name in ("vision_width", "token_dim", "context_dim", "proj_dim", "middle_dim", "heads",
                     "dim_head", "num_latents"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"Context-I2W config: {name} must be >= 1")
        if int(self.vision_width * self.ff_mult) < 1:
            raise ValueError("Context-I2W config: ff_mult is too small")
        if self.depth < 0 or self.n_layer < 0:
            raise ValueError("Context-I2W config: depth and n_layer must be >= 0")
        check_template(self.template, needs_text=True)
        check_template(self.train_prompt, needs_text=False)

    @classmethod
    def from_dict(cls, data: dict) -> "ContextI2WConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def for_backbone(cls, backbone, **overrides) -> "ContextI2WConfig":
        """Sizes from the backbone; everything else from ``overrides`` or the paper's defaults."""
        return cls(vision_width=backbone.vision_width, token_dim=backbone.token_dim,
                   context_dim=backbone.embed_dim, placeholder=backbone.placeholder, **overrides)


def check_template(template: str, needs_text: bool) -> None:
    """A prompt template must hold the mark ``*`` exactly once (and ``{text}`` once when needed)."""
    rest = template.replace("{text}", "")
    if rest.count(TEMPLATE_MARK) != 1:
        raise ValueError(f"prompt template {template!r} must contain the placeholder {TEMPLATE_MARK!r} exactly once")
    if needs_text and template.count("{text}") != 1:
        raise ValueError(f"prompt template {template!r} must contain '{{text}}' exactly once")


# -- the network ---------------------------------------------------------------------------------------


class WeightNormLinear(nn.Module):
    """Bias-free linear map with weight normalisation: W = g * v / ||v|| (norm over each output row)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        v = torch.empty(out_features, in_features)
        nn.init.kaiming_uniform_(v, a=math.sqrt(5))  # nn.Linear's default init
        self.v = nn.Parameter(v)
        self.g = nn.Parameter(v.norm(dim=1, keepdim=True).clone())  # so W = v at the start

    @property
    def weight(self) -> torch.Tensor:
        return self.g * self.v / self.v.norm(dim=1, keepdim=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class LatentBlock(nn.Module):
    """One extractor block: latents attend over [normed tokens ; normed latents], then a feed-forward."""

    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: float):
        super().__init__()
        inner, hidden = heads * dim_head, int(dim * ff_mult)
        self.heads, self.dim_head = heads, dim_head
        self.norm_tokens = nn.LayerNorm(dim)
        self.norm_latents = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, inner, bias=False)
        self.kv = nn.Linear(dim, 2 * inner, bias=False)
        self.out = nn.Linear(inner, dim, bias=False)
        self.ff_norm = nn.LayerNorm(dim)
        self.ff_in = nn.Linear(dim, hidden, bias=False)
        self.ff_out = nn.Linear(hidden, dim, bias=False)

    def attend(self, tokens: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        b, n, _ = latents.shape
        t = self.norm_tokens(tokens)
        lat = self.norm_latents(latents)
        q = self.q(lat)
        k, v = self.kv(torch.cat([t, lat], dim=1)).chunk(2, dim=-1)

        def split(z):  # (B, L, h*d) -> (B, h, L, d)
            return z.reshape(b, z.shape[1], self.heads, self.dim_head).transpose(1, 2)

        q, k, v = split(q), split(k), split(v)
        attn = torch.softmax((q * self.dim_head ** -0.5) @ k.transpose(-1, -2), dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, n, self.heads * self.dim_head)
        return self.out(out)

    def forward(self, tokens: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        latents = latents + self.attend(tokens, latents)
        return latents + self.ff_out(F.gelu(self.ff_in(self.ff_norm(latents))))


class VisualTargetExtractor(nn.Module):
    """Learnable latents refined by ``depth`` :class:`LatentBlock` s, normed and averaged into one vector."""

    def __init__(self, dim: int, depth: int, heads: int, dim_head: int, num_latents: int, ff_mult: float):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(num_latents, dim))
        self.blocks = nn.ModuleList(LatentBlock(dim, heads, dim_head, ff_mult) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        latents = self.latents.unsqueeze(0).expand(tokens.shape[0], -1, -1)
        for block in self.blocks:
            latents = block(tokens, latents)
        return self.norm(latents).mean(dim=1)


class Branch(nn.Module):
    """LayerNorm -> projection P (W x proj_dim) -> n x (Linear, Dropout, ReLU) -> Linear to token_dim."""

    def __init__(self, width: int, proj_dim: int, middle_dim: int, n_layer: int, out_dim: int, dropout: float):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Parameter(width ** -0.5 * torch.randn(width, proj_dim))
        dims = [proj_dim] + [middle_dim] * n_layer
        self.mlp = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(dims[-1], out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x) @ self.proj
        for layer in self.mlp:
            x = F.relu(self.drop(layer(x)))
        return self.out(x)


class ContextI2WMapper(nn.Module):
    """``forward(context (B, context_dim), tokens (B, 1+P, vision_width)) -> S* (B, token_dim)``."""

    def __init__(self, config: ContextI2WConfig):
        super().__init__()
        self.config = c = config
        self.context_proj = nn.Linear(c.context_dim, c.vision_width, bias=False)
        self.rotation = WeightNormLinear(c.vision_width, c.vision_width)
        self.extractor = VisualTargetExtractor(c.vision_width, c.depth, c.heads, c.dim_head, c.num_latents, c.ff_mult)
        self.global_branch = Branch(c.vision_width, c.proj_dim, c.middle_dim, c.n_layer, c.token_dim, c.dropout)
        self.local_branch = Branch(c.vision_width, c.proj_dim, c.middle_dim, c.n_layer, c.token_dim, c.dropout)
        self.gate = nn.Parameter(torch.zeros(1))

    def select(self, context: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Intent View Selector: (W_R t_i) * (W_c c) for every token."""
        return self.rotation(tokens) * self.context_proj(context).unsqueeze(1)

    def parts(self, context: torch.Tensor, tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """(global branch output, local branch output), both (B, token_dim)."""
        if tokens.dim() != 3 or tokens.shape[-1] != self.config.vision_width or tokens.shape[1] < 2:
            raise InputError(f"Context-I2W expects visual tokens (B, 1+P, {self.config.vision_width}), "
                             f"got {tuple(tokens.shape)}")
        if context.dim() != 2 or context.shape[-1] != self.config.context_dim:
            raise InputError(f"Context-I2W expects a context (B, {self.config.context_dim}), got {tuple(context.shape)}")
        x = self.select(context, tokens)
        local = self.extractor(x[:, 1:])
        return self.global_branch(x[:, 0]), self.local_branch(local)

    def gate_value(self) -> float:
        return float(torch.tanh(self.gate.detach()).item())

    def forward(self, context: torch.Tensor, tokens: torch.Tensor, global_dropout: float = 0.0) -> torch.Tensor:
        """S*. ``global_dropout`` (training only): the share of rows whose global branch is dropped, so their
        S* comes from the local branch alone (``engine.train.context_i2w``, ``--global-dropout``)."""
        g, l = self.parts(context, tokens)
        if global_dropout > 0:
            g = g * (torch.rand(g.shape[0], 1, device=g.device) >= global_dropout).to(g.dtype)
        return g + torch.tanh(self.gate) * l


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


# -- pseudo-word helpers shared by the composer, training and evaluation ----------------------------------


def sanitise_text(text: str, placeholder: str) -> Tuple[str, List[str]]:
    """Removes the reserved placeholder from user text (it must appear only where S* goes)."""
    text = " ".join((text or "").split())
    if placeholder in text:
        return " ".join(text.replace(placeholder, " ").split()), [
            f"{placeholder!r} is reserved for the image's pseudo-word and was removed from the text"]
    return text, []


def build_prompt(config: ContextI2WConfig, text: Optional[str]) -> str:
    """The exact prompt of a query: the template with the text, or the training prompt without text."""
    if not text:
        return config.train_prompt.replace(TEMPLATE_MARK, config.placeholder)
    return config.template.replace(TEMPLATE_MARK, config.placeholder).replace("{text}", text)


# -- checkpoints: the one record format of engine.checkpoints ------------------------------------------

# keys of a mapper's record made from the mapper, the backbone and the anchor, never taken from the figures
# given to save_context_i2w (so a loaded record can be passed back, as engine.train.anchor_fit does)
_OWN_KEYS = ("placeholder", "placeholder_id", "parameters", "stored_dtype", "anchor", "anchor_vocab", "anchor_routes")


def _recipe_and_validation(training) -> Tuple[dict, Optional[dict]]:
    """The record's recipe (the training config, command and data) and validation figures (held-out
    caption->image R@10 of the trainer's validation pairs; never a test split) from the trainer's figures."""
    if not isinstance(training, dict):
        return {}, None
    recipe = {k: training[k] for k in ("command", "data") if k in training}
    recipe.update(training.get("train_config") or {})
    pairs = (training.get("held_out") or {}).get("pairs")
    validation = None
    if isinstance(pairs, dict) and isinstance(pairs.get("recall"), dict):
        validation = {"split": pairs.get("split", "val"), "metric": "R@10",
                      "scores": {name: r["R@10"] for name, r in pairs["recall"].items() if "R@10" in r}}
    return recipe, validation


def save_context_i2w(path: os.PathLike, mapper: ContextI2WMapper, backbone, figures: Optional[dict] = None,
                     half: bool = False, anchor: Optional[Anchor] = None) -> Path:
    """Writes the mapper in the one record format (:func:`engine.checkpoints.write`: atomic, ``.json`` sidecar
    beside it). The record also says the placeholder and its token id, the parameter count and the stored
    dtype; ``figures``: the trainer's figures kept as keys (``training``: history, train_config, held_out, ...;
    ``anchor_fit``), from which the recipe and the validation figures are taken.

    ``half`` stores the weights as float16 (half the size; loading converts back to float32); ``anchor``:
    the prior anchor (engine.compose.anchor) stored with the weights (float32, tensors ``anchor.*``).
    """
    figures = figures_of(figures or {}, *_OWN_KEYS)
    recipe, validation = _recipe_and_validation(figures.get("training"))
    own = {"placeholder": mapper.config.placeholder, "placeholder_id": int(getattr(backbone, "placeholder_id", -1)),
           "parameters": count_parameters(mapper), "stored_dtype": "float16" if half else "float32"}
    dtype = torch.float16 if half else torch.float32
    state = {k: v.detach().to(dtype) for k, v in mapper.state_dict().items()}
    if anchor is not None:
        own["anchor"] = anchor.config.to_dict()
        own.update(anchor.record_extra())
        state.update(anchor.tensors())
    record = make_record("context-i2w", backbone.fingerprint, asdict(mapper.config), recipe, validation,
                         backbone.name, **own, **figures)
    return write(path, state, record)


def load_context_i2w(path: Optional[os.PathLike] = None, fingerprint: Optional[str] = None,
                     checkpoint_dir=None) -> Tuple[ContextI2WMapper, dict]:
    """The mapper (eval mode, float32) and record of ``path``, or of the best checkpoint on the search path
    for ``fingerprint`` (:func:`engine.checkpoints.load`: any format; another backbone's or a damaged file
    raises CheckpointError naming it)."""
    ck = load("context-i2w", path, fingerprint, checkpoint_dir)
    try:
        mapper = ContextI2WMapper(ContextI2WConfig.from_dict(ck.record["config"]))
        mapper.load_state_dict({k: v.float() for k, v in split_state(ck.tensors).items()})
    except Exception as exc:
        raise CheckpointError(f"{ck.path.name}: weights do not match the stored config ({exc})") from None
    return mapper.eval(), ck.record


# -- the authors' checkpoint (IM2TEXT_OWM_Attn) -----------------------------------------------------------

AUTHORS_PREFIX_KEYS = ("state_dict_img2text", "img2text", "state_dict", "model")


def _authors_key_map(n_layer: int, depth: int) -> Dict[str, str]:
    """Their parameter name -> ours (weight-norm names handled separately)."""
    m = {"to_c.weight": "context_proj.weight", "local_gate": "gate",
         "VT_Extractor.latents": "extractor.latents",
         "VT_Extractor.norm.weight": "extractor.norm.weight", "VT_Extractor.norm.bias": "extractor.norm.bias"}
    for theirs, ours in (("", "global_branch"), ("_local", "local_branch")):
        m[f"ln_post{theirs}.weight"] = f"{ours}.norm.weight"
        m[f"ln_post{theirs}.bias"] = f"{ours}.norm.bias"
        m[f"proj{theirs}"] = f"{ours}.proj"
        m[f"fc_out{theirs}.weight"] = f"{ours}.out.weight"
        m[f"fc_out{theirs}.bias"] = f"{ours}.out.bias"
        for i in range(n_layer):
            for p in ("weight", "bias"):
                m[f"layers{theirs}.{i}.0.{p}"] = f"{ours}.mlp.{i}.{p}"
    for i in range(depth):
        a, b = f"VT_Extractor.layers.{i}", f"extractor.blocks.{i}"
        for p in ("weight", "bias"):
            m[f"{a}.0.norm_media.{p}"] = f"{b}.norm_tokens.{p}"
            m[f"{a}.0.norm_latents.{p}"] = f"{b}.norm_latents.{p}"
            m[f"{a}.1.0.{p}"] = f"{b}.ff_norm.{p}"
        m[f"{a}.0.to_q.weight"] = f"{b}.q.weight"
        m[f"{a}.0.to_kv.weight"] = f"{b}.kv.weight"
        m[f"{a}.0.to_out.weight"] = f"{b}.out.weight"
        m[f"{a}.1.1.weight"] = f"{b}.ff_in.weight"
        m[f"{a}.1.3.weight"] = f"{b}.ff_out.weight"
    return m


def unwrap_authors_state(obj, source: str) -> Dict[str, torch.Tensor]:
    """The mapper's state dict out of a training checkpoint (``state_dict_img2text``), without ``module.``."""
    if isinstance(obj, dict) and "state_dict_img2text" in obj:
        obj = obj["state_dict_img2text"]
    elif isinstance(obj, dict) and not any(isinstance(v, torch.Tensor) for v in obj.values()):
        for key in AUTHORS_PREFIX_KEYS:
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not obj:
        raise CheckpointError(f"{source}: no mapper state dict found (expected 'state_dict_img2text')")
    out = {}
    for k, v in obj.items():
        if not isinstance(v, torch.Tensor):
            continue
        while k.startswith("module."):
            k = k[len("module."):]
        out[k] = v
    return out


def _count_indexed(state: Dict[str, torch.Tensor], pattern: str) -> int:
    rx = re.compile(pattern)
    idx = {int(m.group(1)) for k in state for m in [rx.match(k)] if m}
    return (max(idx) + 1) if idx else 0


def authors_state_to_ours(state: Dict[str, torch.Tensor], source: str, dim_head: int = 64,
                          **config_overrides) -> Tuple[ContextI2WConfig, Dict[str, torch.Tensor]]:
    """Maps an ``IM2TEXT_OWM_Attn`` state dict onto :class:`ContextI2WMapper`.

    Sizes are read from the shapes (heads = inner width / ``dim_head``); any missing, unexpected or
    mis-shaped key raises CheckpointError naming ``source`` and the key.
    """
    state = dict(state)
    # weight norm: old API (weight_g, weight_v), new parametrisation (original0 = g, original1 = v), or plain
    g = state.pop("W_R.weight_g", state.pop("W_R.parametrizations.weight.original0", None))
    v = state.pop("W_R.weight_v", state.pop("W_R.parametrizations.weight.original1", None))
    plain = state.pop("W_R.weight", None)
    if v is None and plain is not None:
        v, g = plain, plain.norm(dim=1, keepdim=True)
    if v is None or g is None:
        raise CheckpointError(f"{source}: missing the weight-normalised selector W_R (weight_g / weight_v)")
    for needed in ("to_c.weight", "fc_out.weight", "VT_Extractor.latents", "proj"):
        if needed not in state:
            raise CheckpointError(f"{source}: missing key {needed!r}; is this an IM2TEXT_OWM_Attn checkpoint?")
    n_layer = _count_indexed(state, r"layers\.(\d+)\.0\.weight$")
    depth = _count_indexed(state, r"VT_Extractor\.layers\.(\d+)\.0\.to_q\.weight$")
    inner = state["VT_Extractor.layers.0.0.to_q.weight"].shape[0] if depth else dim_head
    if inner % dim_head:
        raise CheckpointError(f"{source}: attention width {inner} is not a multiple of dim_head={dim_head}")
    ff_in = state.get("VT_Extractor.layers.0.1.1.weight")
    width = v.shape[0]
    cfg = ContextI2WConfig(
        vision_width=width,
        token_dim=state["fc_out.weight"].shape[0],
        context_dim=state["to_c.weight"].shape[1],
        proj_dim=state["proj"].shape[1],
        middle_dim=state["fc_out.weight"].shape[1],
        n_layer=n_layer,
        depth=depth,
        heads=inner // dim_head,
        dim_head=dim_head,
        num_latents=state["VT_Extractor.latents"].shape[0],
        ff_mult=(ff_in.shape[0] / width) if ff_in is not None else 4,
        **config_overrides,
    )
    target = ContextI2WMapper(cfg).state_dict()
    keymap = _authors_key_map(n_layer, depth)
    ours: Dict[str, torch.Tensor] = {"rotation.g": g.reshape(-1, 1), "rotation.v": v}
    unexpected = sorted(k for k in state if k not in keymap)
    if unexpected:
        raise CheckpointError(f"{source}: unexpected keys {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
    for theirs, mine in keymap.items():
        if theirs not in state:
            raise CheckpointError(f"{source}: missing key {theirs!r}")
        t = state[theirs]
        if mine == "gate":
            t = t.reshape(1)
        ours[mine] = t
    for k, t in ours.items():
        if tuple(t.shape) != tuple(target[k].shape):
            raise CheckpointError(f"{source}: {k} has shape {tuple(t.shape)}, the mapper expects {tuple(target[k].shape)}")
    missing = sorted(set(target) - set(ours))
    if missing:
        raise CheckpointError(f"{source}: no value for {missing[:5]}")
    return cfg, {k: t.detach().float() for k, t in ours.items()}


def load_authors_checkpoint(path: os.PathLike, backbone=None, dim_head: int = 64,
                            **config_overrides) -> Tuple[ContextI2WMapper, dict]:
    """Loads the authors' released checkpoint (``torch.load(weights_only=True)``) as our mapper.

    With ``backbone``, the sizes must match it (vision width, token width, context size) or
    CheckpointError names the file and the first mismatch.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path.name}")
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path.name} could not be read as a weights-only torch checkpoint "
                              f"({exc.__class__.__name__}: {str(exc)[:200]})") from None
    state = unwrap_authors_state(obj, path.name)
    if backbone is not None:
        config_overrides.setdefault("placeholder", backbone.placeholder)
    cfg, ours = authors_state_to_ours(state, path.name, dim_head=dim_head, **config_overrides)
    if backbone is not None:
        for ours_name, theirs_val, name in ((cfg.vision_width, backbone.vision_width, "vision width"),
                                            (cfg.token_dim, backbone.token_dim, "token width"),
                                            (cfg.context_dim, backbone.embed_dim, "context (embedding) size")):
            if ours_name != theirs_val:
                raise CheckpointError(f"{path.name}: {name} {ours_name} does not match backbone "
                                      f"{backbone.name} ({theirs_val}); the authors' checkpoint is for "
                                      f"OpenAI CLIP ViT-L/14 (open_clip:ViT-L-14/openai)")
    mapper = ContextI2WMapper(cfg)
    mapper.load_state_dict(ours)
    return mapper.eval(), {"source": "authors", "file": path.name, "config": asdict(cfg)}


# -- the composer ---------------------------------------------------------------------------------------


class ContextI2WComposer(AnchoredComposer):
    """Context-I2W as a correction of the weighted sum (engine.compose.anchor): the pseudo-word query is mixed
    into the prior by the query's familiarity; with the image or the text missing the prior alone is used."""

    name, label = "context-i2w", "Context-I2W (context-dependent pseudo-word)"

    def __init__(self, backbone, mapper: ContextI2WMapper, record: Optional[dict] = None,
                 anchor: Optional[Anchor] = None):
        super().__init__(backbone)
        c = mapper.config
        if (c.vision_width, c.token_dim, c.context_dim) != (backbone.vision_width, backbone.token_dim,
                                                            backbone.embed_dim):
            raise CheckpointError(f"Context-I2W checkpoint {(record or {}).get('file', '')} does not fit "
                                  f"backbone {backbone.name} (sizes differ)")
        if c.placeholder != backbone.placeholder:
            raise CheckpointError(f"Context-I2W checkpoint uses placeholder {c.placeholder!r}, "
                                  f"backbone {backbone.name} uses {backbone.placeholder!r}")
        self.mapper = mapper.eval().to(backbone.device)
        self.record = record or {}
        self.anchor = anchor

    @torch.no_grad()
    def compose(self, query: Query) -> Composition:
        if not (query.has_image and query.text and query.text.strip()):
            return prior_only(self, query, "Context-I2W puts the image into a text")
        if query.image_tokens is None:
            raise InputError("Context-I2W needs the reference image's visual tokens")
        text, notices = sanitise_text(query.text or "", self.mapper.config.placeholder)
        prompt = build_prompt(self.mapper.config, text)
        enc = self.backbone.encode_texts([prompt])  # the context embedding and its truncation notices
        tok = query.image_tokens.to(self.backbone.device).float().unsqueeze(0)
        s = self.mapper(enc.embeddings.float().to(self.backbone.device), tok)
        vec = self.backbone.encode_texts_with_pseudo([prompt], s)[0]
        anchored = {}
        if self.anchor is not None:
            raw = encoded_text(self.backbone, query)[0].float().cpu()
            image = query.image_embedding.detach().float().cpu().reshape(1, -1)
            blended, anchored = self.anchor.explain_blend(image, raw.reshape(1, -1), vec.float().cpu().reshape(1, -1),
                                                          operation_text(self.anchor, self.backbone, [query.text]))
            vec = blended[0]
        explanation = {
            "formula": "q = f_txt(prompt with S* = mapper(image tokens | context))",
            **anchored,
            "prompt": prompt,
            "gate": self.mapper.gate_value(),
            "checkpoint": self.record.get("file", ""),
        }
        return Composition(normalise(vec), explanation, notices + list(enc.notices))

    def batchable(self, queries: List[Query]) -> bool:
        return super().batchable(queries) and all(q.image_tokens is not None for q in queries)

    def learned_batch(self, chunk: List[Query], image: torch.Tensor, texts: List[str]) -> tuple:
        ph = self.mapper.config.placeholder
        prompts = [build_prompt(self.mapper.config, sanitise_text(t, ph)[0]) for t in texts]
        ctx = self.backbone.encode_texts(prompts).embeddings.float().to(self.backbone.device)
        tok = torch.stack([q.image_tokens.float() for q in chunk]).to(self.backbone.device)
        vec = self.backbone.encode_texts_with_pseudo(prompts, self.mapper(ctx, tok)).float().cpu()
        return vec, None


def load_context_i2w_composer(backbone, checkpoint_dir=None) -> ContextI2WComposer:
    """The composer for ``backbone`` from the best checkpoint on the search path (engine.checkpoints.find)."""
    found = find("context-i2w", backbone.fingerprint, checkpoint_dir)
    if not found:
        raise ComposerUnavailable(f"no Context-I2W checkpoint for {backbone.name} in "
                                  f"{describe_search_path(checkpoint_dir)}; {part('context-i2w').train_hint()}")
    def one(path):  # best first; a damaged one is passed over for the next (in the end the bundled file)
        mapper, record = load_context_i2w(path, backbone.fingerprint)
        anchor = load_anchor(path, record)  # CheckpointError naming the file when unreadable
        return ContextI2WComposer(backbone, mapper, record, anchor=anchor)

    return load_first(found, one, "Context-I2W")


COMPOSERS.register("context-i2w")(
    lambda backbone, checkpoint_dir=None: load_context_i2w_composer(backbone, checkpoint_dir))
