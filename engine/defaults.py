"""The defaults a search uses when the caller names none: the method and the nQE of each expander.

They are chosen on the validation side of the held-out-domain suite (``python -m engine eval generalise
--side val --choose``) and written as ``defaults-<backbone slug>.json`` beside the checkpoints (found on the
checkpoint search path like any learned part, and only for the backbone fingerprint they were measured with).
The page, the CLI and the JSON API all read them through :func:`engine_defaults`, so one query gets one
answer everywhere. Without a record for the live backbone the weighted sum is the default and every expander
uses :data:`FALLBACK_NQE`; either way nQE is capped at a fraction of the gallery (``gallery_nqe``). Each
expander also has a *floor*: only neighbours at least that close (cosine) to the query are averaged in; with
none that close the query is kept, so expansion never averages a composed query into unrelated images.
Each method also has a *hub weight* (``hub_weight``, ``engine.index.hubs``): how strongly items that sit close
to many others are pulled down before ranking (0, the fallback: not at all).
"""
from __future__ import annotations

import math

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional

from .checkpoints import bundled_dir, search_dirs, slug
from .fileio import atomic_write_text

FALLBACK_METHOD = "sum"
FALLBACK_NQE = 4
FALLBACK_FRACTION = 0.02
FALLBACK_FLOOR = -1.0
PATTERN = "defaults-*.json"
log = logging.getLogger(__name__)


@dataclass
class EngineDefaults:
    method: str = FALLBACK_METHOD
    nqe: Dict[str, int] = field(default_factory=dict)
    nqe_fraction: float = FALLBACK_FRACTION
    source: str = ""          # the record's file name, "" for the fallback
    evidence: dict = field(default_factory=dict)
    floor: Dict[str, float] = field(default_factory=dict)
    hub: Dict[str, float] = field(default_factory=dict)

    def hub_weight_for(self, method: str) -> float:
        """The hub correction's weight for ``method`` (engine.index.hubs); 0 without a chosen one."""
        return float(self.hub.get(method, 0.0))

    def offers(self, expander: str, composed_only: bool = False) -> bool:
        """Whether the page offers ``expander`` for this backbone: not when validation showed it moves no
        query's answer at its defaults (the record's ``queries_changed``); without a record, every one.

        ``composed_only``: the expander serves composed queries alone (it reads the modification text), so it is
        also not offered when it scored below no expansion on the suite's validation side
        (``expander_overall_val``: ``[without, with]`` overall score). The others also serve image-only "more
        like this" queries, whose validation is the labelled set's held-out classes (docs/lattqe.md), so a loss
        on composed queries alone does not take them off the page (the page's default is no expansion)."""
        if expander == "none":
            return True
        scores = (self.evidence.get("expander_overall_val") or {}).get(expander) if composed_only else None
        try:
            if scores is not None and float(scores[1]) < float(scores[0]):
                return False
        except (TypeError, ValueError, IndexError, KeyError):
            pass
        changed = self.evidence.get("queries_changed")
        if not isinstance(changed, dict) or expander not in changed:
            return True
        try:
            return int(changed[expander]) > 0
        except (TypeError, ValueError):
            return True

    def floor_for(self, expander: str) -> float:
        """The least cosine a neighbour needs to the query to be averaged in (-1: every neighbour)."""
        return float(self.floor.get(expander, FALLBACK_FLOOR))

    def nqe_for(self, expander: str) -> int:
        return int(self.nqe.get(expander, FALLBACK_NQE))

    def gallery_nqe(self, expander: str, n_gallery: int) -> int:
        """nQE for ``expander`` on a gallery of ``n_gallery`` images: the chosen value, capped at
        ``nqe_fraction`` of the gallery, at least 1."""
        return gallery_nqe(self.nqe_for(expander), n_gallery, self.nqe_fraction)

    def why(self) -> str:
        """One sentence on how the default method was chosen."""
        if not self.source:
            return "the weighted sum: no validation record for this backbone"
        score = (self.evidence.get("overall_val") or {}).get(self.method)
        if self.method == "auto":
            score = self.evidence.get("auto_val_cross_fitted")
        tail = f" (score {score:.1f})" if isinstance(score, (int, float)) else ""
        return (f"best on the validation side of the held-out-domain suite{tail}: photos, words and phrasings "
                "no trainer saw")


