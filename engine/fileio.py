"""Atomic file writes: write a temporary file in the target folder, flush it to disk, then rename it
over the target, so a crash leaves either the old file or the new one, never half of one."""
from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Union

PathLike = Union[str, os.PathLike]


@contextmanager
def atomic_path(path: PathLike, mode: Optional[int] = None) -> Iterator[Path]:
    """For writers that need a file name (safetensors ``save_file``, ``torch.save``, ``savefig``): yields a
    unique temporary path next to ``path`` (``mkstemp``, so concurrent writers never share one) and renames
    it over ``path`` when the block succeeds; on failure the temporary file is removed. ``mode`` sets the
    permissions (default: readable like a normally created file, 0o666 less the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix or ".tmp"  # keep the extension: some writers pick the format from it
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".tmp{suffix}", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: PathLike, data: bytes, durable: bool = True) -> Path:
    """``durable=False`` skips flushing the file to disk before the rename (about 3.5 ms a file here): for many
    small derived files that are checked against a recorded checksum when read (the gallery's thumbnails), so
    one a crash left empty is found and made again; the rename still never exposes half a write."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
    return Path(path)


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


def atomic_save_figure(fig, path: PathLike, dpi: int = 110) -> Path:
    """Writes a matplotlib figure as PNG atomically (temporary file, then rename) and closes it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=dpi, format="png")
    finally:
        plt.close(fig)
    return path
