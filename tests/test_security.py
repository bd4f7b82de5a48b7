"""Hardening against bad or hostile input: upload limits, content-type checks, zip handling through the
app's own path, temporary files, what the server serves, path parameters, pickles and HTML escaping."""
from __future__ import annotations

import html
import io
import json
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engine.config import Settings
from engine.errors import CheckpointError, IndexLoadError, InputError

ROOT = Path(__file__).resolve().parent.parent
GALLERY = ROOT / "assets" / "gallery"


# -- helpers -------------------------------------------------------------------------------------
def _jpeg(size=(32, 32), colour=(200, 30, 30), noise=False) -> bytes:
    buf = io.BytesIO()
    if noise:
        arr = np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(arr).save(buf, "JPEG", quality=95)
    else:
        Image.new("RGB", size, colour).save(buf, "JPEG")
    return buf.getvalue()


def _png(size=(32, 32)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (10, 200, 10)).save(buf, "PNG")
    return buf.getvalue()


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height pixels, with one tiny (truncated) data chunk."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def _zip(path: Path, entries: dict) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return path


class _Evil:
    """Unpickling this object would create the marker file: proof that pickled code ran."""

    marker = None

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@pytest.fixture()
def sessions(tmp_path, monkeypatch):
    """Session galleries go to a private cache folder, so the test sees exactly what is left behind."""
    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))
    from engine.service import sessions_dir

    return sessions_dir()


# -- uploads: size, pixels, type by content --------------------------------------------------------
def test_upload_byte_limit(gallery_engine, tmp_path, monkeypatch):
    from engine.search import search

    data = _jpeg((256, 256), noise=True)
    assert len(data) > 60_000
    (tmp_path / "big.jpg").write_bytes(data)
    monkeypatch.setattr(gallery_engine.settings, "max_upload_mb", 0.05)
    for source in (str(tmp_path / "big.jpg"), data):
        with pytest.raises(InputError, match=r"the limit is 0 MB|limit is"):
            search(gallery_engine, image=source, method="image", k=1)
    small = _jpeg((32, 32))
    assert search(gallery_engine, image=small, method="image", k=1).results  # under the limit: accepted


def test_pixel_limit_checked_before_decoding(gallery_engine, monkeypatch):
    from engine.search import search

    monkeypatch.setattr(gallery_engine.settings, "max_pixels", 200 * 200)
    with pytest.raises(InputError, match="pixels"):
        search(gallery_engine, image=_png((250, 250)), method="image", k=1)
    assert search(gallery_engine, image=_png((150, 150)), method="image", k=1).results
    monkeypatch.setattr(gallery_engine.settings, "max_pixels", 40_000_000)
    # 64 and 300 megapixel headers in 100-byte files: refused from the header, nothing is allocated
    over = _png_header_only(8_000, 8_000)
    assert len(over) < 200
    with pytest.raises(InputError, match="8000x8000 pixels; the limit is 40,000,000"):
        search(gallery_engine, image=over, method="image", k=1)
    with pytest.raises(InputError, match="decompression bomb"):
        search(gallery_engine, image=_png_header_only(20_000, 15_000), method="image", k=1)


def test_type_is_checked_by_content_not_by_name(gallery_engine, tmp_path, sessions):
    from engine.search import search
    from engine.service import build_session_engine

    disguised_zip = tmp_path / "holiday.jpg"  # a zip archive wearing a .jpg name
    _zip(tmp_path / "inner.zip", {"a.jpg": _jpeg()}).rename(disguised_zip)
    with pytest.raises(InputError, match="not an image"):
        search(gallery_engine, image=str(disguised_zip), method="image", k=1)
    disguised_png = tmp_path / "photos.zip"  # a png wearing a .zip name
    disguised_png.write_bytes(_png())
    with pytest.raises(InputError, match="not a zip archive"):
        build_session_engine(disguised_png, gallery_engine)
    real_jpeg_odd_name = tmp_path / "picture.txt"  # the content decides, in both directions
    real_jpeg_odd_name.write_bytes(_jpeg())
    assert search(gallery_engine, image=str(real_jpeg_odd_name), method="image", k=1).results
    assert list(sessions.iterdir()) == []


