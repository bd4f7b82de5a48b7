"""``POST /api/search``: a plain JSON route beside the page, for programs (scripts, services, load).

It calls the same :func:`engine.search.search` as the page, the CLI and the Gradio API, outside Gradio's
queue: the request is parsed, handed to a pool of ``CIS_API_WORKERS`` threads (texts of concurrent searches
are encoded together by the engine's micro-batcher, ``engine/batching.py``) and answered with the
response's JSON (``SearchResponse.to_json()``, the same document the page shows under "Raw JSON").
At most ``CIS_QUEUE_MAX`` requests wait for a worker; beyond that it answers HTTP 503 at once.

Request body (JSON object; only ``text`` or ``image`` is required)::

    {"image": "gallery:12" | "<base64 of an image file>" | null, "text": "the same but red",
     "method": null, "alpha": 0.5, "k": 12, "expand": "none", "nqe": null, "negative_text": null,
     "keep_reference": false, "explain": true}

Errors are one plain sentence: ``{"error": "..."}`` with HTTP 400 (bad input: wrong types, ``Infinity``,
deep nesting, lone surrogates, an image that is not one), 413 (a body over the image limit, refused from its
Content-Length before it is read), 503 (busy: too many requests waiting, or too many bodies being read at
once, or too many bytes of them, decided before the body is read), 408 (a body that stalls) or 500.
"""
from __future__ import annotations

import importlib

import gradio.queueing
import gradio.utils

import asyncio
import base64
import binascii
import ctypes
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional

from engine.config import Settings
from engine.errors import EngineError, InputError
from engine.query import FIELDS as QUERY_FIELDS
from engine.query import SearchRequest, gallery_reference
from engine.search import SearchEngine
from engine.search import run as run_request

from .handlers import plain_message

FIELDS = set(QUERY_FIELDS)  # the body's fields are the query object's (engine.query.SearchRequest)
BUSY = "the server is busy; try again in a moment"
MAX_BODIES_READ = 16  # request bodies read at once; more wait for none: 503 before their bodies are read
BODY_BYTES_FACTOR = 2  # ... and at most this many bodies at the size limit in all (declared Content-Length)
TRIM_AFTER_BYTES = 1_000_000  # after a body this large, freed memory is handed back (release_memory)
IDLE_BODY_S = 15.0  # default of CIS_BODY_IDLE_S: a request body that sends nothing for this long is answered 408 and closed
BODY_GRACE_S = 10.0  # a body may take this long whatever its size; after it, it must keep MIN_BODY_RATE on average
MIN_BODY_RATE = 64_000  # bytes a second: a body below this average (after the grace) is answered 408 and closed
HEADER_DEADLINE_S = 10.0  # a request's header block must be complete within this long after it begins
SMALL_BODY = 256_000  # bodies declared this small are admitted from their own pool (a search by text or gallery id)
MAX_SMALL_BODIES = 64
MAX_JSON_CONTAINERS = 1_000  # '[' plus '{' in a body: counted before parsing (a search needs one object)
MAX_JSON_COMMAS = 10_000  # ',' in a body (elements of any container), counted before parsing
log = logging.getLogger(__name__)


class _BadNumber(ValueError):
    pass


def _no_constant(name: str):
    raise _BadNumber(name)


def parse_body(body: bytes):
    """The request's JSON; InputError (one sentence) for what JSON does not allow or this route refuses:
    bytes that are not UTF-8 JSON, ``Infinity``/``NaN``, nesting too deep to parse, and a body whose shape
    would expand when parsed (more than MAX_JSON_CONTAINERS arrays/objects or MAX_JSON_COMMAS elements: 26 MB
    of ``[[],[],...]`` would be some 750 MB of Python lists). The shape is counted on the bytes (an upper
    bound: brackets and commas inside strings count too; base64 holds none), before anything is allocated."""
    if isinstance(body, (bytes, bytearray)):
        containers = body.count(b"[") + body.count(b"{")
        if containers > MAX_JSON_CONTAINERS or body.count(b",") > MAX_JSON_COMMAS:
            raise InputError("the request body holds too many JSON values; send one flat object with the "
                             "search's fields")
    try:
        return json.loads(body, parse_constant=_no_constant)
    except _BadNumber as exc:
        raise InputError(f"the request body holds {exc}, which JSON does not allow; send a finite number") from None
    except RecursionError:
        raise InputError("the request body is nested too deeply; send one flat JSON object") from None
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        raise InputError("the request body is not valid JSON") from None


