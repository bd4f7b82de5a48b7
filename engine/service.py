"""Engines the app serves: the built-in gallery (indexed on first use, then cached) and per-session
galleries built from uploaded zips. Plain functions, shared by the demo and the CLI."""
from __future__ import annotations

import numpy as np
import torch

import errno
import logging
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from pathlib import Path
from typing import Optional

from .backbones import create_backbone
from .batching import TextBatcher, batch_texts
from .checkpoints import search_path
from .config import Settings, cache_dir
from .errors import IndexLoadError, InputError
from .index.build import index_source
from .index.ics_index import available_ics_types
from .index.pipeline import repair_thumbnails
from .index.shards import cache_folder
from .images import DEFAULT_MAX_BYTES, decode_limits, load_image
from .index.walk import find_images, load_captions
from .prebuilt import seed_index
from .search import SearchEngine, open_engine

log = logging.getLogger(__name__)
_lock = threading.Lock()


def load_default_engine(settings: Settings, progress=None) -> SearchEngine:
    """The engine over ``settings.gallery``; (re)builds its index when missing, stale or damaged. Its backbone
    batches the texts of concurrent searches (:func:`batch_concurrent_texts`): every server that loads the
    engine here (the page, the Gradio API, POST /api/search in app.py) gets it without asking. ``settings``:
    the entry point's (app.py, a command's main)."""
    engine = _open_default_engine(settings, progress)
    batch_concurrent_texts(engine, settings)
    return engine


def batch_concurrent_texts(engine: SearchEngine, settings: Optional[Settings] = None) -> Optional[TextBatcher]:
    """Concurrent searches on ``engine`` (and on every engine sharing its backbone: the session galleries)
    encode their texts in shared forward passes of up to ``settings.text_batch`` texts (engine/batching.py).
    CIS_TEXT_BATCH=1: every search encodes its own text (returns None). Installed once per backbone."""
    settings = settings or engine.settings
    if settings.text_batch <= 1:
        return None
    return batch_texts(engine.backbone, settings.text_batch)


def _open_default_engine(settings: Settings, progress=None) -> SearchEngine:
    backbone = create_backbone(settings.backbone, settings.device, settings=settings)
    out = settings.resolved_index_dir()
    with _lock:
        engine, built = _open_or_build(settings, out, backbone, progress)
        problem = vectors_problem(engine)
        if problem:  # a valid file with the wrong content (rows swapped, another gallery's vectors): re-embed all
            log.warning("the gallery index's vectors do not match its images (%s); rebuilding it by embedding "
                        "every photo", problem)
            shutil.rmtree(cache_folder(Path(out), backbone.fingerprint), ignore_errors=True)
            index_source(settings.gallery, out, backbone, settings=settings, progress=progress)
            engine, built = open_engine(out, backbone=backbone, settings=settings), True
        if not built:
            check_thumbnails(engine)
        return engine


def _open_or_build(settings: Settings, out: Path, backbone, progress=None):
    """(engine, whether the index was (re)built now): the cached index when it loads and lists the gallery's
    photos, else the index built (incrementally; from the prebuilt embeddings on a first start)."""
    try:
        engine = open_engine(out, backbone=backbone, settings=settings)
        changed = gallery_changes(settings.gallery, engine.index)
        if not changed:
            return engine, False
        log.info("the gallery folder changed since its index was made (%s): updating the index", changed)
        first = False
    except IndexLoadError as exc:
        first = not (Path(out) / "CURRENT").exists()
        if not first:
            log.warning("rebuilding the gallery index at %s (%s)", out, exc)

    seeded = seed_index(settings.gallery, out, backbone)  # the bundled gallery's prebuilt embeddings, when they fit
    if first and not seeded:
        log.info("first start: indexing the gallery (embedding every photo once)")
    index_source(settings.gallery, out, backbone, settings=settings, progress=progress)  # + thumbnails
    engine = open_engine(out, backbone=backbone, settings=settings)
    if first and seeded:  # one line for what happened: nothing was embedded
        log.info("first start: the gallery index of %d photos was made from the prebuilt embeddings "
                 "(nothing to embed)", len(engine.index))
    return engine, True


VECTOR_SAMPLE = 4  # gallery items re-embedded at start (first, last and two between)
VECTOR_MIN_COSINE = 0.95  # below this a stored vector is not its image's (float16 and CPU/GPU differ by < 0.01)


