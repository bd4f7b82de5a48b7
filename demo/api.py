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

Errors are one plain sentence: ``{"error": "..."}`` with HTTP 400 (bad input), 413 (a body over the image
limit, refused before it is read in full), 503 (busy) or 500.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import List, Optional

from engine.config import Settings
from engine.errors import EngineError, InputError
from engine.search import DEFAULT_NQE, SearchEngine, search

from .handlers import plain_message

FIELDS = {"image", "text", "method", "alpha", "k", "expand", "nqe", "negative_text", "keep_reference", "explain"}
BUSY = "the server is busy; try again in a moment"


def search_kwargs(payload, settings: Settings) -> dict:
    """The keyword arguments of :func:`search` for a request body (already decoded from JSON)."""
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
            try:
                image = int(image[len("gallery:"):])
            except ValueError:
                raise InputError(f"bad gallery image {image[:40]!r}; expected gallery:ID") from None
        else:
            limit = int(settings.max_upload_mb * 1e6)
            if len(image) > limit * 4 // 3 + 4:
                raise InputError(f"the image is over {settings.max_upload_mb:g} MB; the limit is "
                                 f"{settings.max_upload_mb:g} MB")
            try:
                image = base64.b64decode(image, validate=True)
            except (binascii.Error, ValueError):
                raise InputError("image is neither gallery:ID nor valid base64") from None
    for name in ("keep_reference", "explain"):
        if name in payload and not isinstance(payload[name], bool):
            raise InputError(f"{name} must be true or false")
    return {"image": image, "text": payload.get("text"), "method": payload.get("method"),
            "alpha": payload.get("alpha", 0.5), "k": payload.get("k", 12), "expand": payload.get("expand", "none"),
            "nqe": payload.get("nqe", DEFAULT_NQE), "negative_text": payload.get("negative_text"),
            "explain": payload.get("explain", True), "exclude_reference": not payload.get("keep_reference", False)}


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

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status)

    def run(body: bytes) -> bytes:
        try:
            payload = json.loads(body)
        except ValueError:
            raise InputError("the request body is not valid JSON") from None
        resp = search(engine, **search_kwargs(payload, settings))
        return json.dumps(resp.to_json()).encode()

    max_body = int(settings.max_upload_mb * 1e6) * 4 // 3 + 64_000  # a base64 image at the limit + the fields

    async def read_body(request: Request) -> Optional[bytes]:
        """The body, or None once it passes ``max_body`` (read no further: a huge body never sits in memory)."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body:
            return None
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body:
                return None
            chunks.append(chunk)
        return b"".join(chunks)

    async def endpoint(request: Request):
        body = await read_body(request)
        if body is None:
            return error(413, f"the request is over {max_body / 1e6:.1f} MB; images are limited to "
                              f"{settings.max_upload_mb:g} MB")
        with lock:
            if state["in"] >= waiting_max:
                return error(503, BUSY)
            state["in"] += 1
        try:
            data = await asyncio.get_running_loop().run_in_executor(pool, run, body)
        except EngineError as exc:  # bad input, an unavailable method: the user's to fix
            return error(400, plain_message(exc))
        except Exception as exc:  # noqa: BLE001 - one plain sentence; details go to the server log
            return error(500, plain_message(exc))
        finally:
            with lock:
                state["in"] -= 1
        return Response(data, media_type="application/json")

    return Route("/api/search", endpoint, methods=["POST"], name="api_search")


def api_routes(engine: SearchEngine, settings: Optional[Settings] = None) -> List:
    """Routes to add to the app beside the page (``demo.launch(app_kwargs={"routes": api_routes(...)})``)."""
    return [search_route(engine, settings)]