def parse_request(payload, settings: Settings) -> SearchRequest:
    """The request body (already decoded from JSON) as the one query object: the body's own shape (an object,
    known fields, the image as ``gallery:ID`` or base64) is checked here, every value by the one validation
    (:meth:`SearchRequest.build`, the same limits and sentences as the page, the Gradio API and the CLI; a
    value out of range is clamped and said in the response's ``notices``)."""
    if not isinstance(payload, dict):
        raise InputError("the request body must be a JSON object")
    unknown = sorted(set(payload) - FIELDS)
    if unknown:
        raise InputError(f"unknown field {unknown[0]!r}; the fields are {', '.join(sorted(FIELDS))}")
    image = payload.get("image")
    if image is not None:
        if not isinstance(image, str) or not image:
            raise InputError("image must be \"gallery:ID\" or the base64 of an image file")
        if image.startswith("gallery:"):
            image = gallery_reference(image)
        else:
            limit = int(settings.max_upload_mb * 1e6)
            if len(image) > limit * 4 // 3 + 4:
                raise InputError(f"the image is over {settings.max_upload_mb:g} MB; the limit is "
                                 f"{settings.max_upload_mb:g} MB")
            try:
                image = base64.b64decode(image, validate=True)
            except (binascii.Error, ValueError):
                raise InputError("image is neither gallery:ID nor valid base64") from None
    for name in ("method", "expand"):
        if payload.get(name) is not None and not isinstance(payload[name], str):
            raise InputError(f"{name} must be a string or null, not {type(payload[name]).__name__}")
    return SearchRequest.build(settings.max_text_chars, **{**payload, "image": image})


def search_kwargs(payload, settings: Settings) -> dict:
    """The keyword arguments of :func:`search` for a request body (:func:`parse_request`)."""
    return parse_request(payload, settings).search_kwargs()


