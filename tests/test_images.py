"""Bad and unusual images: a clear InputError, or a correct RGB image."""
import io

import numpy as np
import pytest
from PIL import Image

from engine.errors import InputError
from engine.images import load_image


def _png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def test_not_an_image(tmp_path):
    p = tmp_path / "notes.jpg"
    p.write_text("this is text pretending to be a jpeg")
    with pytest.raises(InputError, match="not an image"):
        load_image(p)


def test_truncated_file():
    data = _png(Image.new("RGB", (200, 200), (1, 2, 3)))
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (300, 300, 3), dtype=np.uint8)).save(buf, "JPEG")
    with pytest.raises(InputError, match="truncated or corrupt|not an image"):
        load_image(buf.getvalue()[: len(buf.getvalue()) // 3])
    assert load_image(data).size == (200, 200)


def test_decompression_bomb_is_refused():
    big = Image.new("1", (12000, 12000))  # 144 Mpx, tiny file
    buf = io.BytesIO()
    big.save(buf, "PNG")
    assert len(buf.getvalue()) < 1_000_000
    with pytest.raises(InputError, match="pixels|decompression"):
        load_image(buf.getvalue(), max_pixels=40_000_000)


def test_empty_and_missing(tmp_path):
    with pytest.raises(InputError, match="empty"):
        load_image(b"")
    with pytest.raises(InputError, match="not found"):
        load_image(tmp_path / "missing.png")


def test_cmyk_jpeg_becomes_rgb():
    buf = io.BytesIO()
    Image.new("CMYK", (32, 32), (0, 255, 255, 0)).save(buf, "JPEG")
    img = load_image(buf.getvalue())
    assert img.mode == "RGB"
    r, g, b = img.getpixel((16, 16))
    assert r > 200 and g < 60 and b < 60  # cyan=0, magenta=yellow=full -> red


def test_16_bit_greyscale():
    arr = (np.linspace(0, 65535, 64 * 64).reshape(64, 64)).astype(np.uint16)
    img = load_image(_png(Image.fromarray(arr)))
    assert img.mode == "RGB"
    assert img.getpixel((0, 0))[0] == 0 and img.getpixel((63, 63))[0] == 255


def test_palette_and_alpha():
    pal = Image.new("P", (10, 10))
    pal.putpalette([0, 0, 255] + [0] * 765)
    assert load_image(_png(pal)).getpixel((5, 5)) == (0, 0, 255)
    rgba = Image.new("RGBA", (10, 10), (255, 0, 0, 0))  # fully transparent red -> white background
    assert load_image(_png(rgba)).getpixel((5, 5)) == (255, 255, 255)
    half = Image.new("LA", (10, 10), (0, 255))
    assert load_image(_png(half)).getpixel((5, 5)) == (0, 0, 0)


def test_exif_orientation_is_applied():
    img = Image.new("RGB", (40, 20), (0, 0, 0))
    img.paste((255, 0, 0), (0, 0, 20, 20))  # left half red
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW to display
    buf = io.BytesIO()
    img.save(buf, "JPEG", exif=exif.tobytes(), quality=95)
    out = load_image(buf.getvalue())
    assert out.size == (20, 40)
    assert out.getpixel((10, 5))[0] > 200  # red is now on top


def test_gif_first_frame():
    frames = [Image.new("RGB", (8, 8), c) for c in [(255, 0, 0), (0, 255, 0)]]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    assert load_image(buf.getvalue()).getpixel((4, 4))[0] > 200


def test_size_limit():
    with pytest.raises(InputError, match="limit"):
        load_image(b"x" * 2000, max_bytes=1000)
