"""Engines the app serves: the built-in gallery (indexed on first use, then cached) and per-session
galleries built from uploaded zips. Plain functions, shared by the demo and the CLI."""
from __future__ import annotations

import logging
import shutil
import threading
import uuid
from pathlib import Path
from typing import Optional

from .backbones import create_backbone
from .config import Settings, cache_dir
from .errors import IndexLoadError, InputError
from .index.build import index_source
from .search import SearchEngine, open_engine

log = logging.getLogger(__name__)
_lock = threading.Lock()


def load_default_engine(settings: Optional[Settings] = None, progress=None) -> SearchEngine:
    """The engine over ``settings.gallery``; (re)builds its index when missing, stale or damaged."""
    settings = settings or Settings()
    backbone = create_backbone(settings.backbone, settings.device)
    out = settings.resolved_index_dir()
    with _lock:
        try:
            return open_engine(out, backbone=backbone, settings=settings)
        except IndexLoadError as exc:
            if (Path(out) / "CURRENT").exists():
                log.warning("rebuilding the gallery index at %s (%s)", out, exc)
            else:
                log.warning("building the gallery index (first start) at %s", out)
        index_source(settings.gallery, out, backbone, settings=settings, progress=progress)
        return open_engine(out, backbone=backbone, settings=settings)


def sessions_dir() -> Path:
    d = cache_dir() / "sessions"
    d.mkdir(parents=True, exist_ok=True)
    return d


def session_index_types(base: SearchEngine) -> list:
    """Index types offered for an uploaded gallery: ``auto`` (float vectors: exact flat search, IVF when
    large) and every ``ics-K`` compact binary index with a checkpoint for the live backbone."""
    from .index.ics_index import available_ics_types

    return ["auto", *available_ics_types(base.settings.checkpoints, base.backbone.fingerprint,
                                         base.backbone.embed_dim)]


def build_session_engine(zip_path, base: SearchEngine, progress=None, index_type: str = "auto") -> SearchEngine:
    """Index an uploaded zip into a fresh session folder with the live backbone and ``index_type``
    (one of :func:`session_index_types`)."""
    zip_path = Path(zip_path)
    if not zip_path.is_file():
        raise InputError("no zip file was uploaded")
    choices = session_index_types(base) if index_type != "auto" else ["auto"]
    if index_type not in choices:
        raise InputError(f"index type {index_type!r} is not available here; choose one of {', '.join(choices)}")
    settings = base.settings
    if zip_path.stat().st_size > settings.max_zip_mb * 1e6:
        raise InputError(f"the zip is {zip_path.stat().st_size / 1e6:.1f} MB; the limit is {settings.max_zip_mb:.0f} MB")
    with open(zip_path, "rb") as f:
        if f.read(4) not in (b"PK\x03\x04", b"PK\x05\x06"):
            raise InputError("the upload is not a zip archive (checked by content, not by name)")
    out = sessions_dir() / uuid.uuid4().hex
    try:
        index_source(zip_path, out, base.backbone, index_type=index_type, settings=settings, progress=progress,
                     workers=0)
        return open_engine(out, backbone=base.backbone, settings=settings)
    except Exception:
        shutil.rmtree(out, ignore_errors=True)
        raise


def drop_session_engine(engine: Optional[SearchEngine]) -> None:
    """Delete a session gallery's files (extracted images, thumbnails, index)."""
    if engine is None:
        return
    folder = Path(engine.index.folder)
    if sessions_dir() in folder.resolve().parents:
        shutil.rmtree(folder, ignore_errors=True)
