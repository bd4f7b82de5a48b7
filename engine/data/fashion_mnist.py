"""Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (IDX files, MIT licence).

The IDX format (as used by MNIST): a 4-byte magic number ``0x00 0x00 <dtype> <ndim>``, then
``ndim`` big-endian uint32 sizes, then the array in C order, big-endian. Files may be gzip-compressed.
"""
from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path
from typing import Union

import numpy as np

from ..errors import InputError
from .locations import FASHION_MNIST_DIR, configured

DEFAULT_DIR = FASHION_MNIST_DIR  # where the Debian package installs the files
ENV_DIR = "CIS_FASHION_MNIST_DIR"
DEBIAN_PACKAGE = "dataset-fashion-mnist"
LICENCE = "MIT (Zalando Research, Fashion-MNIST)"
CLASS_NAMES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

_IDX_DTYPES = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def parse_idx(data: bytes, name: str = "IDX data") -> np.ndarray:
    """Decode IDX bytes (already decompressed) into a native-endian numpy array."""
    if len(data) < 4:
        raise InputError(f"{name}: too short to be an IDX file")
    zero, code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or code not in _IDX_DTYPES:
        raise InputError(f"{name}: not an IDX file (magic {data[:4].hex()})")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise InputError(f"{name}: IDX header truncated")
    shape = struct.unpack(f">{ndim}I", data[4:header]) if ndim else ()
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) - header != expected:
        raise InputError(
            f"{name}: IDX body has {len(data) - header} bytes, shape {tuple(shape)} needs {expected}"
        )
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def read_idx(path: Union[str, os.PathLike]) -> np.ndarray:
    """Read an IDX file (``.gz`` or plain) into a numpy array."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"IDX file not found: {path.name}")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise InputError(f"{path.name}: damaged gzip stream ({exc})") from None
    return parse_idx(raw, path.name)


def data_dir(folder: Union[str, os.PathLike, None] = None) -> Path:
    """Folder with the Fashion-MNIST IDX files: ``folder``, else the one the entry point configured: the Debian
    location unless ``CIS_FASHION_MNIST_DIR`` points elsewhere (:mod:`engine.data.locations`, whose sources always
    name a folder)."""
    return Path(folder or configured().fashion_mnist_dir)


def available(folder: Union[str, os.PathLike, None] = None) -> bool:
    d = data_dir(folder)
    return all(_find(d, stem) is not None for pair in FILES.values() for stem in pair)


def _find(folder: Path, stem: str):
    for cand in (folder / f"{stem}.gz", folder / stem):
        if cand.is_file():
            return cand
    return None


def load(split: str, folder: Union[str, os.PathLike, None] = None) -> tuple[np.ndarray, np.ndarray]:
    """Images ``uint8 [N, 28, 28]`` and labels ``int64 [N]`` of the ``train`` (60k) or ``test`` (10k) file."""
    if split not in FILES:
        raise InputError(f"Fashion-MNIST split must be 'train' or 'test', not {split!r}")
    folder = data_dir(folder)
    paths = [_find(folder, stem) for stem in FILES[split]]
    if any(p is None for p in paths):
        raise InputError(
            f"Fashion-MNIST files not found in {folder}; install the Debian package "
            f"'{DEBIAN_PACKAGE}' (apt-get install {DEBIAN_PACKAGE}) or set {ENV_DIR}"
        )
    images, labels = read_idx(paths[0]), read_idx(paths[1])
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise InputError(f"{paths[0].name}/{paths[1].name}: unexpected shapes {images.shape} / {labels.shape}")
    return images.astype(np.uint8), labels.astype(np.int64)


def package_version() -> str:
    """Installed Debian package version, or 'unknown'."""
    status = Path("/var/lib/dpkg/status")
    try:
        text = status.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown"
    for block in text.split("\n\n"):
        if block.startswith(f"Package: {DEBIAN_PACKAGE}\n"):
            for line in block.splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    return "unknown"
