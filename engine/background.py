"""Background ``prepare`` for a running app (a Space prepares itself).

``CIS_PREPARE``: ``auto`` (default: on when ``SPACE_ID`` is set, i.e. on a Hugging Face Space, off elsewhere),
``on`` or ``off``. When on, :func:`start` runs :func:`engine.prepare.prepare` for the live backbone in a
daemon thread with ``CIS_PREPARE_BUDGET_MIN`` minutes (default 30), writing into the prepared-checkpoint
cache (``$CIS_CACHE_DIR/checkpoints``: persistent storage when ``CIS_CACHE_DIR`` points at it; found again at
the next start; ``CIS_PREPARED_DIR`` overrides that folder, ``CIS_PREPARE_PARTS`` limits the parts). After each part the engine re-tries its unavailable composers and expanders, so a method
becomes selectable without a restart; searches keep using the available methods meanwhile.
"""
from __future__ import annotations

import logging
import threading
from typing import Optional

from .config import Settings
from .errors import CheckpointError
from .checkpoints import PARTS, prepared_parts, search_path
from .prepare import Status, prepare

log = logging.getLogger(__name__)


def mode(settings: Settings) -> bool:
    """Whether the app prepares by itself (``CIS_PREPARE``; unknown values are refused)."""
    value = settings.prepare or "auto"
    if value == "auto":
        return settings.on_space
    if value in ("on", "1", "true", "yes"):
        return True
    if value in ("off", "0", "false", "no"):
        return False
    raise ValueError(f"CIS_PREPARE={value!r}: use auto, on or off")


def parts(settings: Settings) -> list:
    """``CIS_PREPARE_PARTS`` (comma list; default every part)."""
    raw = settings.prepare_parts.strip()
    return [p.strip() for p in raw.split(",") if p.strip()] if raw else prepared_parts()


def refresh(engine) -> list:
    """Re-tries the engine's unavailable composers / expanders (their checkpoints may have landed);
    returns the names that became available."""
    from .compose import COMPOSERS
    from .compose.base import ComposerUnavailable
    from .expand import EXPANDERS, ExpanderUnavailable

    ckpt, bb, new = search_path(engine.settings), engine.backbone, []

    def retry(available: dict, unavailable: dict, make, missing) -> None:
        for name in list(unavailable):
            try:
                part = make(name)
            except (missing, CheckpointError) as exc:
                unavailable[name] = str(exc)
                continue
            available[name] = part
            unavailable.pop(name, None)
            new.append(name)

    retry(engine.composers, engine.unavailable, lambda n: COMPOSERS.create(n, bb, checkpoint_dir=ckpt, loaded=engine.composers),
          ComposerUnavailable)
    retry(engine.expanders, engine.expanders_unavailable,
          lambda n: EXPANDERS.get(n)(embed_dim=bb.embed_dim, checkpoint_dir=ckpt, fingerprint=bb.fingerprint),
          ExpanderUnavailable)
    return new


class BackgroundPrepare:
    """One background prepare run for ``engine``'s backbone; :attr:`status` is read by the page."""

    def __init__(self, engine, budget: Optional[float] = None, parts=None, spec: Optional[str] = None):
        self.engine, self.parts = engine, list(parts) if parts else globals()["parts"](engine.settings)
        self.budget = budget if budget is not None else engine.settings.prepare_budget_min
        self.spec = spec or engine.settings.backbone
        known = prepared_parts()
        self.status = Status(state={p: "waiting" if p in known else "unknown" for p in self.parts})
        for p in self.parts:  # a misspelt CIS_PREPARE_PARTS entry is named; the known parts still prepare
            if p not in known:
                self.status.error[p] = f"{p!r} is not a learned part (CIS_PREPARE_PARTS takes {', '.join(known)})"
                log.warning("CIS_PREPARE_PARTS: %s", self.status.error[p])
        self.thread: Optional[threading.Thread] = None
        self.error = ""

    def start(self) -> "BackgroundPrepare":
        self.thread = threading.Thread(target=self._run, name="cis-prepare", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        status, engine = self.status, self.engine
        original = dict.__setitem__

        def on_change():
            try:
                refresh(engine)
            except Exception:  # a refresh failure must not stop the run
                log.exception("refreshing methods after prepare")

        class StateDict(dict):
            def __setitem__(self, key, value):
                original(self, key, value)
                if value in ("available", "failed"):
                    on_change()

        status.state = StateDict(status.state)
        known = [p for p in self.parts if p in prepared_parts()]
        try:
            if known:
                prepare(self.spec, None, known, self.budget, device=engine.settings.device, quiet=True,
                        status=status, settings=engine.settings)
        except Exception as exc:
            self.error = f"{exc.__class__.__name__}: {exc}"
            log.exception("background prepare failed")
            for p in known:
                if status.state.get(p) != "available":
                    status.state[p], status.error[p] = "failed", self.error
        on_change()

    def markdown(self) -> str:
        """One line per learned part: available / preparing NN % / waiting / failed: why."""
        return status_markdown(self.status, self.parts)


def status_markdown(status: Status, parts=None) -> str:
    items = []
    for p in prepared_parts() if parts is None else parts:
        state = status.state.get(p, "waiting")
        if state == "preparing":
            text = f"preparing {status.percent(p)} %"
        elif state == "waiting":
            text = "preparing (queued)"
        elif state == "unknown":
            text = f"unknown part: {status.error.get(p, '')}"
        elif state == "failed":
            text = f"failed: {status.error.get(p, 'unknown error')[:120]}"
        else:
            text = state
        items.append(f"**{PARTS[p].label if p in PARTS else p}**: {text}")
    return "Learned methods for this backbone — " + " · ".join(items)


_RUNNING: dict = {}


def start_for(engine) -> Optional[BackgroundPrepare]:
    """Starts (once per engine) the background prepare when :func:`mode` says so; None otherwise."""
    if not mode(engine.settings):
        return None
    key = id(engine)
    if key not in _RUNNING:
        _RUNNING[key] = BackgroundPrepare(engine).start()
    return _RUNNING[key]
