"""Settings read from environment variables (documented in README, 'Configuration').

This module is the only one that reads the environment (tests/test_architecture.py enforces it): every
variable of the project is a field of :class:`Settings` and has its doc line in :data:`ENV_DOCS`; the
environment handed to child processes is built by :func:`child_environment`. Entry points (app.py, the CLI,
each trainer's ``main``) build one ``Settings()`` and pass it down; the two process-wide values are set from it
there too, by one call (``engine.process.configure_process``): the decode budget (``engine.images.configure``) and
the offline sets' source folders (``engine.data.locations.configure``).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "assets"
MAX_K = 200  # the most results one search returns (search(), shared links)


def _env(name: str, default: str) -> str:
    value = os.environ.get(name, "").strip()
    return value or default


def cache_dir() -> Path:
    """Where derived data (demo index, assembled data sets, feature caches) lives."""
    base = os.environ.get("CIS_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "composed-image-search"
    )
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class Settings:
    backbone: str = field(default_factory=lambda: _env("CIS_BACKBONE", "auto"))
    gallery: str = field(default_factory=lambda: _env("CIS_GALLERY", str(ASSETS / "gallery")))
    index_dir: str = field(default_factory=lambda: _env("CIS_INDEX_DIR", ""))
    device: str = field(default_factory=lambda: _env("CIS_DEVICE", "auto"))
    checkpoints: str = field(default_factory=lambda: _env("CIS_CHECKPOINTS", str(ASSETS / "checkpoints")))
    max_upload_mb: float = field(default_factory=lambda: float(_env("CIS_MAX_UPLOAD_MB", "20")))
    max_pixels: int = field(default_factory=lambda: int(_env("CIS_MAX_PIXELS", str(40_000_000))))
    # bytes one image decode may use, counted for its real mode before decoding (engine/images.py decode_cost)
    max_decode_mb: float = field(default_factory=lambda: float(_env("CIS_MAX_DECODE_MB", "128")))
    decode_budget_mb: float = field(default_factory=lambda: float(_env("CIS_DECODE_BUDGET_MB", "160")))  # all decodes
    body_idle_s: float = field(default_factory=lambda: float(_env("CIS_BODY_IDLE_S", "15")))  # stalled body: 408
    max_zip_mb: float = field(default_factory=lambda: float(_env("CIS_MAX_ZIP_MB", "200")))
    max_zip_files: int = field(default_factory=lambda: int(_env("CIS_MAX_ZIP_FILES", "2000")))
    max_aspect: float = field(default_factory=lambda: float(_env("CIS_MAX_ASPECT", "20")))
    max_frames: int = field(default_factory=lambda: int(_env("CIS_MAX_FRAMES", "100")))
    max_zip_pixels: int = field(default_factory=lambda: int(_env("CIS_MAX_ZIP_PIXELS", str(400_000_000))))
    max_sessions: int = field(default_factory=lambda: int(_env("CIS_MAX_SESSIONS", "16")))
    session_ttl_s: float = field(default_factory=lambda: float(_env("CIS_SESSION_TTL_S", "3600")))
    max_text_chars: int = field(default_factory=lambda: int(_env("CIS_MAX_TEXT_CHARS", "1000")))
    auto_timeout_s: float = field(default_factory=lambda: float(_env("CIS_AUTO_TIMEOUT_S", "3")))
    # checkpoints, data sets and indexes (engine/checkpoints.py, engine/data/, engine/index/)
    checkpoints_given: str = field(default_factory=lambda: _env("CIS_CHECKPOINTS", ""))
    prepared_dir: str = field(default_factory=lambda: _env("CIS_PREPARED_DIR", ""))
    index_memory_budget: str = field(default_factory=lambda: _env("CIS_INDEX_MEMORY_BUDGET", ""))
    twemoji_dir: str = field(default_factory=lambda: _env("CIS_TWEMOJI_DIR", ""))
    fashion_mnist_dir: str = field(default_factory=lambda: _env("CIS_FASHION_MNIST_DIR", ""))
    tuxpaint_stamps: str = field(default_factory=lambda: _env("CIS_TUXPAINT_STAMPS", "/usr/share/tuxpaint/stamps"))
    gcompris_rcc: str = field(default_factory=lambda: _env("CIS_GCOMPRIS_RCC", "/usr/share/gcompris-qt/rcc"))
    progress: bool = field(default_factory=lambda: _env("CIS_PROGRESS", "") == "1")
    hf_hub_offline: bool = field(default_factory=lambda: _env("HF_HUB_OFFLINE", "") == "1")
    # the web app (app.py, demo/ui.py)
    server_name: str = field(default_factory=lambda: _env("GRADIO_SERVER_NAME", "127.0.0.1"))
    server_port: int = field(default_factory=lambda: int(_env("GRADIO_SERVER_PORT", "7860")))
    queue_max: int = field(default_factory=lambda: int(_env("CIS_QUEUE_MAX", "64")))
    concurrency: int = field(default_factory=lambda: int(_env("CIS_CONCURRENCY", "8")))
    api_workers: int = field(default_factory=lambda: int(_env("CIS_API_WORKERS", "16")))
    text_batch: int = field(default_factory=lambda: int(_env("CIS_TEXT_BATCH", "16")))  # engine/service.py
    # per-session state Gradio keeps (every API call without a session is one: ~180 kB each, 10,000 by default)
    state_sessions: int = field(default_factory=lambda: int(_env("CIS_STATE_SESSIONS", "256")))
    # background prepare of a running app (engine/background.py)
    prepare: str = field(default_factory=lambda: _env("CIS_PREPARE", "auto").lower())
    prepare_budget_min: float = field(default_factory=lambda: float(_env("CIS_PREPARE_BUDGET_MIN", "30")))
    prepare_parts: str = field(default_factory=lambda: _env("CIS_PREPARE_PARTS", ""))
    on_space: bool = field(default_factory=lambda: bool(_env("SPACE_ID", "")))

    def resolved_index_dir(self) -> Path:
        if self.index_dir:
            return Path(self.index_dir)
        return cache_dir() / "indexes" / Path(self.gallery).name


# one doc line per environment variable (README, 'Configuration', has the table for users)
ENV_DOCS = {
    "CIS_BACKBONE": "backbone spec: auto, packaged[:lite0|lite1|lite2], open_clip:ARCH/TAG, tiny[:cfg]",
    "CIS_GALLERY": "folder of images the demo searches (default assets/gallery)",
    "CIS_INDEX_DIR": "where the demo keeps the gallery's index (default: in the cache dir)",
    "CIS_DEVICE": "auto, cpu or cuda",
    "CIS_MAX_DECODE_MB": "memory one image may need to decode, counted for its real mode (default 128)",
    "CIS_BODY_IDLE_S": "seconds a request body may stall before the server answers 408 (default 15)",
    "CIS_CHECKPOINTS": "checkpoint folders searched first (os.pathsep-separated); trainers write here by default",
    "CIS_CACHE_DIR": "indexes, feature caches, assembled data sets, prepared checkpoints "
                     "(default ~/.cache/composed-image-search)",
    "CIS_PREPARED_DIR": "where `python -m engine prepare` writes checkpoints (default <cache>/checkpoints)",
    "CIS_INDEX_MEMORY_BUDGET": "memory budget of an IVF-PQ index (e.g. 2GB), sizes its parameters",
    "CIS_TWEMOJI_DIR": "an unpacked twemoji npm package (else the cache, installed with npm)",
    "CIS_FASHION_MNIST_DIR": "the Fashion-MNIST files (default /usr/share/datasets/fashion-mnist, Debian package)",
    "CIS_TUXPAINT_STAMPS": "Tux Paint stamps folder, a photo source of the offline sets",
    "CIS_GCOMPRIS_RCC": "GCompris rcc folder, a photo source of the offline sets",
    "CIS_PROGRESS": "1: progress bars even when stderr is not a terminal (data builders)",
    "CIS_MAX_UPLOAD_MB": "largest reference image upload",
    "CIS_MAX_PIXELS": "most decoded pixels of a reference image",
    "CIS_MAX_ZIP_MB": "largest uploaded zip ('Search your own photos')",
    "CIS_MAX_ZIP_FILES": "most images in an uploaded zip",
    "CIS_MAX_ASPECT": "most extreme aspect ratio accepted",
    "CIS_MAX_FRAMES": "most animation frames of an image",
    "CIS_MAX_ZIP_PIXELS": "most decoded pixels per uploaded zip",
    "CIS_MAX_SESSIONS": "live uploaded galleries (the oldest is closed first)",
    "CIS_SESSION_TTL_S": "seconds an unused uploaded gallery lives",
    "CIS_MAX_TEXT_CHARS": "longest modification text",
    "CIS_AUTO_TIMEOUT_S": "how long CIS_BACKBONE=auto waits for the model hub",
    "CIS_STATE_SESSIONS": "page sessions whose state the server keeps (oldest dropped first; default 256)",
    "CIS_DECODE_BUDGET_MB": "MB of image decoding in flight at once, all routes together (default 160)",
    "CIS_QUEUE_MAX": "waiting requests before the page says busy (Gradio queue)",
    "CIS_CONCURRENCY": "searches run at once (Gradio queue)",
    "CIS_API_WORKERS": "threads of POST /api/search",
    "CIS_TEXT_BATCH": "most texts encoded in one forward pass by the micro-batcher (1: no batching)",
    "CIS_PREPARE": "background prepare in a running app: auto, on or off",
    "CIS_PREPARE_BUDGET_MIN": "minutes the background prepare may take",
    "CIS_PREPARE_PARTS": "comma list of the parts the background prepare trains (default: all)",
    "GRADIO_SERVER_NAME": "address the app listens on (default 127.0.0.1)",
    "GRADIO_SERVER_PORT": "port the app listens on (default 7860)",
    "SPACE_ID": "set by Hugging Face Spaces; the app then runs as a Space",
    "HF_HUB_OFFLINE": "1: never contact the model hub",
    "XDG_CACHE_HOME": "base of the default cache dir when CIS_CACHE_DIR is unset",
    "CIS_CHROMIUM": "tests only: the Chromium binary of the browser tests",
    "CIS_WRITE_DOC_IMAGES": "tests only: 1 makes the browser tests write the screenshots in docs/",
}


def resolve_device(device: str = "auto") -> str:
    import torch

    if device in ("", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("CIS_DEVICE asks for CUDA but no GPU is visible")
    return device


# -- the environment of child processes and of this process -------------------------------------------------
# The only other places that touch os.environ: what a subprocess inherits and defaults set before a library
# reads them (Gradio's analytics switch). Reads go through Settings.


def child_environment(only_prefixes=None, **overrides: str) -> dict:
    """A copy of this process's environment for a subprocess, with ``overrides`` set; with ``only_prefixes``
    (a tuple of prefixes, e.g. ``("CIS_", "HF_")``) only the variables that start with one of them."""
    env = dict(os.environ)
    if only_prefixes is not None:
        env = {k: v for k, v in env.items() if k.startswith(tuple(only_prefixes))}
    env.update({k: str(v) for k, v in overrides.items()})
    return env


def set_default_environment(**values: str) -> None:
    """Sets each variable that is not set yet (``os.environ.setdefault``): defaults this process and its
    children read, such as ``GRADIO_ANALYTICS_ENABLED`` before Gradio is imported."""
    for name, value in values.items():
        os.environ.setdefault(name, str(value))
