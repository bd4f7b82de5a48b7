"""Gallery index: build, incremental update, atomic save, fingerprint checks, damage, zip safety, resume."""
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engine.errors import IndexLoadError, InputError
from engine.index.pipeline import build_index, cache_folder, read_shards
from engine.index.safezip import safe_extract_zip
from engine.index.store import GalleryIndex

ROOT = Path(__file__).resolve().parent.parent


def test_build_and_search_finds_each_image_itself(small_gallery, tmp_path, tiny):
    (small_gallery / "broken.png").write_bytes(b"not a png")
    idx = build_index(small_gallery, tmp_path / "idx", tiny, workers=0)
    assert len(idx) == 8
    assert [s["path"] for s in idx.meta["skipped"]] == ["broken.png"]
    loaded = GalleryIndex.load(tmp_path / "idx", expected_fingerprint=tiny.fingerprint)
    assert loaded.embeddings.dtype == np.float16
    scores, ids = loaded.search(loaded.vectors_f32(), 1)
    assert list(ids[:, 0]) == list(range(8))  # every image is its own nearest neighbour
    for i in range(8):
        assert loaded.thumb_path(i).exists()
        assert loaded.items[i]["sha256"] and loaded.items[i]["width"] > 0


def test_incremental_update_skips_unchanged_and_drops_removed(small_gallery, tmp_path, tiny, monkeypatch):
    out = tmp_path / "idx"
    build_index(small_gallery, out, tiny, workers=0)
    calls = []
    real = tiny.encode_images

    def counting(x):
        calls.append(len(x))
        return real(x)

    monkeypatch.setattr(tiny, "encode_images", counting)
    first = sorted(small_gallery.iterdir())[0]
    first.unlink()
    Image.new("RGB", (50, 40), (10, 200, 30)).save(small_gallery / "new.png")
    idx = build_index(small_gallery, out, tiny, workers=0)
    assert sum(calls) == 1  # only the new file was embedded
    paths = {it["path"] for it in idx.items}
    assert "new.png" in paths and first.name not in paths and len(idx) == 8
    assert len(list(cache_folder(out, tiny.fingerprint).glob("shard-*.npz"))) == 1  # compacted


def test_fingerprint_mismatch_says_what_to_rebuild(small_gallery, tmp_path, tiny):
    build_index(small_gallery, tmp_path / "idx", tiny, workers=0)
    with pytest.raises(IndexLoadError, match="rebuild"):
        GalleryIndex.load(tmp_path / "idx", expected_fingerprint="other@123")


def test_damaged_index_names_the_file(small_gallery, tmp_path, tiny):
    out = tmp_path / "idx"
    build_index(small_gallery, out, tiny, workers=0)
    version = out / (out / "CURRENT").read_text().strip()
    (version / "embeddings.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(IndexLoadError, match="embeddings.npy"):
        GalleryIndex.load(out)
    (version / "meta.json").write_text("{not json")
    with pytest.raises(IndexLoadError, match="damaged"):
        GalleryIndex.load(out)
    with pytest.raises(IndexLoadError, match="no index"):
        GalleryIndex.load(tmp_path / "nothing")


def test_atomic_save_keeps_previous_version_on_failure(small_gallery, tmp_path, tiny, monkeypatch):
    out = tmp_path / "idx"
    idx = build_index(small_gallery, out, tiny, workers=0)
    before = (out / "CURRENT").read_text()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(np, "save", boom)
    with pytest.raises(OSError):
        idx.save()
    assert (out / "CURRENT").read_text() == before
    assert len(GalleryIndex.load(out)) == 8


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_vector_index_types_agree_with_exact_search(kind, tmp_path):
    from engine.index.vectors import create_vector_index

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 32)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[:50] + 0.05 * rng.normal(size=(50, 32)).astype(np.float32)
    exact = np.argsort(-(q @ x.T), axis=1)[:, :10]
    vi = create_vector_index(kind, 32, len(x), nprobe=16)
    vi.build(x)
    _, ids = vi.search(q, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, exact)])
    assert recall >= (1.0 if kind == "flat" else 0.8)
    vi.save(tmp_path)
    again = create_vector_index(kind, 32, len(x), nprobe=16)
    again.load(tmp_path, x)
    assert np.array_equal(again.search(q, 10)[1], ids)


def _zip(path, entries):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return path


def _jpeg():
    import io

    buf = io.BytesIO()
    Image.new("RGB", (20, 20), (200, 0, 0)).save(buf, "JPEG")
    return buf.getvalue()


