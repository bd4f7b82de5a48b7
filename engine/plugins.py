"""The one loader of ``"module:function"`` section plugins (``python -m engine bench`` / ``eval offline``).

A section whose module is broken or missing must fail the run loudly: skipping it silently would print
a report without the section and hide the error.
"""
from __future__ import annotations

import importlib
from typing import Callable


def load_plugin(spec: str) -> Callable:
    """``"package.module:function"`` -> the function; ImportError / AttributeError propagate, naming it."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"plugin spec {spec!r} is not 'module:function'")
    try:
        return getattr(importlib.import_module(module), attr)
    except AttributeError:
        raise AttributeError(f"plugin {spec!r}: module {module} has no function {attr}") from None