def vectors_problem(engine: SearchEngine, sample: int = VECTOR_SAMPLE) -> Optional[str]:
    """None when a sample of the index's items, embedded again from their images, match their stored vectors;
    else which item did not (what a prebuilt or cached file with its rows reordered would give). Items whose
    image cannot be read are not sampled; an index with database-side augmentation is not checked. The sample is
    embedded in one batch (one forward pass, not one per item)."""
    index = engine.index
    n = len(index)
    if not n or index.meta.get("dba"):
        return None
    ids = sorted({0, n - 1, n // 3, (2 * n) // 3})[:max(1, sample)]
    limits = {**decode_limits(engine.settings), "max_bytes": DEFAULT_MAX_BYTES}
    read, pixels = [], []
    for i in ids:
        try:
            pixels.append(engine.backbone.preprocess(load_image(index.image_path(i), **limits)))
        except (InputError, OSError):
            continue
        read.append(i)
    if not read:
        return None
    with torch.no_grad():
        emb = engine.backbone.encode_images(torch.stack(pixels))
    emb = np.asarray(emb.float().cpu().numpy() if hasattr(emb, "float") else emb, dtype=np.float32)
    for row, i in zip(emb, read):
        stored = index.embeddings[i].astype(np.float32)
        cos = float(row @ stored / max(1e-12, float(np.linalg.norm(row) * np.linalg.norm(stored))))
        if not cos >= VECTOR_MIN_COSINE:
            return f"item {i}, {index.items[i]['path']}: cosine {cos:.2f} to its own image"
    return None


def check_thumbnails(engine: SearchEngine) -> int:
    """At start: every thumbnail checked against its recorded checksum, the damaged ones rebuilt (a full disk
    leaves them to the source images); returns how many were rebuilt."""

    index = engine.index
    limits = decode_limits(engine.settings)
    try:
        n = repair_thumbnails(index.source, Path(index.folder) / "thumbs", index.items, limits["max_pixels"],
                              limits["max_decode_bytes"])
    except OSError as exc:
        log.warning("thumbnails not checked (%s); damaged ones are replaced by their source images",
                    exc.strerror or exc.__class__.__name__)
        return 0
    index.__dict__.pop("_thumb_sums", None)
    index.__dict__.pop("_thumbs_checked", None)
    return n


def gallery_changes(gallery, index) -> str:
    """An empty string when the index lists exactly the photos of the ``gallery`` folder (skipped files counted as listed),
    with their current captions, else what differs ("3 photos added, 136 removed, 2 captions changed"): a gallery
    updated under a cached index (a new version of the bundled one, photos added by hand, captions reworded) is
    indexed again, incrementally (nothing is embedded for a caption), instead of serving removed photos or old
    captions."""
    found = find_images(Path(gallery))
    listed = set(found)
    indexed = {str(it["path"]) for it in index.items}
    skipped = {str(s.get("path")) for s in index.meta.get("skipped", []) if isinstance(s, dict)}
    added, removed = listed - indexed - skipped, indexed - listed
    captions = load_captions(Path(gallery), found)
    recaptioned = sum(1 for it in index.items if str(it["path"]) in listed
                      and captions.get(str(it["path"]), "") != it.get("caption", ""))
    parts = ([f"{len(added)} photos added"] * bool(added) + [f"{len(removed)} removed"] * bool(removed)
             + [f"{recaptioned} captions changed"] * bool(recaptioned))
    return ", ".join(parts)


def sessions_dir() -> Path:
    d = cache_dir() / "sessions"
    d.mkdir(parents=True, exist_ok=True)
    return d


def session_index_types(base: SearchEngine) -> list:
    """Index types offered for an uploaded gallery: ``auto`` (float vectors: exact flat search, IVF when
    large) and every ``ics-K`` compact binary index with a checkpoint for the live backbone."""
    return ["auto", *available_ics_types(search_path(base.settings), base.backbone.fingerprint,
                                         base.backbone.embed_dim)]


def build_session_engine(zip_path, base: SearchEngine, progress=None, index_type: str = "auto") -> SearchEngine:
    """Index an uploaded zip into a fresh session folder with the live backbone and ``index_type``
    (one of :func:`session_index_types`). The engine shares the base engine's models; it owns its index."""
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
    SESSIONS.start_janitor(settings)
    out = sessions_dir() / uuid.uuid4().hex
    try:
        index_source(zip_path, out, base.backbone, index_type=index_type, settings=settings, progress=progress,
                     workers=0)
        return open_engine(out, backbone=base.backbone, settings=settings, models_from=base)
    except OSError as exc:
        shutil.rmtree(out, ignore_errors=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # the server's to fix, told in one sentence, no traceback
            log.warning("a zip session could not be indexed: the disk is full")
            raise InputError("the server's disk is full, so your photos could not be indexed; try again later") \
                from None
        raise
    except Exception:
        shutil.rmtree(out, ignore_errors=True)
        raise


def _is_session_folder(folder: Path) -> bool:
    try:
        return sessions_dir().resolve() in Path(folder).resolve().parents
    except OSError:
        return False


class SessionStore:
    """The live per-session galleries, keyed by an opaque id kept in the page's state.

    At most ``settings.max_sessions`` live at once (the least recently used is closed when another is
    opened); one unused for ``settings.session_ttl_s`` is closed; a closed session's folder is deleted.
    Its owner's next request is told why in one sentence. Folders under the sessions folder that belong to
    no live session (left by an earlier server) are deleted once older than the time to live, at start and
    then periodically by a daemon thread."""

    FORGET_AFTER = 10_000  # remembered reasons for closed sessions

    def __init__(self):
        self._live: "OrderedDict[str, list]" = OrderedDict()  # key -> [engine, last used]
        self._closed: "OrderedDict[str, str]" = OrderedDict()
        self._lock = threading.Lock()
        self._janitor: Optional[threading.Thread] = None
        self.settings: Optional[Settings] = None

    def __len__(self) -> int:
        return len(self._live)

    def add(self, engine: SearchEngine) -> str:
        settings = engine.settings
        key = uuid.uuid4().hex
        with self._lock:
            self._expire(settings.session_ttl_s)
            while len(self._live) >= max(1, settings.max_sessions):
                old, _ = next(iter(self._live.items()))
                self._close(old, f"this server keeps at most {settings.max_sessions} uploaded galleries at once "
                                 "and closed yours for a newer one; upload your zip again")
            self._live[key] = [engine, time.monotonic()]
        return key

    def get(self, key) -> SearchEngine:
        with self._lock:
            entry = self._live.get(key)
            if entry is not None and self.settings is not None and \
                    time.monotonic() - entry[1] > self.settings.session_ttl_s:
                self._expire(self.settings.session_ttl_s)
                entry = None
            if entry is None:
                reason = self._closed.get(key, "your uploaded gallery is no longer on the server; upload your zip again")
                raise InputError(reason)
            entry[1] = time.monotonic()
            self._live.move_to_end(key)
            return entry[0]

    def drop(self, key) -> None:
        with self._lock:
            entry = self._live.pop(key, None)
        if entry is not None:
            _delete_folder(entry[0])

    def _close(self, key: str, reason: str) -> None:
        engine, _ = self._live.pop(key)
        self._closed[key] = reason
        while len(self._closed) > self.FORGET_AFTER:
            self._closed.popitem(last=False)
        _delete_folder(engine)

    def _expire(self, ttl: float) -> None:
        now = time.monotonic()
        for key in [k for k, (_, used) in self._live.items() if now - used > ttl]:
            minutes = max(1, round(ttl / 60))
            self._close(key, f"your uploaded gallery was closed after {minutes} minutes without use; "
                             "upload your zip again")

    def sweep(self, settings: Settings) -> int:
        """Close expired sessions and delete orphaned session folders older than ``settings``' time to live."""
        with self._lock:
            self._expire(settings.session_ttl_s)
            live = {Path(e[0].index.folder).resolve() for e in self._live.values()}
        removed, now = 0, time.time()
        for folder in sessions_dir().iterdir():
            try:
                if folder.resolve() in live or now - folder.stat().st_mtime <= settings.session_ttl_s:
                    continue
            except OSError:
                continue
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
        return removed

    def start_janitor(self, settings: Settings) -> None:
        """Sweep now, then every quarter of the time to live (at most every 10 minutes) in a daemon thread."""
        with self._lock:
            self.settings = settings
            if self._janitor is not None:
                return
            self._janitor = threading.Thread(target=self._run_janitor, name="cis-session-janitor", daemon=True)
        self.sweep(settings)
        self._janitor.start()

    def _run_janitor(self) -> None:
        while True:
            time.sleep(max(1.0, min(600.0, self.settings.session_ttl_s / 4)))
            try:
                self.sweep(self.settings)
            except Exception:  # never let the janitor die
                log.exception("session sweep failed")


SESSIONS = SessionStore()


def open_session(zip_path, base: SearchEngine, old=None, progress=None, index_type: str = "auto") -> str:
    """Build a session gallery from ``zip_path``, register it, close ``old``; returns the new session key."""
    engine = build_session_engine(zip_path, base, progress=progress, index_type=index_type)
    key = SESSIONS.add(engine)
    drop_session_engine(old)
    return key


def session_engine(value) -> Optional[SearchEngine]:
    """The engine of a page's session state (a key from :func:`open_session`); None when nothing was indexed."""
    if value is None or isinstance(value, SearchEngine):
        return value
    return SESSIONS.get(value)


def _delete_folder(engine: SearchEngine) -> None:
    folder = Path(engine.index.folder)
    if _is_session_folder(folder):
        shutil.rmtree(folder, ignore_errors=True)


def drop_session_engine(value) -> None:
    """Close a session gallery (a key, or an engine) and delete its files (extracted images, thumbnails, index)."""
    if value is None:
        return
    if isinstance(value, SearchEngine):
        _delete_folder(value)
    else:
        SESSIONS.drop(value)
