"""``POST /api/search`` (demo/api.py) on a real ``python app.py``, measured from outside over HTTP: the same
results as the engine's own ``search()``, alone and under concurrent requests (texts batched), and bad
input answered with one plain sentence."""
from __future__ import annotations

import base64
import threading
from pathlib import Path

import httpx
import pytest

QUERIES = [
    {"text": "a photo of a cat", "method": "text"},
    {"image": "gallery:12", "text": "at night", "method": "sum", "alpha": 0.6, "k": 8},
    {"image": "gallery:40", "method": "image", "k": 5, "keep_reference": True},
    {"image": "gallery:40", "method": "image", "k": 5},
    {"image": "gallery:7", "text": "in the snow", "method": "sum", "explain": False},
]


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    """``python app.py`` (packaged backbone, the demo's gallery index) on a free loopback port."""
    import os

    from engine.loadtest import free_port, spawn_app, stop_app, wait_ready

    old = {k: os.environ.get(k) for k in ("CIS_BACKBONE", "CIS_PREPARE", "CIS_MAX_UPLOAD_MB")}
    os.environ.update(CIS_BACKBONE="packaged", CIS_PREPARE="off", CIS_MAX_UPLOAD_MB="1")
    port = free_port()
    proc = spawn_app(port, tmp_path_factory.mktemp("app") / "server.log")
    try:
        wait_ready(f"http://127.0.0.1:{port}/", 600, proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_app(proc)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def app_engine(app_url, packaged):
    """The engine over the same index the server opened, in this process."""
    from engine.config import Settings
    from engine.search import open_engine

    s = Settings()
    return open_engine(s.resolved_index_dir(), backbone=packaged, settings=s)


def _engine_kwargs(q: dict) -> dict:
    """The engine's ``search()`` arguments for a request body (the app's settings, as the server reads them)."""
    from demo.api import search_kwargs
    from engine.config import Settings

    return search_kwargs(q, Settings())


def _same(reply: dict, expected) -> None:
    assert reply["method"] == expected.method and reply["expand"] == expected.expand
    got, want = reply["results"], expected.results
    assert [r["id"] for r in got] == [r.id for r in want]
    assert [r["path"] for r in got] == [r.path for r in want]
    assert [r["score"] for r in got] == pytest.approx([r.score for r in want], abs=1e-5)
    for g, w in zip(got, want):
        for key, value in w.explain.items():
            assert g["explain"][key] == (None if value is None else pytest.approx(value, abs=1e-5))


def test_rest_route_returns_the_engine_search_results(app_url, app_engine):
    from engine.search import search

    from engine.config import Settings

    photo = Path(Settings().gallery) / app_engine.index.items[3]["path"]  # the photo of gallery item 3
    uploaded = {"image": base64.b64encode(Path(photo).read_bytes()).decode(), "text": "the same but red",
                "method": "sum"}
    for q in [*QUERIES, uploaded]:
        r = httpx.post(f"{app_url}/api/search", json=q, timeout=120)
        assert r.status_code == 200, (q, r.text)
        _same(r.json(), search(app_engine, **_engine_kwargs(q)))
    # the reference is left out of its own results unless asked to keep it (CIRR convention)
    kept = httpx.post(f"{app_url}/api/search", json=QUERIES[2], timeout=60).json()["results"]
    left = httpx.post(f"{app_url}/api/search", json=QUERIES[3], timeout=60).json()["results"]
    assert kept[0]["id"] == 40 and 40 not in [r["id"] for r in left]
    assert "3" not in [str(r["id"]) for r in httpx.post(f"{app_url}/api/search", json=uploaded,
                                                          timeout=60).json()["results"]]


def test_concurrent_requests_each_get_their_own_results(app_url, app_engine):
    from engine.search import search

    texts = ["at night", "as a dog", "with flowers", "in the snow", "a red apple", "made of wood", "a bigger one",
             "the building at night"]
    queries = [{"image": f"gallery:{5 * i}", "text": t, "method": "sum" if i % 2 else "text"}
               for i, t in enumerate(texts)] * 2
    replies = [None] * len(queries)
    start = threading.Barrier(len(queries))

    def call(i):
        start.wait()
        replies[i] = httpx.post(f"{app_url}/api/search", json=queries[i], timeout=120)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(queries))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(180)
    for q, r in zip(queries, replies):
        assert r is not None and r.status_code == 200, q
        _same(r.json(), search(app_engine, **_engine_kwargs(q)))


def _png(w: int, h: int) -> str:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (w, h), "red").save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("body, status, words", [
    ({"image": _png(4000, 1), "text": "a cat"}, 400, "longer than 20 times"),  # the upload checks apply
    ({"text": "x" * 1001}, 400, "the limit is 1000"),
    ({"text": "a cat", "method": "nope"}, 400, "unknown method"),
    ({"image": "gallery:99999"}, 400, "does not exist"),
    ({"image": "not base64!"}, 400, "base64"),
    ({"image": base64.b64encode(b"not an image").decode()}, 400, "image"),
    ({"txt": "a cat"}, 400, "unknown field 'txt'"),
    ({}, 400, "give a reference image, a modification text, or both"),
    ([1, 2], 400, "JSON object"),
])
def test_bad_requests_get_one_plain_sentence(app_url, body, status, words):
    r = httpx.post(f"{app_url}/api/search", json=body, timeout=60)
    assert r.status_code == status, r.text
    msg = r.json()["error"]
    assert words in msg and "\n" not in msg and "/" not in msg.replace("base64", "")
    r = httpx.post(f"{app_url}/api/search", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"] == "the request body is not valid JSON"


def test_a_body_over_the_image_limit_is_refused_before_it_is_read(app_url):
    """CIS_MAX_UPLOAD_MB=1 on this server: a 2 MB image (declared, or streamed without a length) gets 413."""
    import socket

    big = {"image": base64.b64encode(b"\xff" * 2_000_000).decode(), "text": "a cat"}
    r = httpx.post(f"{app_url}/api/search", json=big, timeout=60)
    assert r.status_code == 413 and "images are limited to 1 MB" in r.json()["error"]

    def chunks():  # no Content-Length: the server counts what it reads
        yield b'{"image": "'
        for _ in range(30):
            yield b"A" * 100_000
        yield b'"}'

    r = httpx.post(f"{app_url}/api/search", content=chunks(), headers={"Content-Type": "application/json"},
                   timeout=60)
    assert r.status_code == 413
    host, port = app_url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:  # a huge declared length: refused at once
        s.sendall(f"POST /api/search HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {10**10}\r\n\r\n{{".encode())
        assert s.recv(100).startswith(b"HTTP/1.1 413")


def test_the_page_and_gradio_api_are_still_served(app_url):
    assert httpx.get(f"{app_url}/", timeout=60).status_code == 200
    assert httpx.get(f"{app_url}/config", timeout=60).status_code == 200