def test_zip_with_disguised_entry_indexes_only_real_images(gallery_engine, tmp_path, sessions):
    from engine.search import search
    from engine.service import build_session_engine, drop_session_engine

    photos = sorted(GALLERY.rglob("*.jpg"))[:2]
    fake = io.BytesIO()
    with zipfile.ZipFile(fake, "w") as z:
        z.writestr("x.txt", "not an image")
    archive = _zip(tmp_path / "mix.zip", {"a.jpg": photos[0].read_bytes(), "b.jpg": photos[1].read_bytes(),
                                          "c.jpg": fake.getvalue()})
    eng = build_session_engine(archive, gallery_engine)
    try:
        assert sorted(it["path"] for it in eng.index.items) == ["a.jpg", "b.jpg"]
        assert [s["path"] for s in eng.index.meta.get("skipped", [])] == ["c.jpg"]
        top = search(eng, image=str(photos[1]), method="image", k=1).results[0]
        assert top.path == "b.jpg"
    finally:
        drop_session_engine(eng)


# -- zips through the UI path, temporary files ------------------------------------------------------
def test_hostile_zips_through_the_upload_handler_leave_nothing(gallery_engine, tmp_path, sessions):
    import gradio as gr

    from demo import handlers as h

    index_upload = h.user_errors(h.index_upload)
    cases = {
        "slip.zip": ({"../../evil.jpg": _jpeg(), "ok.jpg": _jpeg()}, "leaving"),
        "abs.zip": ({"/tmp/evil.jpg": _jpeg()}, "absolute"),
        "bomb.zip": ({"big.png": b"\0" * 30_000_000}, "zip bomb"),
        "nothing.zip": ({"readme.txt": b"hello"}, "no images"),
    }
    for name, (entries, message) in cases.items():
        archive = _zip(tmp_path / name, entries)
        with pytest.raises(gr.Error, match=message):
            index_upload(gallery_engine, None, str(archive), progress=lambda *a, **k: None)
    link = zipfile.ZipInfo("link.jpg")
    link.external_attr = 0o120777 << 16
    with zipfile.ZipFile(tmp_path / "link.zip", "w") as z:
        z.writestr(link, "/etc/passwd")
    with pytest.raises(gr.Error, match="symbolic link"):
        index_upload(gallery_engine, None, str(tmp_path / "link.zip"), progress=lambda *a, **k: None)
    assert list(sessions.iterdir()) == []  # no half-built session folder is left behind
    assert not (tmp_path.parent / "evil.jpg").exists() and not (tmp_path / "evil.jpg").exists()


def test_zip_size_limit_is_checked_before_opening(gallery_engine, tmp_path, sessions, monkeypatch):
    from engine.service import build_session_engine

    archive = _zip(tmp_path / "photos.zip", {f"{i}.jpg": _jpeg((64, 64), noise=True) for i in range(8)})
    monkeypatch.setattr(gallery_engine.settings, "max_zip_mb", archive.stat().st_size / 2e6)
    with pytest.raises(InputError, match="the limit is"):
        build_session_engine(archive, gallery_engine)
    assert list(sessions.iterdir()) == []


def test_session_files_are_deleted_and_the_gallery_never_is(gallery_engine, tmp_path, sessions):
    from demo import handlers as h
    from engine.service import drop_session_engine, session_engine

    photos = sorted(GALLERY.rglob("*.jpg"))[:3]
    archive = _zip(tmp_path / "p.zip", {f"p{i}.jpg": p.read_bytes() for i, p in enumerate(photos)})
    key, msg = h.index_upload(gallery_engine, None, str(archive), progress=lambda *a, **k: None)
    assert "**3**" in msg
    folder = Path(session_engine(key).index.folder)
    assert sessions in folder.resolve().parents and (folder / "files" / "p0.jpg").is_file()
    # a second upload replaces the first: the old session's files go at once
    key2, _ = h.index_upload(gallery_engine, key, str(archive), progress=lambda *a, **k: None)
    assert not folder.exists()
    folder2 = Path(session_engine(key2).index.folder)
    drop_session_engine(key2)
    assert not folder2.exists() and list(sessions.iterdir()) == []
    drop_session_engine(gallery_engine)  # not under the sessions folder: must be left alone
    assert Path(gallery_engine.index.folder).is_dir() and len(gallery_engine.index) > 0


