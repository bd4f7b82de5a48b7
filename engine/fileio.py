"""Atomic file writes: write a temporary file in the target folder, flush it to disk, then rename it
over the target, so a crash leaves either the old file or the new one, never half of one."""
from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Union

PathLike = Union[str, os.PathLike]


def atomic_write_bytes(path: PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: PathLike, obj: Any, **dumps_kwargs) -> Path:
    dumps_kwargs.setdefault("indent", 2)
    return atomic_write_text(path, json.dumps(obj, **dumps_kwargs) + "\n")


def atomic_save_npy(path: PathLike, array) -> Path:
    """``np.save`` without pickles, atomically."""
    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.asarray(array), allow_pickle=False)
    return atomic_write_bytes(path, buf.getvalue())
