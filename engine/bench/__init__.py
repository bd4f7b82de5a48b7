"""`python -m engine bench` (see :mod:`engine.bench.cli`): one module per group of sections, each registering
its sections in :data:`engine.bench.base.SECTIONS`; importing this package registers them all (in this
order, the order of a full run and of docs/BENCHMARKS.md)."""
from . import query, indexing, ann, server, expanders, ics, context_i2w, integrity, prepare_cost, text_batch  # noqa: F401
from .base import HEAVY, SECTIONS
from .cli import main

__all__ = ["HEAVY", "SECTIONS", "main"]
