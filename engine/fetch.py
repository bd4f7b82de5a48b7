"""A checkpoint from a local path or an http(s) URL, verified by SHA-256 before anything uses it.

URLs are downloaded with a progress bar into ``<cache>/downloads/`` as a temporary file; the file is moved
to its final name only when its SHA-256 equals the expected one. On a mismatch the temporary file is
removed and :class:`~engine.errors.InputError` says so in one sentence, so nothing is left behind.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import re
import signal
import threading
import time
import urllib.request
from pathlib import Path
from typing import Optional
from urllib.parse import urljoin, urlparse

from .config import cache_dir
from .errors import InputError

CHUNK = 1 << 20


class ChecksumError(InputError):
    """The file is not the one asked for (SHA-256 mismatch); nothing was kept."""


def _check_hex(sha256: Optional[str]) -> str:
    value = (sha256 or "").strip().lower()
    if not re.fullmatch(r"[0-9a-f]{64}", value):
        raise InputError("--sha256 must be the file's 64-hex-digit SHA-256")
    return value


def file_sha256(path: os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


_PARTIAL: set = set()  # .part files of downloads in progress, removed at exit whatever ends the process


def _remove_partials() -> None:
    for tmp in list(_PARTIAL):
        try:
            Path(tmp).unlink(missing_ok=True)
        except OSError:
            pass
        _PARTIAL.discard(tmp)


atexit.register(_remove_partials)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_parts(folder: Path, final_name: str) -> None:
    """``.part`` files of this download left by a process that no longer runs (killed with SIGKILL)."""
    for stale in folder.glob(f".{final_name}.part-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or not _pid_alive(int(pid)):
            stale.unlink(missing_ok=True)


class SameHostRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the host the download started on (http -> https allowed); any other host
    is refused in one sentence."""

    def __init__(self, host: str, name: str):
        self.host, self.name = host.lower(), name

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        target = urlparse(urljoin(req.full_url, newurl))
        if target.scheme not in ("http", "https") or (target.hostname or "").lower() != self.host:
            raise InputError(f"the download of {self.name} redirects to another host "
                             f"({target.hostname or target.scheme}); refusing to follow it")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


@contextlib.contextmanager
def _terminate_cleanly():
    """In the main thread, SIGTERM during the block exits through ``finally`` blocks (so partial files go)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def fetch_verified(source: str, sha256: str, quiet: bool = False, cache: Optional[Path] = None,
                   deadline: Optional[float] = None) -> Path:
    """Local path or downloaded copy of ``source`` whose SHA-256 is ``sha256`` (InputError otherwise).

    ``deadline`` (a ``time.perf_counter()`` value, e.g. the end of ``prepare``'s budget) ends a download that
    would run past it, in one sentence. Redirects are followed only on the same host. The ``.part`` file of an
    unfinished download is removed on any error, on SIGTERM and at exit; one left by a killed process is
    removed by the next download of the same file."""
    want = _check_hex(sha256)
    parsed = urlparse(str(source))
    if parsed.scheme not in ("http", "https"):
        path = Path(source)
        if not path.is_file():
            raise InputError(f"checkpoint {source} does not exist")
        got = file_sha256(path)
        if got != want:
            raise ChecksumError(f"{path.name} has SHA-256 {got}, not the expected {want}; refusing to use it")
        return path

    folder = Path(cache) if cache else cache_dir() / "downloads"
    folder.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(parsed.path).name or "checkpoint") or "checkpoint"
    final = folder / f"{want[:16]}-{name}"
    if final.is_file() and file_sha256(final) == want:
        return final
    _remove_stale_parts(folder, final.name)

    from tqdm.auto import tqdm

    def left() -> float:
        return float("inf") if deadline is None else deadline - time.perf_counter()

    if left() <= 0:
        raise InputError(f"no time is left in the budget to download {name}")
    opener = urllib.request.build_opener(SameHostRedirects(parsed.hostname or "", name))
    tmp = folder / f".{final.name}.part-{os.getpid()}"
    _PARTIAL.add(str(tmp))
    h = hashlib.sha256()
    done = 0
    try:
        with _terminate_cleanly(), opener.open(str(source), timeout=min(60.0, max(1.0, left()))) as resp, \
                open(tmp, "wb") as f:
            total = int(resp.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"download {name}", disable=quiet) as bar:
                for chunk in iter(lambda: resp.read(CHUNK), b""):
                    if left() <= 0:
                        of = f" of {total / 1e6:.0f} MB" if total else ""
                        raise InputError(f"the download of {name} did not finish within the budget "
                                         f"({done / 1e6:.0f} MB{of} received); give a larger budget or "
                                         "download it first and pass its path")
                    f.write(chunk)
                    h.update(chunk)
                    done += len(chunk)
                    bar.update(len(chunk))
        got = h.hexdigest()
        if got != want:
            raise ChecksumError(f"the download of {name} has SHA-256 {got}, not the expected {want}; "
                                "refusing to use it (nothing was kept)")
        os.replace(tmp, final)
    except OSError as exc:
        raise InputError(f"could not download {name}: {getattr(exc, 'reason', None) or exc}") from None
    finally:
        if tmp.exists():
            tmp.unlink()
        _PARTIAL.discard(str(tmp))
    return final
