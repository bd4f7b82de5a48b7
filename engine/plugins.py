"""Sectioned reports of ``python -m engine bench`` / ``eval offline``: the one loader of their
``"module:function"`` section plugins and the one merge of a partial run (``--only X``) into the report.

A section whose module is broken or missing must fail the run loudly: skipping it silently would print
a report without the section and hide the error.
"""
from __future__ import annotations

import importlib
from typing import Callable, List


def load_plugin(spec: str) -> Callable:
    """``"package.module:function"`` -> the function; ImportError / AttributeError propagate, naming it."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"plugin spec {spec!r} is not 'module:function'")
    try:
        return getattr(importlib.import_module(module), attr)
    except AttributeError:
        raise AttributeError(f"plugin {spec!r}: module {module} has no function {attr}") from None


def merge_sections(old: str, new_parts: List[str]) -> str:
    """Replaces the ``## name`` sections of the report ``old`` that were re-measured (``new_parts``, each
    starting with its ``## name`` line) and keeps the others and the head (text before the first section)
    as they were; a section that ``old`` lacks is appended."""
    import re

    chunks = re.split(r"(?m)^## ", old)
    head, sections = chunks[0], {c.split("\n", 1)[0].strip(): "## " + c for c in chunks[1:]}
    for part in new_parts:
        sections[part.split("\n", 1)[0][3:].strip()] = part
    return head + "\n\n".join(s.rstrip("\n") for s in sections.values()) + "\n"
