"""Run records: one JSON file per evaluation run, saying exactly what was measured and how."""
from __future__ import annotations

import datetime as _dt
import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Union

from ..errors import InputError
from ..fileio import atomic_write_json as write

RECORD_VERSION = 1
_REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def git_commit(cwd: Union[str, os.PathLike, None] = None) -> str:
    """``git rev-parse HEAD`` of the repository, or "unknown" (no git, no commit yet, not a repo)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=str(cwd or _REPO_ROOT),
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = out.stdout.strip()
    if out.returncode != 0 or len(commit) < 7:
        return "unknown"
    return commit


def git_dirty(cwd: Union[str, os.PathLike, None] = None) -> Optional[bool]:
    """True when tracked files differ from HEAD, None when git cannot tell."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=str(cwd or _REPO_ROOT),
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return bool(out.stdout.strip())


def file_hash(paths: Union[str, os.PathLike, Iterable[Union[str, os.PathLike]], None]) -> str:
    """sha256 (first 16 hex) over one checkpoint file, or every file of a checkpoint folder; "none" if none."""
    if paths is None:
        return "none"
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            files.extend(sorted(f for f in p.rglob("*") if f.is_file()))
        elif p.is_file():
            files.append(p)
        else:
            raise InputError(f"checkpoint not found: {p.name}")
    if not files:
        return "none"
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def _jsonable(value: Any) -> Any:
    """Numpy scalars/arrays and Paths -> plain JSON values."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return value.as_posix()
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


def atomic_write_json(path: Union[str, os.PathLike], data: Any) -> Path:
    """Write JSON atomically (no NaN: strict JSON for other tools)."""
    return write(path, _jsonable(data), indent=2, sort_keys=False, allow_nan=False)


def write_run_record(
    path: Union[str, os.PathLike],
    method: str,
    backbone_fingerprint: str,
    checkpoint_hash: str,
    template: Optional[str],
    protocol_flags: Dict[str, Any],
    metrics: Dict[str, Any],
    extra: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Write the JSON record of one run (atomically) and return it.

    Fields: record_version, method, backbone_fingerprint, checkpoint_hash, template,
    protocol_flags, metrics, date (UTC, ISO 8601), git_commit ("unknown" outside a git checkout),
    git_dirty, plus ``extra`` (data set summary, counts of missing images, ...).
    """
    if not method:
        raise InputError("a run record needs the method name")
    record: Dict[str, Any] = {
        "record_version": RECORD_VERSION,
        "method": method,
        "backbone_fingerprint": backbone_fingerprint,
        "checkpoint_hash": checkpoint_hash,
        "template": template,
        "protocol_flags": dict(protocol_flags),
        "metrics": metrics,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
    }
    if extra:
        record["extra"] = extra
    record = _jsonable(record)
    atomic_write_json(path, record)
    return record
