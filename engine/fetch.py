"""A checkpoint from a local path or an http(s) URL, verified by SHA-256 before anything uses it.

URLs are downloaded with a progress bar into ``<cache>/downloads/`` as a temporary file; the file is moved
to its final name only when its SHA-256 equals the expected one. On a mismatch the temporary file is
removed and :class:`~engine.errors.InputError` says so in one sentence, so nothing is left behind.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Optional
from urllib.parse import urlparse

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


def fetch_verified(source: str, sha256: str, quiet: bool = False, cache: Optional[Path] = None) -> Path:
    """Local path or downloaded copy of ``source`` whose SHA-256 is ``sha256`` (InputError otherwise)."""
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
    from .config import cache_dir

    folder = Path(cache) if cache else cache_dir() / "downloads"
    folder.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(parsed.path).name or "checkpoint") or "checkpoint"
    final = folder / f"{want[:16]}-{name}"
    if final.is_file() and file_sha256(final) == want:
        return final
    import urllib.request

    from tqdm.auto import tqdm

    tmp = folder / f".{final.name}.part-{os.getpid()}"
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(str(source), timeout=60) as resp, open(tmp, "wb") as f:
            total = int(resp.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"download {name}", disable=quiet) as bar:
                for chunk in iter(lambda: resp.read(CHUNK), b""):
                    f.write(chunk)
                    h.update(chunk)
                    bar.update(len(chunk))
        got = h.hexdigest()
        if got != want:
            raise ChecksumError(f"the download of {name} has SHA-256 {got}, not the expected {want}; "
                             "refusing to use it (nothing was kept)")
        os.replace(tmp, final)
    except OSError as exc:
        raise InputError(f"could not download {name}: {exc}") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return final