# -- what the running server serves ----------------------------------------------------------------
def test_server_serves_gallery_files_but_nothing_else(app_server, gallery_engine):
    server = app_server
    import httpx

    gallery_file = gallery_engine.index.image_path(0)
    ok = httpx.get(f"{server}/gradio_api/file={gallery_file}")
    assert ok.status_code == 200 and ok.content == gallery_file.read_bytes()  # the control case works
    version = (Path(gallery_engine.index.folder) / "CURRENT").read_text().strip()
    refused = [
        "../../../../../../etc/passwd",
        "/etc/passwd",
        str(ROOT / "app.py"),
        str(ROOT / "engine" / "config.py"),
        str(GALLERY / ".." / ".." / "app.py"),
        str(GALLERY) + "/..%2F..%2Fapp.py",
        str(Path(gallery_engine.index.folder) / version / "embeddings.npy"),  # index files: not served
        str(Path(gallery_engine.index.folder) / "CURRENT"),
    ]
    for path in refused:
        for route in ("/gradio_api/file=", "/file="):
            r = httpx.get(f"{server}{route}{path}")
            assert r.status_code in (403, 404), (route, path, r.status_code)
            assert b"root:" not in r.content and b"import os" not in r.content


def _call(server: str, api: str, data: list):
    """POST to the queue-backed REST route and read the event stream; returns (event, payload)."""
    import httpx

    r = httpx.post(f"{server}/gradio_api/call/{api}", json={"data": data}, timeout=30)
    if r.status_code != 200:
        return "http", r.status_code
    event_id = r.json()["event_id"]
    with httpx.stream("GET", f"{server}/gradio_api/call/{api}/{event_id}", timeout=120) as s:
        event = None
        for line in s.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event in ("complete", "error"):
                return event, line.split(":", 1)[1].strip()
    return event, None


def test_no_api_parameter_reads_a_server_path(app_server, tmp_path):
    server = app_server
    import httpx

    secret = tmp_path / "secret.jpg"
    secret.write_bytes(_jpeg(colour=(1, 2, 3)))
    probes = [
        {"path": str(secret), "meta": {"_type": "gradio.FileData"}},
        {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}},
        {"path": str(ROOT / "app.py"), "meta": {"_type": "gradio.FileData"}},
        {"path": "../../../../etc/passwd", "meta": {"_type": "gradio.FileData"}},
        str(secret),
        "/etc/passwd",
    ]
    for probe in probes:
        event, payload = _call(server, "search", [probe, "", "image", 0.5, 3, False, "none", 64, True])
        assert event in ("error", "http"), (probe, event, payload)
        assert "root:" not in str(payload)
    # control: the same image, uploaded through the API first, is accepted
    up = httpx.post(f"{server}/gradio_api/upload", files={"files": ("secret.jpg", secret.read_bytes(), "image/jpeg")})
    path = up.json()[0]
    event, payload = _call(server, "search", [{"path": path, "meta": {"_type": "gradio.FileData"}}, "", "image",
                                              0.5, 3, False, "none", 64, True])
    assert event == "complete", payload
    outputs = json.loads(payload)
    assert len(json.loads(outputs[2])["results"]) == 3


# -- no pickles -------------------------------------------------------------------------------------


def test_index_holding_a_pickle_is_refused_without_running_it(tmp_path, tiny, noise_index):
    from engine.index.build import index_source
    from engine.index.pipeline import cache_folder, read_shards
    from engine.index.store import GalleryIndex

    src, out = noise_index(tiny, 3, 40, seed=3)
    marker = tmp_path / "pwned"
    _Evil.marker = str(marker)
    version = out / (out / "CURRENT").read_text().strip()
    emb = version / "embeddings.npy"
    np.save(emb, np.array([_Evil()], dtype=object), allow_pickle=True)
    with pytest.raises(IndexLoadError, match="embeddings.npy"):
        GalleryIndex.load(out)
    assert not marker.exists()
    # an embedding-cache shard holding a pickle is ignored (its files are re-embedded), never unpickled
    cache = cache_folder(out, tiny.fingerprint)
    with open(cache / "shard-0-evil.npz", "wb") as f:
        np.savez(f, hashes=np.array([_Evil()], dtype=object), embeddings=np.zeros((1, 4)), sizes=np.zeros((1, 2)))
    known = read_shards(cache)
    assert len(known) == 3 and not marker.exists()
    index_source(src, out, tiny, workers=0, settings=Settings())  # rebuild over the damaged version
    assert len(GalleryIndex.load(out)) == 3 and not marker.exists()


