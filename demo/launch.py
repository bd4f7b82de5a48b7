"""How the app is served: the one set of ``demo.launch()`` options for every place that starts it.

``app.py`` (the production server), the tests (``tests/conftest.py``, ``tests/browser/serving.py``,
``tests/test_loadtest.py``) and the tools (``tools/queue_floor.py``) all launch through
:func:`launch_options`, so every test meets the server that production runs: the JSON route beside the page
(``POST /api/search``, demo/api.py), its middleware (idle request bodies closed), the upload size limit,
the only folders files are served from, the page's CSS and head, and plain error sentences.
"""
from __future__ import annotations

import logging
import sys
from typing import Optional

from engine.config import Settings
from engine.search import SearchEngine
from engine.sysinfo import free_port

from .api import api_middleware, api_routes
from .ui import CSS, HEAD, allowed_paths


def show_engine_log(level: int = logging.INFO) -> None:
    """The app's console shows what the engine and the page say (the one "first start" line, a repair, a
    warning) as ``INFO message`` lines on stderr; other libraries keep Python's default (warnings only), so
    each HTTP request is not a line. Calling it again adds nothing."""
    for name in ("engine", "demo"):
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if not any(getattr(h, "_cis_console", False) for h in logger.handlers):
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
            handler._cis_console = True  # type: ignore[attr-defined]
            logger.addHandler(handler)


def launch_options(engine: SearchEngine, settings: Optional[Settings] = None, *, host: Optional[str] = None,
                   port: Optional[int] = None, in_process: bool = False) -> dict:
    """Keyword arguments of ``demo.launch()`` for ``engine``'s app. ``settings``: the engine's by default;
    ``host`` / ``port``: the settings' (``GRADIO_SERVER_NAME`` / ``GRADIO_SERVER_PORT``) by default;
    ``in_process``: return at once (the caller goes on and closes the demo) and print nothing."""
    settings = settings or engine.settings
    options = dict(
        server_name=host or settings.server_name,
        server_port=port if port is not None else settings.server_port,
        allowed_paths=allowed_paths(engine),
        max_file_size=f"{int(settings.max_zip_mb)}mb",
        state_session_capacity=max(1, settings.state_sessions),  # per-call state bounded (memory flat under the API)
        css=CSS,
        head=HEAD,  # demo/ui.py: drops Gradio's one meaningless console warning
        show_error=False,  # unexpected errors show a plain sentence (demo/handlers.py user_errors)
        app_kwargs={"routes": api_routes(engine, settings),  # POST /api/search beside the page (demo/api.py)
                    "middleware": api_middleware(settings)},  # idle request bodies closed (408)
    )
    if in_process:
        options.update(prevent_thread_lock=True, quiet=True)
    return options


def serve_in_process(demo, engine: SearchEngine, settings: Optional[Settings] = None) -> str:
    """Launch ``demo`` with :func:`launch_options` on a free loopback port in this process; its base URL (with
    the trailing slash). The caller closes the demo."""
    port = free_port()
    demo.launch(**launch_options(engine, settings, host="127.0.0.1", port=port, in_process=True))
    return f"http://127.0.0.1:{port}/"
