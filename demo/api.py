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
log = logging.getLogger(__name__)


class _BadNumber(ValueError):
    pass


def _no_constant(name: str):
    raise _BadNumber(name)


def parse_body(body: bytes):
    """The request's JSON; InputError (one sentence) for what JSON does not allow or this route refuses:
    bytes that are not UTF-8 JSON, ``Infinity``/``NaN``, nesting too deep to parse."""
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
    pass


class IdleBodyTimeout:
    """ASGI middleware: a request whose body stalls for ``idle_s`` seconds between two pieces gets HTTP 408
    and its connection closed (a slow client would otherwise hold a descriptor and a task for ever)."""

    def __init__(self, app, idle_s: float = IDLE_BODY_S):
        self.app, self.idle_s = app, idle_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = {"done": False, "started": False}

        async def timed_receive():
            if state["done"]:  # the body is in: later receives wait for a disconnect, without a limit
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.idle_s)
            except asyncio.TimeoutError:
                raise BodyTimeout() from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                state["done"] = True
            return message

        async def watched_send(message):
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, timed_receive, watched_send)
        except BodyTimeout:
            log.warning("%s %s: request body idle for %.0f s; closed (408)", scope.get("method"), scope.get("path"),
                     self.idle_s)
            if not state["started"]:
                body = json.dumps({"error": f"the request body stalled for {self.idle_s:g} s; send it again"}).encode()
                await send({"type": "http.response.start", "status": 408,
                            "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})


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

    async def read_body(request: Request, limit: int) -> Optional[bytearray]:
        """The body in one buffer, or None once it passes ``limit`` (read no further: a huge body never sits
        in memory)."""
        buf = bytearray()
        async for chunk in request.stream():
            if len(buf) + len(chunk) > limit:
                return None
            buf += chunk
        return buf

    async def endpoint(request: Request):
        declared_text = request.headers.get("content-length", "")
        declared = int(declared_text) if declared_text.isdigit() else max_body
        if declared > max_body:  # a body up to a few times the limit is drained unread by the server, so the
            # client reads the answer; a larger one gets its answer and the connection closed
            return error(413, too_big, close=declared > 4 * max_body)
        with lock:
            if state["in"] >= waiting_max:
                return error(503, BUSY)
            state["in"] += 1
        try:
            if not admission.enter(declared):
                return error(503, BUSY)
            try:
                body = await read_body(request, declared if declared_text.isdigit() else max_body)
            finally:
                admission.leave(declared)
            if body is None:
                return error(413, too_big)
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


def api_middleware(settings: Optional[Settings] = None) -> List:
    """Middleware for the whole app (``app_kwargs={"middleware": api_middleware(...)}``): idle request bodies
    are closed with HTTP 408 after ``CIS_BODY_IDLE_S`` seconds (``settings.body_idle_s``), on every route (page uploads included)."""
    from starlette.middleware import Middleware

    settings = settings or Settings()
    return [Middleware(IdleBodyTimeout, idle_s=float(settings.body_idle_s) or IDLE_BODY_S)]


def api_routes(engine: SearchEngine, settings: Optional[Settings] = None) -> List:
    """Routes to add to the app beside the page (``demo.launch(app_kwargs={"routes": api_routes(...)})``)."""
    return [search_route(engine, settings)]
