"""Issue #35, part 2: request bodies bounded in time and in shape, header blocks bounded in time, slow
senders that hold no slot another caller needs, a client that goes away logged in one line.

A uvicorn server of its own per test module (in a thread, on a free loopback port) with the JSON route
and the middleware app.py installs; no engine is needed: the requests are refused before a search."""
import json
import logging
import socket
import threading
import time

import pytest

from demo import api
from engine.config import Settings
from engine.errors import InputError

uvicorn = pytest.importorskip("uvicorn")
starlette = pytest.importorskip("starlette")


def _serve(app):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="info", lifespan="off",
                                           http="h11"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(500):
        if server.started:
            break
        time.sleep(0.01)
    return server, thread, port


@pytest.fixture(scope="module")
def server():
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    settings = Settings()
    settings.api_workers, settings.queue_max = 1, 1  # two requests in flight fill the route

    async def echo(request: Request):
        return PlainTextResponse(str(len(await request.body())))

    app = Starlette(routes=[api.search_route(None, settings), Route("/echo", echo, methods=["POST"])],
                    middleware=[Middleware(api.IdleBodyTimeout, idle_s=5.0, grace_s=0.5, min_rate=2000)])
    srv, thread, port = _serve(app)
    yield port
    srv.should_exit = True
    thread.join(10)


def _open(port, head: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    s.sendall(head)
    return s


def _answer(s: socket.socket) -> bytes:
    out = b""
    try:
        while True:
            piece = s.recv(65536)
            if not piece:
                break
            out += piece
            if b"\r\n\r\n" in out and len(out.split(b"\r\n\r\n", 1)[1]) >= int(
                    (out.split(b"content-length: ", 1) + [b"0"])[1].split(b"\r\n")[0] or 0):
                break
    except (ConnectionResetError, socket.timeout):
        pass
    return out


def _post(port, path, body: bytes, declared=None) -> bytes:
    s = _open(port, f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                    f"{declared if declared is not None else len(body)}\r\n\r\n".encode() + body)
    try:
        return _answer(s)
    finally:
        s.close()


def test_a_body_that_expands_when_parsed_is_refused_before_parsing():
    body = b"[" + b"[]," * 200_000 + b"[]]"
    with pytest.raises(InputError, match="too many JSON values"):
        api.parse_body(body)
    deep = b"{\"text\": \"x\", \"k\": 3}"
    assert api.parse_body(deep) == {"text": "x", "k": 3}  # an ordinary search body still parses


def test_a_trickled_body_is_answered_408_once_it_falls_under_the_rate(server):
    # one byte every 0.1 s never stalls (idle limit 5 s), but is far under 2 kB/s after the 0.5 s grace
    s = _open(server, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
    answer = b""
    try:
        for _ in range(100):  # at most 10 s; the server answers after about 1 s
            try:
                s.sendall(b"x")
            except OSError:
                break
            s.settimeout(0.1)
            try:
                answer += s.recv(4096)
            except socket.timeout:
                continue
            if answer:
                break
        s.settimeout(5)
        answer += _answer(s)
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"too slowly" in answer


def test_slow_senders_do_not_hold_the_slots_other_callers_need(server):
    # two callers declare large bodies and send almost nothing; a third, small request is still answered
    slow = [_open(server, b"POST /api/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 2000000\r\n\r\n{") for _ in range(2)]
    try:
        time.sleep(0.2)
        answer = _post(server, "/api/search", json.dumps({"text": 5}).encode())
    finally:
        for s in slow:
            s.close()
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]  # its own mistake, not 503 busy
    assert b"text must be a string" in answer


def test_a_header_block_must_be_complete_in_time(server):
    api.install_header_deadline(0.5)
    try:
        s = _open(server, b"GET /echo HTTP/1.1\r\n")
        closed = False
        try:
            for i in range(60):  # a header line every 0.1 s: without a deadline this goes on for ever
                try:
                    s.sendall(f"X-Slow-{i}: 1\r\n".encode())
                    s.settimeout(0.1)
                    if s.recv(4096) == b"":
                        closed = True
                        break
                except socket.timeout:
                    continue
                except OSError:
                    closed = True
                    break
        finally:
            s.close()
        assert closed
        assert _post(server, "/echo", b"abc").endswith(b"3")  # an ordinary request is served as before
    finally:
        api.install_header_deadline(api.HEADER_DEADLINE_S)


def test_a_client_that_goes_away_mid_body_is_one_log_line(server, caplog):
    caplog.set_level(logging.INFO)
    s = _open(server, b"POST /api/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 5000\r\n\r\n{\"text\": ")
    time.sleep(0.2)
    s.close()
    for _ in range(100):
        if any("went away" in r.getMessage() for r in caplog.records):
            break
        time.sleep(0.05)
    assert any("went away" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


def test_the_page_keeps_state_for_a_bounded_number_of_sessions(gallery_engine):
    # every Gradio API call without a session is a new session whose state (~180 kB) Gradio keeps up to
    # state_session_capacity (10,000 by default): the one launch_options() every launch uses bounds it, so memory
    # is flat under the API
    from demo.launch import launch_options

    options = launch_options(gallery_engine, gallery_engine.settings, in_process=True)
    assert options["state_session_capacity"] == gallery_engine.settings.state_sessions
    assert 1 <= Settings().state_sessions <= 1000


def test_gradio_calls_that_fail_before_their_handler_get_a_sentence_not_null():
    gr = pytest.importorskip("gradio")
    import gradio.queueing

    api.install_error_sentences()
    api.install_error_sentences()  # once per process, whatever the calls
    payload = gradio.queueing.error_payload(ValueError("An event handler didn't receive enough input values"), False)
    assert payload["error"] == api.CALL_NOT_UNDERSTOOD
    assert gradio.queueing.error_payload(gr.Error("index a zip of photos first"), False)["error"] == \
        "index a zip of photos first"