def test_checkpoints_holding_a_pickle_are_refused_without_running_it(tmp_path):
    import torch

    marker = tmp_path / "pwned"
    _Evil.marker = str(marker)
    bad = tmp_path / "authors.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}, "extra": _Evil()}, bad)
    from engine.compose.context_i2w import load_authors_checkpoint

    with pytest.raises(CheckpointError, match="authors.pt"):
        load_authors_checkpoint(bad)
    assert not marker.exists()
    from engine.checkpoints import read_record

    fake = tmp_path / "rtic-fake.safetensors"  # a pickle wearing a safetensors name
    fake.write_bytes(bad.read_bytes())
    with pytest.raises(CheckpointError, match="rtic-fake.safetensors"):
        read_record(fake)
    assert not marker.exists()


# -- HTML escaping ------------------------------------------------------------------------------------
HOSTILE = ['<script>window.__xss=1</script>', '<img src=x onerror="window.__xss=2">', '"><svg onload=alert(3)>']


def _assert_inert(markup: str, payload: str):
    assert payload not in markup
    for tag in ("<script", "<img", "<svg"):
        if tag in payload:
            assert tag not in markup, (tag, markup)
    from demo.formatting import esc

    assert html.unescape(esc(payload)) == payload and esc(payload) in markup  # shown as typed, interpreted as nothing


def test_formatting_escapes_every_user_string():
    from demo.formatting import esc, explanation_markdown
    from engine.search import Result, SearchResponse

    assert esc('<a href="x">&</a>') == "&lt;a href=&quot;x&quot;&gt;&amp;&lt;/a&gt;"
    assert esc("[a](https://e.x)") == "&#91;a&#93;(https:&#47;&#47;e.x)"  # Markdown inert too: no link, no autolink
    assert esc("www.e.x and a@b.c") == "www&#46;e.x and a&#64;b.c"
    # text a person reads (a label, a caption) comes out as written: no references where none are needed
    assert esc("Image + text (weighted sum)") == "Image + text (weighted sum)" and esc("It's a cep") == "It's a cep"
    assert esc(None) == "" and esc(3) == "3"
    for bad in HOSTILE:
        resp = SearchResponse(
            results=[Result(rank=1, id=0, path=bad, score=0.5, caption=bad)],
            timings_ms={"total": 1.0, bad: 2.0}, method=bad, expand="aqe",
            explanation={"composer": {"prompt": bad, "formula": bad, "gate": 0.25},
                         "expansion": {"method": bad, "nqe": 2,
                                       "neighbours": [{"id": 0, "weight": 0.5, "path": bad}]}},
            notices=[bad])
        md = explanation_markdown(resp)
        _assert_inert(md, bad)
        assert md.count(esc(bad)) >= 5  # method, prompt, formula, neighbour path, notice, timing name


def test_backbone_and_upload_messages_are_escaped(gallery_engine, tmp_path, sessions):
    from demo import handlers as h
    from demo.formatting import backbone_markdown

    class FakeBackbone:
        def describe(self):
            return {"name": HOSTILE[0], "device": HOSTILE[1], "why": HOSTILE[2]}

    class FakeEngine:
        backbone = FakeBackbone()
        index = gallery_engine.index

    md = backbone_markdown(FakeEngine())
    for bad in HOSTILE:
        _assert_inert(md, bad)
    # file names inside an uploaded zip come back in the status message
    photo = sorted(GALLERY.rglob("*.jpg"))[0].read_bytes()
    name = '<img src=x onerror="window.__xss=4">.jpg'
    archive = _zip(tmp_path / "names.zip", {"good.jpg": photo, name: b"broken image bytes"})
    eng, msg = h.index_upload(gallery_engine, None, str(archive), progress=lambda *a, **k: None)
    try:
        assert "Skipped 1" in msg
        _assert_inert(msg, name)
    finally:
        from engine.service import drop_session_engine

        drop_session_engine(eng)


def test_what_a_person_or_api_client_reads_has_no_character_references():
    """The explanation and the results table carry labels and captions as written (#33: the API returned
    ``Image &#43; text &#40;weighted sum&#41;`` and the table ``It&#x27;s a cep``)."""
    from demo.formatting import LABELS, explanation_markdown, why_table_markdown
    from engine.search import Result, SearchResponse

    resp = SearchResponse(results=[Result(rank=1, id=0, path="food/cep.jpg", score=0.5, caption="It's a cep")],
                          timings_ms={"total": 1.0}, method="sum", expand="none",
                          explanation={"composer": {"formula": "q = normalise(a * img + (1 - a) * txt)"}})
    md = explanation_markdown(resp)
    assert LABELS["sum"] in md and "&#43;" not in md and "&#40;" not in md and "&#x27;" not in md
    table = why_table_markdown(resp.to_json())
    assert "It's a cep" in table and "&#x27;" not in table