def release_memory() -> None:
    """Hand freed heap pages back to the system after a large request (glibc keeps them per thread arena
    otherwise, so a burst of large bodies would stay in the server's RSS after it ended)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class Admission:
    """Bodies admitted for reading: at most ``max_bodies`` at once and ``max_bytes`` declared in all
    (a body without Content-Length counts as ``body_limit``). Decided from the headers, before a byte of
    the body is read, so refused requests cost nothing."""

    def __init__(self, max_bodies: int, max_bytes: int, body_limit: int):
        self.max_bodies, self.max_bytes, self.body_limit = max_bodies, max_bytes, body_limit
        self.bodies = self.bytes = 0
        self.lock = threading.Lock()

    def enter(self, declared: int) -> bool:
        with self.lock:
            if self.bodies >= self.max_bodies or (self.bodies and self.bytes + declared > self.max_bytes):
                return False
            self.bodies += 1
            self.bytes += declared
            return True

    def leave(self, declared: int) -> None:
        with self.lock:
            self.bodies -= 1
            self.bytes -= declared


class BodyTimeout(Exception):
    def __init__(self, sentence: str):
        super().__init__(sentence)
        self.sentence = sentence


def _client_gone_class():
    try:  # a subclass of Starlette's, so code that handles a disconnect still recognises it
        from starlette.requests import ClientDisconnect
    except ImportError:  # pragma: no cover - Starlette comes with Gradio
        ClientDisconnect = Exception

    class ClientGone(ClientDisconnect):
        """The client closed its connection before its request body was in."""

    return ClientGone


ClientGone = _client_gone_class()


class IdleBodyTimeout:
    """ASGI middleware for every route: a request body must arrive in time, or it gets HTTP 408 and its
    connection closed (a slow client would otherwise hold a descriptor, a task and an admission slot):

    - no piece for ``idle_s`` seconds (a stalled body);
    - after ``grace_s`` seconds, less than ``min_rate`` bytes a second on average (a trickle: one byte every
      few seconds never stalls, but 26 MB of it would take weeks), which also bounds every body's total time
      to ``grace_s + Content-Length / min_rate``.

    A client that goes away before its body is in is one log line, not a traceback."""

    def __init__(self, app, idle_s: float = IDLE_BODY_S, grace_s: float = BODY_GRACE_S,
                 min_rate: float = MIN_BODY_RATE):
        self.app, self.idle_s, self.grace_s, self.min_rate = app, idle_s, grace_s, min_rate

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        loop = asyncio.get_running_loop()
        state = {"done": False, "started": False, "bytes": 0, "t0": loop.time()}

        async def timed_receive():
            if state["done"]:  # the body is in: later receives wait for a disconnect, without a limit
                return await receive()
            elapsed = loop.time() - state["t0"]
            # the latest moment the next piece may come: the idle limit, and the average rate after the grace
            rate_deadline = max(self.grace_s, (state["bytes"] + 1) / self.min_rate) - elapsed \
                if self.min_rate > 0 else self.idle_s
            wait = max(0.001, min(self.idle_s, rate_deadline))
            try:
                message = await asyncio.wait_for(receive(), wait)
            except asyncio.TimeoutError:
                if wait < self.idle_s:
                    raise BodyTimeout(f"the request body arrived too slowly (under {self.min_rate / 1e3:g} kB/s "
                                      f"after {self.grace_s:g} s); send it again") from None
                raise BodyTimeout(f"the request body stalled for {self.idle_s:g} s; send it again") from None
            if message["type"] == "http.disconnect":
                state["done"] = True
                raise ClientGone()
            state["bytes"] += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False):
                state["done"] = True
            return message

        async def watched_send(message):
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, timed_receive, watched_send)
            if state["bytes"] > TRIM_AFTER_BYTES:  # a large body's buffers are freed now: hand the pages back
                release_memory()
        except ClientGone:
            log.warning("%s %s: the client went away before its request body was in (%d bytes)", scope.get("method"),
                     scope.get("path"), state["bytes"])
        except BodyTimeout as exc:
            log.warning("%s %s: %s; closed (408)", scope.get("method"), scope.get("path"), exc.sentence)
            if not state["started"]:
                body = json.dumps({"error": exc.sentence}).encode()
                await send({"type": "http.response.start", "status": 408,
                            "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})


async def _admitted_body(request, pool_for: Admission, declared: int, limit: int):
    """The body in one buffer, read once ``pool_for`` admits it: "busy" when it does not, "too big" once it
    passes ``limit`` (read no further: a huge body never sits in memory), "gone" when the client left."""
    from starlette.requests import ClientDisconnect

    if not pool_for.enter(declared):
        return "busy"
    try:
        buf = bytearray()
        async for chunk in request.stream():
            if len(buf) + len(chunk) > limit:
                return "too big"
            buf += chunk
        return buf
    except ClientDisconnect:  # ClientGone from the middleware included
        log.warning("POST /api/search: the client went away before its request body was in")
        return "gone"
    finally:
        pool_for.leave(declared)


def search_route(engine: SearchEngine, settings: Optional[Settings] = None, workers: Optional[int] = None):
    """The ASGI route ``POST /api/search`` (a Starlette route, so it can be handed to Gradio's FastAPI app)."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    settings = settings or engine.settings
    workers = max(1, workers or settings.api_workers)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cis-api")
    waiting_max = workers + max(1, settings.queue_max)
    state = {"in": 0}
    lock = threading.Lock()
    max_body = int(settings.max_upload_mb * 1e6) * 4 // 3 + 64_000  # a base64 image at the limit + the fields
    admission = Admission(MAX_BODIES_READ, BODY_BYTES_FACTOR * max_body, max_body)
    small = Admission(MAX_SMALL_BODIES, MAX_SMALL_BODIES * SMALL_BODY, SMALL_BODY)  # searches by text or id
    too_big = f"the request is over {max_body / 1e6:.1f} MB; images are limited to {settings.max_upload_mb:g} MB"

    def error(status: int, message: str, close: bool = False) -> JSONResponse:
        if status < 500 or status == 503:
            log.warning("POST /api/search refused (%d): %s", status, message)  # one line, no traceback
        return JSONResponse({"error": message}, status_code=status,
                            headers={"connection": "close"} if close else None)

    def run(holder: list) -> bytes:
        big = len(holder[0]) > TRIM_AFTER_BYTES
        try:
            payload = parse_body(holder.pop())  # the only reference: the body goes once parsed
            request = parse_request(payload, settings)
            del payload
            resp = run_request(engine, request)
            del request
            return json.dumps(resp.to_json()).encode()
        finally:
            if big:
                release_memory()

    async def endpoint(request: Request):
        declared_text = request.headers.get("content-length", "")
        declared = int(declared_text) if declared_text.isdigit() else max_body
        if declared > max_body:  # a body up to a few times the limit is drained unread by the server, so the
            # client reads the answer; a larger one gets its answer and the connection closed
            return error(413, too_big, close=declared > 4 * max_body)
        with lock:  # refused at once when the workers' queue is full (nothing read)
            if state["in"] >= waiting_max:
                return error(503, BUSY)
        # bodies being read do not count as waiting for a worker: a slow sender holds only a reading slot, and
        # a small body (a search by text or gallery id) never waits behind large ones for it
        pool_for = small if declared_text.isdigit() and declared <= SMALL_BODY else admission
        body = await _admitted_body(request, pool_for, declared, declared if declared_text.isdigit() else max_body)
        if not isinstance(body, bytearray):
            return error(503, BUSY) if body == "busy" else error(413, too_big) if body == "too big" else \
                Response(status_code=400)  # the client went away: nobody reads it
        with lock:
            if state["in"] >= waiting_max:
                return error(503, BUSY)
            state["in"] += 1
        try:
            holder = [body]
            del body
            try:
                data = await asyncio.get_running_loop().run_in_executor(pool, run, holder)
            except EngineError as exc:  # bad input, an unavailable method: the user's to fix
                return error(400, plain_message(exc))
            except Exception as exc:  # noqa: BLE001 - one plain sentence; details go to the server log
                return error(500, plain_message(exc))
        finally:
            with lock:
                state["in"] -= 1
        return Response(data, media_type="application/json")

    return Route("/api/search", endpoint, methods=["POST"], name="api_search")


def api_middleware(settings: Settings) -> List:
    """Middleware for the whole app (``app_kwargs={"middleware": api_middleware(...)}``): idle request bodies
    are closed with HTTP 408 after ``CIS_BODY_IDLE_S`` seconds (``settings.body_idle_s``), on every route (page uploads included)."""
    from starlette.middleware import Middleware

    install_header_deadline(HEADER_DEADLINE_S)
    install_error_sentences()
    return [Middleware(IdleBodyTimeout, idle_s=float(settings.body_idle_s) or IDLE_BODY_S)]


CALL_NOT_UNDERSTOOD = ("the call's inputs are not of the types or number this function takes; see the API page "
                       "(\"Use via API\") for each input")


def install_error_sentences() -> None:
    """Gradio answers an error it did not expect with ``{"error": null}`` when ``show_error`` is off (what
    app.py sets, so no internal detail is shown): a call whose inputs Gradio itself cannot take (wrong types,
    too few values) got no message at all. Such errors now get one plain sentence; the handlers' own
    sentences (gr.Error) pass unchanged. Installed once per process."""

    original = gradio.utils.error_payload
    if getattr(original, "_cis_sentences", False):
        return

    def error_payload(error, show_error):
        content = original(error, show_error)
        if content.get("error") is None:
            log.info("a call failed before its handler ran (%s); answered with the plain sentence",
                     error.__class__.__name__ if error is not None else "no error")
            content["error"] = CALL_NOT_UNDERSTOOD
        return content

    error_payload._cis_sentences = True
    gradio.utils.error_payload = error_payload
    gradio.queueing.error_payload = error_payload


def install_header_deadline(seconds: float = HEADER_DEADLINE_S) -> None:
    """Every connection uvicorn serves must complete each request's header block within ``seconds`` of its
    first byte (or of the connection's start): a client that sends one header line every few seconds is
    closed, not kept for ever. uvicorn has no such limit (its keep-alive timer is reset by every byte), so its
    HTTP protocol classes are wrapped here, once per process; calling again only changes ``seconds``."""

    for module, name in (("uvicorn.protocols.http.h11_impl", "H11Protocol"),
                         ("uvicorn.protocols.http.httptools_impl", "HttpToolsProtocol")):
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if "_cis_header_deadline" not in cls.__dict__:
            made, received = cls.connection_made, cls.data_received

            def connection_made(self, transport, _orig=made):
                _orig(self, transport)
                _arm_header_timer(self)

            def data_received(self, data, _orig=received):
                _arm_header_timer(self)
                _orig(self, data)

            cls.connection_made, cls.data_received = connection_made, data_received
        cls._cis_header_deadline = float(seconds)


def _awaiting_headers(protocol) -> bool:
    cycle = getattr(protocol, "cycle", None)
    return cycle is None or bool(getattr(cycle, "response_complete", False))


def _arm_header_timer(protocol) -> None:
    timer = getattr(protocol, "_cis_header_timer", None)
    if not _awaiting_headers(protocol):  # a request is in progress: its headers are complete
        if timer is not None:
            timer.cancel()
            protocol._cis_header_timer = None
        return
    if timer is None:
        protocol._cis_header_cycle = getattr(protocol, "cycle", None)
        protocol._cis_header_timer = asyncio.get_event_loop().call_later(
            protocol._cis_header_deadline, _header_deadline_passed, protocol)


def _header_deadline_passed(protocol) -> None:
    protocol._cis_header_timer = None
    cycle = getattr(protocol, "cycle", None)
    if cycle is not protocol._cis_header_cycle or not _awaiting_headers(protocol):
        return  # the header block was completed in time (a request started since)
    transport = getattr(protocol, "transport", None)
    if transport is not None and not transport.is_closing():
        log.warning("a client did not complete its request headers within %g s; connection closed",
                    protocol._cis_header_deadline)
        transport.close()


def api_routes(engine: SearchEngine, settings: Optional[Settings] = None) -> List:
    """Routes to add to the app beside the page (``demo.launch(app_kwargs={"routes": api_routes(...)})``)."""
    return [search_route(engine, settings)]