def test_zip_slip_absolute_and_symlinks_are_refused(tmp_path):
    dest = tmp_path / "out"
    with pytest.raises(InputError, match="leaving"):
        safe_extract_zip(_zip(tmp_path / "a.zip", {"../evil.jpg": _jpeg()}), dest)
    with pytest.raises(InputError, match="absolute"):
        safe_extract_zip(_zip(tmp_path / "b.zip", {"/etc/evil.jpg": _jpeg()}), dest)
    link = zipfile.ZipInfo("link.jpg")
    link.external_attr = (0o120777 << 16)
    with zipfile.ZipFile(tmp_path / "c.zip", "w") as z:
        z.writestr(link, "/etc/passwd")
    with pytest.raises(InputError, match="symbolic link"):
        safe_extract_zip(tmp_path / "c.zip", dest)
    assert not dest.exists() and not (tmp_path / "evil.jpg").exists()


def test_zip_bomb_and_limits(tmp_path):
    bomb = _zip(tmp_path / "bomb.zip", {"big.png": b"\0" * 50_000_000})
    assert bomb.stat().st_size < 1_000_000
    with pytest.raises(InputError, match="zip bomb"):
        safe_extract_zip(bomb, tmp_path / "o1")
    many = _zip(tmp_path / "many.zip", {f"{i}.jpg": _jpeg() for i in range(30)})
    with pytest.raises(InputError, match="limit"):
        safe_extract_zip(many, tmp_path / "o2", max_files=10)
    with pytest.raises(InputError, match="no images"):
        safe_extract_zip(_zip(tmp_path / "txt.zip", {"a.txt": b"hello"}), tmp_path / "o3")
    (tmp_path / "fake.zip").write_bytes(b"not a zip at all")
    with pytest.raises(InputError, match="zip"):
        safe_extract_zip(tmp_path / "fake.zip", tmp_path / "o4")
    ok = safe_extract_zip(_zip(tmp_path / "ok.zip", {"sub/a.jpg": _jpeg(), "notes.txt": b"x"}), tmp_path / "o5")
    assert ok == ["sub/a.jpg"]


def test_killed_indexer_leaves_previous_index_and_resumes(tmp_path, tiny):
    """SIGKILL mid-run: the old index still loads; the rerun embeds only what was not finished."""
    src = tmp_path / "imgs"
    src.mkdir()
    rng = np.random.default_rng(1)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (48, 48, 3), dtype=np.uint8)).save(src / f"a{i}.png")
    out = tmp_path / "idx"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "engine", "-v", "index", str(src), "--out", str(out), "--backbone",
           "tiny:tiny-vit-a", "--batch-size", "2", "--workers", "0"]
    subprocess.run(cmd, check=True, env=env, capture_output=True, cwd=ROOT)
    first = GalleryIndex.load(out)
    assert len(first) == 4
    for i in range(400):
        Image.fromarray(rng.integers(0, 255, (48, 48, 3), dtype=np.uint8)).save(src / f"b{i:03d}.png")
    cache = cache_folder(out, tiny.fingerprint)
    n0 = len(list(cache.glob("shard-*.npz")))
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.time() + 240
    while time.time() < deadline and len(list(cache.glob("shard-*.npz"))) < n0 + 2 and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the indexer finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert len(GalleryIndex.load(out)) == 4  # previous index intact
    done_before = len(read_shards(cache))
    assert 4 < done_before < 404
    res = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True, cwd=ROOT)
    line = [l for l in res.stdout.splitlines() + res.stderr.splitlines() if "to embed" in l][0]
    to_embed = int(line.split(",")[-1].split()[0])
    assert to_embed == 404 - done_before  # finished files were not embedded again
    assert len(GalleryIndex.load(out)) == 404


def test_dba_index_variant_stores_expanded_vectors(small_gallery, tmp_path, tiny):
    from engine.expand.dba import dba_vectors

    plain = build_index(small_gallery, tmp_path / "plain", tiny, workers=0)
    aug = build_index(small_gallery, tmp_path / "dba", tiny, workers=0, dba="aqe", dba_k=3)
    expect = dba_vectors(plain.embeddings.astype(np.float32), "aqe", k=3, progress=False)
    assert aug.meta["dba"] == {"method": "aqe", "k": 3}
    assert np.allclose(aug.embeddings.astype(np.float32), expect, atol=2e-3)
    assert not np.allclose(aug.embeddings, plain.embeddings, atol=1e-3)
