"""Safe image decoding: content-type checks, pixel limits, EXIF orientation, mode normalisation."""
from __future__ import annotations

import hashlib
import io
import os
import warnings
from pathlib import Path
from typing import Union

from PIL import Image, ImageOps, UnidentifiedImageError

from .errors import InputError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif")
DEFAULT_MAX_PIXELS = 40_000_000
DEFAULT_MAX_BYTES = 50 * 1024 * 1024
DEFAULT_MAX_ASPECT = 20.0  # long side / short side
DEFAULT_MAX_FRAMES = 100
WORKING_SIDE = 1024  # decoded images are reduced so their short side is about this (draft/reduce), then bounded

ImageSource = Union[str, os.PathLike, bytes, Image.Image]


def sha256_file(path: Union[str, os.PathLike], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def read_bytes(source: Union[str, os.PathLike, bytes], max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    if isinstance(source, bytes):
        data = source
    else:
        path = Path(source)
        if not path.is_file():
            raise InputError(f"image file not found: {path.name}")
        size = path.stat().st_size
        if size > max_bytes:
            raise InputError(f"{path.name} is {size / 1e6:.1f} MB; the limit is {max_bytes / 1e6:.0f} MB")
        data = path.read_bytes()
    if len(data) > max_bytes:
        raise InputError(f"image is {len(data) / 1e6:.1f} MB; the limit is {max_bytes / 1e6:.0f} MB")
    if not data:
        raise InputError("the image file is empty")
    return data


def _normalise_mode(img: Image.Image) -> Image.Image:
    """Return an 8-bit RGB image; alpha is composited on white, 16-bit and CMYK are converted."""
    if img.mode in ("I;16", "I;16B", "I;16L", "I"):
        import numpy as np

        arr = np.asarray(img, dtype=np.float64)
        hi = arr.max() if arr.size else 1.0
        arr = (arr / (hi if hi > 0 else 1.0) * 255.0).clip(0, 255).astype("uint8")
        img = Image.fromarray(arr, mode="L")
    if img.mode == "P":
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA"):
        rgba = img.convert("RGBA")
        bg = Image.new("RGB", rgba.size, (255, 255, 255))
        bg.paste(rgba, mask=rgba.getchannel("A"))
        return bg
    if img.mode != "RGB":
        img = img.convert("RGB")
    return img


def check_header(img: Image.Image, name: str, max_pixels: int = DEFAULT_MAX_PIXELS,
                 max_aspect: float = DEFAULT_MAX_ASPECT, max_frames: int = DEFAULT_MAX_FRAMES) -> None:
    """Refuse an opened (not yet decoded) image by its header alone: pixels, aspect ratio, frame count."""
    w, h = img.size
    if w < 1 or h < 1:
        raise InputError(f"{name} has no pixels")
    if w * h > max_pixels:
        raise InputError(f"{name} has {w}x{h} pixels; the limit is {max_pixels:,} pixels")
    if max(w, h) / min(w, h) > max_aspect:
        raise InputError(f"{name} is {w}x{h} pixels; images longer than {max_aspect:g} times their width "
                         "are refused")
    if img.format == "GIF":  # Pillow's n_frames decodes every frame; count the blocks instead
        frames = gif_frame_count(img.fp, stop_after=max_frames + 1)
    else:  # APNG/WebP read the count from a header, TIFF walks its directories: no pixels are decoded
        frames = getattr(img, "n_frames", 1) if getattr(img, "is_animated", False) else 1
    if frames > max_frames:
        raise InputError(f"{name} has more than {max_frames} frames; the limit is {max_frames}")


def gif_frame_count(fp, stop_after: int = 1 << 30) -> int:
    """Frames in a GIF, counted by walking its blocks (no LZW decoding); stops once ``stop_after`` is
    reached. ``fp``'s position is restored."""
    pos = fp.tell()
    try:
        fp.seek(0)
        head = fp.read(13)
        if len(head) < 13:
            return 1
        if head[10] & 0x80:  # global colour table
            fp.seek(3 * (2 << (head[10] & 7)), 1)
        frames = 0

        def skip_sub_blocks():
            while True:
                n = fp.read(1)
                if not n or n[0] == 0:
                    return
                fp.seek(n[0], 1)

        while frames < stop_after:
            b = fp.read(1)
            if not b or b == b"\x3b":
                break
            if b == b"\x21":  # extension: label, then sub-blocks
                fp.read(1)
                skip_sub_blocks()
            elif b == b"\x2c":  # image descriptor
                desc = fp.read(9)
                if len(desc) < 9:
                    break
                frames += 1
                if desc[8] & 0x80:
                    fp.seek(3 * (2 << (desc[8] & 7)), 1)
                fp.read(1)  # LZW minimum code size
                skip_sub_blocks()
            else:
                break
        return max(frames, 1)
    finally:
        fp.seek(pos)


def _bounded(img: Image.Image, side: int = WORKING_SIDE) -> Image.Image:
    """Reduce a decoded image whose short side is over twice ``side`` by an integer factor (cheap box
    filter), so later resizes and mode conversions work on a bounded number of pixels."""
    factor = min(img.size) // (2 * side)
    if factor >= 2:
        img = img.reduce(factor)
    return img


def load_image(
    source: ImageSource,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_aspect: float = DEFAULT_MAX_ASPECT,
    max_frames: int = DEFAULT_MAX_FRAMES,
) -> Image.Image:
    """Decode an image safely. Raises InputError with a readable reason on any problem.

    The header is checked (pixels, aspect ratio, frames) before any pixel is decoded; JPEGs are decoded
    at a reduced scale (``draft``) and other large images reduced right after decoding, so the returned
    image's short side is at most about 2 x WORKING_SIDE."""
    if isinstance(source, Image.Image):
        check_header(source, "image", max_pixels, max_aspect, max_frames)
        return _normalise_mode(_bounded(ImageOps.exif_transpose(source) or source))
    data = read_bytes(source, max_bytes)
    name = Path(source).name if not isinstance(source, bytes) else "upload"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit is checked next
            img = Image.open(io.BytesIO(data))
            check_header(img, name, max_pixels, max_aspect, max_frames)
            img.seek(0)  # first frame of animations
            if img.format == "JPEG" and min(img.size) > 2 * WORKING_SIDE:
                img.draft("RGB", (WORKING_SIDE, WORKING_SIDE))  # DCT scaling: decodes at 1/2, 1/4 or 1/8
            img.load()
    except InputError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InputError(f"{name} is too large to decode safely (decompression bomb limit)") from None
    except UnidentifiedImageError:
        raise InputError(f"{name} is not an image this app can read (jpg, png, webp, bmp, tiff, gif)") from None
    except (OSError, SyntaxError, ValueError, EOFError):
        raise InputError(f"{name} could not be decoded (truncated or corrupt file)") from None
    img = _bounded(img)
    try:
        img = ImageOps.exif_transpose(img) or img
    except Exception:  # broken EXIF should not make a readable image unusable
        pass
    return _normalise_mode(img)
