"""Issue #27, indexes: a CURRENT file that is not UTF-8 (or names no version) is a damaged index the app
rebuilds with one log line; a full disk during ``engine index`` is one sentence with nothing half-written
left; thumbnails are checksummed, so a damaged one is rebuilt by the next indexing run."""
import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.config import Settings
from engine.errors import IndexLoadError
from engine.index.store import GalleryIndex

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("content", [b"v-\xff\xfe\n", b"../../etc\n", b"\n", b"v-does-not-exist\n"])
def test_bad_current_is_an_index_load_error(noise_index, tiny, content):
    _, out = noise_index(tiny, 3, 32, seed=1)
    (out / "CURRENT").write_bytes(content)
    with pytest.raises(IndexLoadError, match="CURRENT") as err:
        GalleryIndex.load(out)
    assert "\n" not in str(err.value)


def test_app_engine_rebuilds_an_index_whose_current_is_not_utf8(small_gallery, tmp_path, caplog):
    from engine.config import Settings
    from engine.service import load_default_engine

    s = Settings()
    s.backbone, s.device, s.gallery = "tiny:tiny-vit-a", "cpu", str(small_gallery)
    s.index_dir, s.checkpoints = str(tmp_path / "idx"), str(tmp_path / "no-checkpoints")
    first = load_default_engine(s)
    assert len(first.index) == 8
    (tmp_path / "idx" / "CURRENT").write_bytes(b"\xff\xfe\xfd\n")
    with caplog.at_level(logging.WARNING):
        again = load_default_engine(s)
    assert len(again.index) == 8
    lines = [r.getMessage() for r in caplog.records if "rebuilding the gallery index" in r.getMessage()]
    assert len(lines) == 1 and "not UTF-8" in lines[0]
    assert not any(r.exc_info for r in caplog.records)


def test_full_disk_during_engine_index_is_one_sentence_and_nothing_half_written(small_gallery, tmp_path):
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mnt)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root): " + mounted.stderr.decode()[:100])
    try:
        env = dict(os.environ, HF_HUB_OFFLINE="1", CIS_CHECKPOINTS=str(tmp_path / "none"))
        cmd = [sys.executable, "-m", "engine", "index", str(small_gallery), "--out", str(mnt / "idx"),
               "--backbone", "tiny:tiny-vit-a", "--device", "cpu", "--workers", "0"]
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 1, (r.stdout[-500:], r.stderr[-2000:])
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and "disk" in errors[0] and "full" in errors[0], r.stderr[-2000:]
        assert "Traceback" not in r.stderr
        left = [p for p in (mnt / "idx").rglob("*") if ".tmp" in p.name or ".part" in p.name]
        assert left == [], left  # no temporary file or half-written version
        assert not (mnt / "idx" / "CURRENT").exists()  # no version became visible
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_damaged_thumbnail_is_rebuilt_by_the_next_run(small_gallery, tiny, tmp_path, caplog):
    from engine.index.build import index_source

    out = tmp_path / "idx"
    with caplog.at_level(logging.INFO):
        index = index_source(small_gallery, out, tiny, workers=0, settings=Settings())
    first = [r.getMessage() for r in caplog.records]
    assert not [m for m in first if "repaired" in m or "damaged" in m]  # a first build repairs nothing
    caplog.clear()
    sums = json.loads((out / "thumbs" / "checksums.json").read_text())
    assert len(sums) == len(index.items) == 8
    victim = out / "thumbs" / (index.items[3]["sha256"][:20] + ".jpg")
    good = victim.read_bytes()
    assert hashlib.sha256(good).hexdigest() == sums[victim.name]
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0xFF  # one flipped byte: still a JPEG to Pillow's header check
    victim.write_bytes(bytes(damaged))
    (out / "thumbs" / (index.items[5]["sha256"][:20] + ".jpg")).unlink()
    with caplog.at_level(logging.WARNING):
        index_source(small_gallery, out, tiny, workers=0, settings=Settings())
    assert victim.read_bytes() == good
    assert (out / "thumbs" / (index.items[5]["sha256"][:20] + ".jpg")).is_file()
    assert any("repaired 2 damaged or missing thumbnails" in r.getMessage() for r in caplog.records)
