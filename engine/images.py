"""Safe image decoding: the one bounded decoder (:func:`load_image`) every route uses: header checks, a
byte budget for the real pixel mode, every Pillow mode turned into RGB or refused in one sentence."""
from __future__ import annotations

import ctypes

import hashlib
import io
import os
import struct
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Optional, Union

from PIL import Image, UnidentifiedImageError

from .errors import InputError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff", ".gif")
DEFAULT_MAX_PIXELS = 40_000_000
DEFAULT_MAX_BYTES = 50 * 1024 * 1024
DEFAULT_MAX_ASPECT = 20.0  # long side / short side
DEFAULT_MAX_FRAMES = 100
DEFAULT_MAX_DECODE_BYTES = 128_000_000  # CIS_MAX_DECODE_MB: bytes one decode may use (decode_cost)
# what Image.open may identify: other Pillow formats (EPS through Ghostscript, PSD, ...) are never opened
FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "TIFF", "GIF")
WORKING_SIDE = 1024  # decoded images are reduced so their short side is about this (draft/reduce), then bounded
REFERENCE_SIDE = 384  # ... and a search's reference, which is only embedded (backbones take 224-336 pixels)

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


# -- the one bounded decoder ------------------------------------------------------------------------------
# Bytes Pillow keeps per pixel for a decoded image of each mode (its internal storage: 1-bit and palette
# images use a byte per pixel, 16-bit grayscale two, every multi-band mode four, RGB included).
_ONE_BYTE = {"1", "L", "P"}
_TWO_BYTES = {"I;16", "I;16B", "I;16L", "I;16N"}
_FOUR_BYTES = {"LA", "PA", "La", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV", "I", "F"}
# formats whose decoder holds a second full-size buffer while it decodes (libwebp's RGBA, libtiff's strips)
_DOUBLE_BUFFERED = {"WEBP", "TIFF"}
# decoders written in Python (Pillow's RLE BMP): they build the image in a Python buffer (a second full copy)
# and hold the interpreter lock a few seconds per 40 MP, so they get a pixel limit of their own
_PY_DECODERS = {"bmp_rle"}
PY_DECODER_MAX_PIXELS = 2_000_000
# every decode in the process holds its cost in this budget while it runs (CIS_DECODE_BUDGET_MB), so N
# concurrent images cannot use more than it together; a decode that finds no room waits up to DECODE_WAIT_S
DEFAULT_DECODE_BUDGET = 160_000_000
DECODE_WAIT_S = 30.0
BUSY_DECODING = "the server is decoding too many images at once; try again in a moment"
OUTPUT_MAX_PIXELS = 16_000_000  # the decoded working copy handed on (preprocess, thumbnails) holds at most this
_STRIP_BYTES = 2 << 20  # converted piece by piece, about this many bytes at a time


def decode_limits(settings) -> dict:
    """The keyword arguments of :func:`load_image` from a :class:`engine.config.Settings` (every route that
    decodes an image passes these, so one set of limits holds whatever brought the image)."""
    return {"max_pixels": int(settings.max_pixels), "max_bytes": int(settings.max_upload_mb * 1e6),
            "max_aspect": float(settings.max_aspect), "max_frames": int(settings.max_frames),
            "max_decode_bytes": int(settings.max_decode_mb * 1e6)}


def bytes_per_pixel(mode: str) -> int:
    if mode in _ONE_BYTE:
        return 1
    if mode in _TWO_BYTES:
        return 2
    if mode in _FOUR_BYTES:
        return 4
    raise KeyError(mode)


def _reduce_factor(size: tuple, side: int = WORKING_SIDE, out_max: int = OUTPUT_MAX_PIXELS) -> int:
    """The integer box-filter factor for a decoded image: its short side is brought to about 2 x ``side``
    and its pixel count under ``out_max`` (1 = keep the size)."""
    w, h = size
    factor = max(1, min(w, h) // (2 * side))
    while (w // factor) * (h // factor) > out_max:
        factor += 1
    return factor if factor >= 2 else 1


def decode_cost(size: tuple, mode: str, fmt: Optional[str], side: int = WORKING_SIDE) -> int:
    """Bytes that decoding an image of this header needs at its peak: the decoded pixels in their real mode
    (16-bit, alpha and CMYK count four bytes a pixel, palette and 1-bit one), twice for decoders that keep
    their own full buffer, plus the 8-bit RGB working copy made from it when it is converted or reduced."""
    w, h = size
    decoded = w * h * bytes_per_pixel(mode) * (2 if fmt in _DOUBLE_BUFFERED else 1)
    factor = _reduce_factor(size, side)
    copy = 0 if (mode == "RGB" and factor == 1) else (w // factor) * (h // factor) * 4
    return decoded + copy


class DecodeBudget:
    """Bytes of decoding in flight, process-wide: a decode reserves its cost (:func:`decode_cost`) before it
    starts and returns it when done; one that does not fit waits, then is refused in one sentence. A cost
    over the whole budget is reserved as the whole budget (the decode runs alone). ``capacity`` None:
    ``DEFAULT_DECODE_BUDGET`` until the entry point sizes it from its Settings (:func:`configure`)."""

    def __init__(self, capacity: Optional[int] = None):
        self.capacity = DEFAULT_DECODE_BUDGET if capacity is None else max(1, int(capacity))
        self.used = 0
        self._cond = threading.Condition()

    def resize(self, mb) -> None:
        """Sets the capacity to ``mb`` megabytes (a value that is not a positive number below 1e9:
        ``DEFAULT_DECODE_BUDGET``); decodes in flight keep what they hold, waiting ones see the new size."""
        try:
            mb = float(mb)
        except (TypeError, ValueError):
            mb = 0.0
        with self._cond:
            self.capacity = int(mb * 1e6) if 0 < mb < 1e9 else DEFAULT_DECODE_BUDGET
            self._cond.notify_all()

    @contextmanager
    def hold(self, cost: int, wait_s: Optional[float] = None):
        cost = max(0, min(int(cost), self.capacity))
        deadline = time.monotonic() + (DECODE_WAIT_S if wait_s is None else wait_s)
        with self._cond:
            while self.used and self.used + cost > self.capacity:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise InputError(BUSY_DECODING)
                self._cond.wait(left)
            self.used += cost
        try:
            yield
        finally:
            with self._cond:
                self.used -= cost
                self._cond.notify_all()


BUDGET = DecodeBudget()


def configure(settings) -> None:
    """Sizes the process-wide decode budget from the entry point's :class:`engine.config.Settings`
    (``decode_budget_mb``, CIS_DECODE_BUDGET_MB). Called once where the Settings is built (app.py, the CLIs,
    each command's ``main``), through ``engine.process.configure_process`` where the layers allow; a process that
    never calls it decodes within ``DEFAULT_DECODE_BUDGET``."""
    BUDGET.resize(settings.decode_budget_mb)


HEAP_MMAP_THRESHOLD = 1 << 20


def _fixed_mmap_threshold(threshold: int = HEAP_MMAP_THRESHOLD) -> bool:
    """glibc raises its mmap threshold each time a large block is freed (up to 32 MB), so after the first
    decode every decoded image lands in the heap arena of the thread that decoded it and stays resident there
    when freed: ten worker threads each kept their largest decode (10 concurrent 5000x5000 PNGs peaked at
    +464 MB under a 192 MB budget). A fixed threshold keeps every block over it in its own mapping, handed
    back to the system when freed. False where the C library is not glibc."""
    try:

        return bool(ctypes.CDLL("libc.so.6").mallopt(-3, int(threshold)))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


_fixed_mmap_threshold()

_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_PROGRESSIVE_SOF = {0xC2, 0xC6, 0xCA, 0xCE}


def jpeg_coefficient_bytes(data: bytes) -> int:
    """Bytes libjpeg keeps for a JPEG's whole-image DCT coefficient buffers: for a progressive JPEG, or a
    baseline one whose first scan does not hold every component (multi-scan), libjpeg stores every
    coefficient of the full-size image (2 bytes each, 64 per 8x8 block of each component) whatever scale
    ``draft`` asks for; 0 for a single-scan baseline JPEG (decoded a row of blocks at a time). Read from the
    marker segments alone, before any pixel is decoded."""
    pos, end = 2, len(data)
    frame = None
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return 0  # not a marker where one must be: leave it to the decoder to refuse
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0x01,) or 0xD0 <= marker <= 0xD7:
            pos += 2
            continue
        length = struct.unpack(">H", data[pos + 2:pos + 4])[0]
        seg = data[pos + 4:pos + 2 + length]
        if marker in _SOF and len(seg) >= 6:
            h, w, n = struct.unpack(">HHB", seg[1:6])
            comps = [(seg[6 + 3 * i + 1] >> 4, seg[6 + 3 * i + 1] & 15) for i in range(n) if 6 + 3 * i + 2 < len(seg)]
            frame = (marker, w, h, comps)
        elif marker == 0xDA:  # the first scan: is it the only one?
            if frame is None or not frame[3]:
                return 0
            marker_sof, w, h, comps = frame
            scan_components = seg[0] if seg else 0
            if marker_sof not in _PROGRESSIVE_SOF and scan_components >= len(comps):
                return 0
            hmax = max(1, max(c[0] for c in comps))
            vmax = max(1, max(c[1] for c in comps))
            total = 0
            for hs, vs in comps:
                bw = -(-(-(-w * max(1, hs) // hmax)) // 8)
                bh = -(-(-(-h * max(1, vs) // vmax)) // 8)
                total += bw * bh * 64 * 2
            return total
        elif marker == 0xD9:
            return 0
        pos += 2 + length
    return 0


def _mode_name(mode: str) -> str:
    return {"1": "1-bit", "P": "palette", "L": "grayscale", "LA": "grayscale with alpha", "I;16": "16-bit grayscale",
            "I": "32-bit integer", "F": "floating-point", "CMYK": "CMYK", "RGBA": "RGBA"}.get(mode, mode)


def _strip_to_rgb(strip: Image.Image, scale: Optional[float]) -> Image.Image:
    """One piece of a decoded image as 8-bit RGB: alpha composited on white, 16/32-bit and float samples
    scaled by ``scale`` (255 / the image's largest sample), palette and 1-bit images expanded."""
    mode = strip.mode
    if mode in _TWO_BYTES or mode in ("I", "F"):
        import numpy as np

        arr = np.asarray(strip).astype(np.float32)
        arr = np.nan_to_num(arr * (scale or 0.0), nan=0.0, posinf=255.0, neginf=0.0)
        return Image.fromarray(arr.clip(0, 255).astype(np.uint8), mode="L").convert("RGB")
    if mode == "P":
        strip = strip.convert("RGBA" if "transparency" in strip.info else "RGB")
        mode = strip.mode
    if mode == "La":
        strip, mode = strip.convert("LA"), "LA"
    if mode in ("RGBA", "LA", "PA", "RGBa"):
        rgba = strip.convert("RGBA")
        out = Image.new("RGB", rgba.size, (255, 255, 255))
        out.paste(rgba, mask=rgba.getchannel("A"))
        return out
    return strip if mode == "RGB" else strip.convert("RGB")


def _sample_scale(img: Image.Image, rows: int) -> Optional[float]:
    """255 / the largest sample of a 16/32-bit or float image, found piece by piece (None for other modes)."""
    if img.mode not in _TWO_BYTES and img.mode not in ("I", "F"):
        return None
    import numpy as np

    hi = 0.0
    for top in range(0, img.height, rows):
        arr = np.asarray(img.crop((0, top, img.width, min(img.height, top + rows))))
        finite = arr[np.isfinite(arr)] if arr.dtype.kind == "f" else arr
        if finite.size:
            hi = max(hi, float(finite.max()))
    return 255.0 / hi if hi > 0 else 0.0


def to_rgb(img: Image.Image, factor: int = 1) -> Image.Image:
    """A decoded image of any supported mode as an 8-bit RGB copy reduced by ``factor`` (box filter),
    made a strip of rows at a time, so the peak is the decoded image plus the (smaller) copy."""
    if img.mode not in _ONE_BYTE | _TWO_BYTES | _FOUR_BYTES:
        raise InputError(f"the image uses Pillow's {img.mode} mode, which this app cannot read; save it as "
                         "an 8-bit RGB or grayscale jpg or png")
    if img.mode == "RGB" and factor == 1:
        return img
    w, h = img.size
    rows = max(factor, (_STRIP_BYTES // max(1, w * 4)) // factor * factor)
    scale = _sample_scale(img, rows)
    out = Image.new("RGB", (w // factor, h // factor))
    for top in range(0, (h // factor) * factor, rows):
        bottom = min(top + rows, (h // factor) * factor)
        piece = _strip_to_rgb(img.crop((0, top, (w // factor) * factor, bottom)), scale)
        if factor > 1:
            piece = piece.reduce(factor)
        out.paste(piece, (0, top // factor))
    return out


_TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
              5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}


def _orientation(img: Image.Image) -> int:
    try:
        return int(img.getexif().get(0x0112, 1) or 1)
    except Exception:  # broken EXIF should not make a readable image unusable
        return 1


def load_image(
    source: ImageSource,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_aspect: float = DEFAULT_MAX_ASPECT,
    max_frames: int = DEFAULT_MAX_FRAMES,
    max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES,
    side: int = WORKING_SIDE,
) -> Image.Image:
    """Decode an image within bounded memory; an 8-bit RGB image, or InputError with one sentence.

    Every route that brings an image (upload, ``data:`` URL, base64, zip member, gallery item, evaluation
    file) ends here. Before any pixel is decoded the header is checked: format (jpg, png, webp, bmp, tiff,
    gif), pixels, aspect ratio, frames, and the bytes decoding would need in the image's real mode
    (:func:`decode_cost`) against ``max_decode_bytes``. JPEGs are decoded at a reduced scale (``draft``);
    other images are decoded, then turned into RGB and reduced a strip at a time (:func:`to_rgb`), so the
    returned image's short side is at most about 2 x ``side`` and it holds at most OUTPUT_MAX_PIXELS. A caller
    that only embeds the image (a search's reference) passes a smaller ``side`` (REFERENCE_SIDE): the copy it
    holds while the image is preprocessed is then small, and so is what concurrent searches hold together."""
    if isinstance(source, Image.Image):
        check_header(source, "image", max_pixels, max_aspect, max_frames)
        orientation = _orientation(source)
        out = to_rgb(source, _reduce_factor(source.size, side))
        return out.transpose(_TRANSPOSE[orientation]) if orientation in _TRANSPOSE else out
    data = read_bytes(source, max_bytes)
    name = Path(source).name if not isinstance(source, bytes) else "the file"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limits are checked next
            img = Image.open(io.BytesIO(data), formats=FORMATS)
            check_header(img, name, max_pixels, max_aspect, max_frames)
            img.seek(0)  # first frame of animations
            full_size = img.size  # what the message names (draft() below changes img.size)
            # buffers the decoder keeps at the full size whatever the output size: counted before draft()
            full = jpeg_coefficient_bytes(data) if img.format in ("JPEG", "MPO") else 0
            decoder = img.tile[0][0] if img.tile else ""
            if decoder in _PY_DECODERS:
                w, h = img.size
                if w * h > PY_DECODER_MAX_PIXELS:
                    raise InputError(f"{name} is a run-length compressed BMP of {w}x{h} pixels; this kind is "
                                     f"slow to decode and limited to {PY_DECODER_MAX_PIXELS:,} pixels; save it "
                                     "as a png or jpg")
                full = w * h * bytes_per_pixel(img.mode)  # the Python decoder's own buffer
            if img.format in ("JPEG", "MPO") and min(img.size) > 2 * side:
                img.draft("RGB", (side, side))  # DCT scaling: decodes at 1/2, 1/4 or 1/8
            try:
                cost = decode_cost(img.size, img.mode, img.format, side) + full
            except KeyError:
                raise InputError(f"{name} uses the {img.mode} colour mode, which this app cannot read; save it "
                                 "as an 8-bit RGB or grayscale jpg or png") from None
            if cost > max_decode_bytes:
                w, h = full_size
                raise InputError(f"{name} ({w}x{h} pixels, {_mode_name(img.mode)}) needs {cost / 1e6:.0f} MB to "
                                 f"decode; the limit is {max_decode_bytes / 1e6:.0f} MB")
            with BUDGET.hold(cost):  # bytes in flight, process-wide: the decode and its RGB copy
                img.load()
                orientation = _orientation(img)  # after load: a PNG's getexif() decodes the whole image
                try:
                    out = to_rgb(img, _reduce_factor(img.size, side))
                except InputError:
                    raise
                except (OSError, ValueError) as exc:
                    raise InputError(f"{name} could not be converted to RGB ({exc})") from None
                del img
    except InputError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InputError(f"{name} is too large to decode safely (decompression bomb limit)") from None
    except UnidentifiedImageError:
        raise InputError(f"{name} is not an image this app can read (jpg, png, webp, bmp, tiff, gif)") from None
    except (OSError, SyntaxError, ValueError, EOFError, IndexError, struct.error, MemoryError):
        raise InputError(f"{name} could not be decoded (truncated or corrupt file)") from None
    return out.transpose(_TRANSPOSE[orientation]) if orientation in _TRANSPOSE else out
