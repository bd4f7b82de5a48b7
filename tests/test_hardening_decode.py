"""Issue #35, part 1: decode cost counted as the decoder spends it, and one decode budget for the process.

Small inputs: the limits are lowered so that the mechanism, not the size, is what is tested."""
import io
import sys
import threading
from pathlib import Path

import pytest
from PIL import Image

from engine import images
from engine.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools import hardening_bench as hb  # noqa: E402


def _jpeg(w, h, progressive, mode="L"):
    buf = io.BytesIO()
    Image.new(mode, (w, h), 90 if mode == "L" else (10, 20, 30, 40)[:len(mode)]).save(
        buf, "JPEG", progressive=progressive)
    return buf.getvalue()


def test_a_progressive_jpeg_is_costed_at_full_size_before_draft():
    # libjpeg keeps every DCT coefficient of a progressive JPEG (2 bytes x 64 per block) whatever draft() asks;
    # the baseline file of the same pixels decodes a row of blocks at a time
    baseline, progressive = _jpeg(3000, 3000, False), _jpeg(3000, 3000, True)
    assert images.jpeg_coefficient_bytes(baseline) == 0
    assert images.jpeg_coefficient_bytes(progressive) == 3000 * 3000 * 2
    assert images.load_image(baseline, max_decode_bytes=20_000_000).size == (1500, 1500)
    with pytest.raises(InputError, match=r"3000x3000 pixels, grayscale\) needs 29 MB to decode; the limit is 20 MB"):
        images.load_image(progressive, max_decode_bytes=20_000_000)


def test_a_cmyk_progressive_jpeg_counts_every_component():
    data = _jpeg(800, 600, True, "CMYK")
    assert images.jpeg_coefficient_bytes(data) == 800 * 600 * 4 * 2


def test_a_large_run_length_bmp_is_refused_before_its_python_decoder_runs():
    with pytest.raises(InputError, match="run-length compressed BMP of 1600x1600"):
        images.load_image(hb.rle_bmp(1600, 1600))
    assert images.load_image(hb.rle_bmp(300, 200)).size == (300, 200)  # a small one still reads


def test_concurrent_decodes_share_one_budget(monkeypatch):
    # a budget that one decode fills: a second image waits for it, then is refused once the wait runs out
    budget = images.DecodeBudget(10_000_000)
    monkeypatch.setattr(images, "BUDGET", budget)
    monkeypatch.setattr(images, "DECODE_WAIT_S", 0.2)
    held, release = threading.Event(), threading.Event()

    def hold():
        with budget.hold(9_000_000):
            held.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    try:
        with pytest.raises(InputError, match="decoding too many images at once"):
            images.load_image(hb.png(1200, 1000))  # 1.2 MB of gray + its RGB copy: does not fit beside it
    finally:
        release.set()
        t.join()
    assert budget.used == 0
    assert images.load_image(hb.png(1200, 1000)).size == (1200, 1000)  # room again
    assert budget.used == 0  # returned after the decode, also when it fails:
    with pytest.raises(InputError):
        images.load_image(hb.png(64, 64)[:-40])
    assert budget.used == 0


def test_the_entry_point_sizes_the_decode_budget_from_its_settings(monkeypatch):
    # the budget reads no environment: it is the default until the entry point passes its Settings
    from engine.config import Settings

    budget = images.DecodeBudget()
    monkeypatch.setattr(images, "BUDGET", budget)
    monkeypatch.setenv("CIS_DECODE_BUDGET_MB", "7")
    assert budget.capacity == images.DEFAULT_DECODE_BUDGET  # the variable alone changes nothing
    settings = Settings()
    settings.decode_budget_mb = 12.5
    images.configure(settings)
    assert budget.capacity == 12_500_000
    settings.decode_budget_mb = "nonsense"
    images.configure(settings)
    assert budget.capacity == images.DEFAULT_DECODE_BUDGET


def test_a_decode_larger_than_the_budget_runs_alone_rather_than_never():
    budget = images.DecodeBudget(1000)
    with budget.hold(5000):
        assert budget.used == 1000
    assert budget.used == 0


def test_a_search_reference_is_decoded_to_a_small_working_copy(gallery_engine, monkeypatch):
    # the copy a search holds while it preprocesses is what ten concurrent searches hold together
    import engine.search as search_mod

    seen = {}
    real = search_mod.load_image

    def spy(source, **kw):
        out = real(source, **kw)
        seen["size"] = out.size
        return out

    monkeypatch.setattr(search_mod, "load_image", spy)
    gallery_engine.reference_features(hb.png(3000, 2400, tag=b"reference-side"))
    assert min(seen["size"]) < 4 * images.REFERENCE_SIDE  # an integer box factor: between 2 and 4 x the side
    assert seen["size"][0] * seen["size"][1] <= 3000 * 2400 // 4
    assert images.load_image(hb.png(3000, 2400)).size == (3000, 2400)  # the default working copy is larger


def test_every_pixel_decode_happens_inside_the_budget(monkeypatch):
    # a PNG's getexif() decodes the whole image: it ran before the budget was held, so ten threads held ten
    # decoded images whatever the budget
    from PIL import ImageFile

    seen = []
    real = ImageFile.ImageFile.load

    def load(self):
        seen.append(images.BUDGET.used)
        return real(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    for data in (hb.png(1200, 900), _jpeg(1200, 900, True), hb.rle_bmp(600, 400)):
        seen.clear()
        images.load_image(data)
        assert seen and all(used > 0 for used in seen), seen