def gallery_nqe(nqe: int, n_gallery: int, fraction: float) -> int:
    """``nqe`` capped at ``fraction`` of a gallery of ``n_gallery`` images (at least 1), so expansion never
    averages a large part of a small gallery."""
    return int(max(1, min(int(nqe), int(fraction * n_gallery))))


def _read(path: Path) -> Optional[dict]:
    try:
        rec = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return rec if isinstance(rec, dict) and rec.get("kind") == "defaults" else None


def engine_defaults(backbone, settings=None, checkpoint_dir=None) -> EngineDefaults:
    """The defaults recorded for ``backbone`` on the checkpoint search path (``checkpoint_dir``, else the
    settings' folder, first), else the fallback."""
    folder = checkpoint_dir if checkpoint_dir not in (None, "") else (
        getattr(settings, "checkpoints", None) if settings is not None else None)
    for directory in search_dirs(folder, settings):
        for path in sorted(Path(directory).glob(PATTERN)) if Path(directory).is_dir() else []:
            rec = _read(path)
            if rec is None or rec.get("backbone_fingerprint") != backbone.fingerprint:
                continue
            try:
                return _checked(rec, path.name)
            except (TypeError, ValueError, AttributeError, OverflowError) as exc:  # the next record (the bundled)
                log.warning("defaults record %s ignored: %s", path.name, exc)
    return EngineDefaults()


def _checked(rec: dict, name: str) -> EngineDefaults:
    """A record's values, each checked (ValueError with one sentence): a method name, nQE integers of at least
    1, floors in [-1, 1], a fraction in (0, 1]; a damaged record is ignored rather than served."""

    nqe, floor, hub = rec.get("nqe") or {}, rec.get("floor") or {}, rec.get("hub_weight") or {}
    if not isinstance(nqe, dict) or not isinstance(floor, dict) or not isinstance(hub, dict):
        raise ValueError("nqe, floor and hub_weight must be objects of name: value")
    for k, v in hub.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise ValueError(f"hub_weight of {k!r} is {v!r}, not a number from 0 to 1")
    for k, v in nqe.items():
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1_000_000:
            raise ValueError(f"nqe of {k!r} is {v!r}, not an integer from 1 to 1000000")
    for k, v in floor.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -1.0 <= v <= 1.0:
            raise ValueError(f"floor of {k!r} is {v!r}, not a number from -1 to 1")
    fraction = rec.get("nqe_fraction", FALLBACK_FRACTION)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not math.isfinite(fraction) \
            or not 0.0 < fraction <= 1.0:
        raise ValueError(f"nqe_fraction is {fraction!r}, not a number above 0 and at most 1")
    method = rec.get("method", FALLBACK_METHOD)
    if not isinstance(method, str) or not method:
        raise ValueError(f"method is {method!r}, not a method name")
    return EngineDefaults(method, {str(k): int(v) for k, v in nqe.items()}, float(fraction), name, rec,
                          {str(k): float(v) for k, v in floor.items()}, {str(k): float(v) for k, v in hub.items()})


def write_defaults(backbone, chosen: dict, out_dir: Optional[Path] = None, command: str = "") -> Path:
    """Writes the record (atomically) for ``backbone``; ``chosen`` is ``engine.eval.generalise.choose``'s."""
    out_dir = Path(out_dir) if out_dir else bundled_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"defaults-{slug(backbone.name)}.json"
    record = {"kind": "defaults", "backbone_fingerprint": backbone.fingerprint, "backbone_name": backbone.name,
              "split": "val", "command": command, **chosen}
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    return path
