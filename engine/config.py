"""Settings read from environment variables (documented in README, 'Configuration')."""
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
    max_zip_mb: float = field(default_factory=lambda: float(_env("CIS_MAX_ZIP_MB", "200")))
    max_zip_files: int = field(default_factory=lambda: int(_env("CIS_MAX_ZIP_FILES", "2000")))
    max_aspect: float = field(default_factory=lambda: float(_env("CIS_MAX_ASPECT", "20")))
    max_frames: int = field(default_factory=lambda: int(_env("CIS_MAX_FRAMES", "100")))
    max_zip_pixels: int = field(default_factory=lambda: int(_env("CIS_MAX_ZIP_PIXELS", str(400_000_000))))
    max_sessions: int = field(default_factory=lambda: int(_env("CIS_MAX_SESSIONS", "16")))
    session_ttl_s: float = field(default_factory=lambda: float(_env("CIS_SESSION_TTL_S", "3600")))
    max_text_chars: int = field(default_factory=lambda: int(_env("CIS_MAX_TEXT_CHARS", "1000")))
    auto_timeout_s: float = field(default_factory=lambda: float(_env("CIS_AUTO_TIMEOUT_S", "3")))
    # the web app (app.py, demo/ui.py)
    server_name: str = field(default_factory=lambda: _env("GRADIO_SERVER_NAME", "127.0.0.1"))
    server_port: int = field(default_factory=lambda: int(_env("GRADIO_SERVER_PORT", "7860")))
    queue_max: int = field(default_factory=lambda: int(_env("CIS_QUEUE_MAX", "64")))
    concurrency: int = field(default_factory=lambda: int(_env("CIS_CONCURRENCY", "8")))
    api_workers: int = field(default_factory=lambda: int(_env("CIS_API_WORKERS", "16")))
    text_batch: int = field(default_factory=lambda: int(_env("CIS_TEXT_BATCH", "16")))
    # background prepare of a running app (engine/background.py)
    prepare: str = field(default_factory=lambda: _env("CIS_PREPARE", "auto").lower())
    prepare_budget_min: float = field(default_factory=lambda: float(_env("CIS_PREPARE_BUDGET_MIN", "30")))
    prepare_parts: str = field(default_factory=lambda: _env("CIS_PREPARE_PARTS", ""))
    on_space: bool = field(default_factory=lambda: bool(_env("SPACE_ID", "")))

    def resolved_index_dir(self) -> Path:
        if self.index_dir:
            return Path(self.index_dir)
        return cache_dir() / "indexes" / Path(self.gallery).name


def resolve_device(device: str = "auto") -> str:
    import torch

    if device in ("", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError("CIS_DEVICE asks for CUDA but no GPU is visible")
    return device


# -- the environment of child processes and of this process -------------------------------------------------
# The only other places that touch os.environ: what a subprocess inherits and defaults set before a library
# reads them (Gradio's analytics switch, the data builders' progress bars). Reads go through Settings.


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
