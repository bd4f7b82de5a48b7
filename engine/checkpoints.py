"""Checks shared by every learned part's checkpoint loader."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from .errors import CheckpointError


def require_backbone(path: os.PathLike, stored: Optional[str], live: Optional[str], how_to_retrain: str = "") -> None:
    """Refuse a checkpoint trained for another backbone, naming the file (no check when ``live`` is None)."""
    if live is not None and stored != live:
        hint = f"; retrain it with `{how_to_retrain}`" if how_to_retrain else ""
        raise CheckpointError(f"{Path(path).name} was trained for backbone {stored!r}, "
                              f"not for the live backbone {live!r}{hint}")


def read_safetensors_record(path: os.PathLike, key: str, label: str) -> dict:
    """The JSON record stored under ``key`` in a safetensors file's metadata, without loading tensors.

    The record must say ``"kind": key`` and hold a ``config``; anything else raises CheckpointError
    naming the file (``label`` is the part's name for messages, e.g. "RTIC")."""
    import json

    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{label} checkpoint not found: {path.name}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        record = json.loads(meta[key])
    except Exception as exc:  # damaged file, not safetensors, no metadata
        raise CheckpointError(f"{path.name} is not a valid {label} checkpoint ({exc.__class__.__name__})") from None
    if not isinstance(record, dict) or record.get("kind") != key or "config" not in record:
        raise CheckpointError(f"{path.name} is not a {label} checkpoint")
    return record


def find_checkpoints(checkpoint_dir: os.PathLike, pattern: str, read_record, fingerprint: str):
    """[(path, record)] for the readable checkpoints matching ``pattern`` in ``checkpoint_dir`` whose
    record says they were trained for backbone ``fingerprint``; unreadable files are passed over."""
    directory = Path(checkpoint_dir)
    found = []
    if not directory.is_dir():
        return found
    for path in sorted(directory.glob(pattern)):
        try:
            record = read_record(path)
        except CheckpointError:
            continue
        if record.get("backbone_fingerprint") == fingerprint:
            found.append((path, record))
    return found
