"""Sectioned reports of ``python -m engine bench`` / ``eval offline``: the one merge of a partial run
(``--only X``) into the report. The sections themselves are functions in registries
(:data:`engine.bench.base.SECTIONS`, :data:`engine.eval.offline.OFFLINE_SECTIONS`), imported like any code, so
a broken section module fails the run loudly.
"""
from __future__ import annotations

import re
from typing import List


def merge_sections(old: str, new_parts: List[str]) -> str:
    """Replaces the ``## name`` sections of the report ``old`` that were re-measured (``new_parts``, each
    starting with its ``## name`` line) and keeps the others and the head (text before the first section)
    as they were; a section that ``old`` lacks is appended."""
    chunks = re.split(r"(?m)^## ", old)
    head, sections = chunks[0], {c.split("\n", 1)[0].strip(): "## " + c for c in chunks[1:]}
    for part in new_parts:
        sections[part.split("\n", 1)[0][3:].strip()] = part
    return head + "\n\n".join(s.rstrip("\n") for s in sections.values()) + "\n"
