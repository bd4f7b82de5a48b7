"""What every bench section shares: the ``SECTIONS`` registry and the percentile helper.

A section is a function ``(args, ctx) -> (markdown, json-able figures)`` registered under its name with
``@SECTIONS.register("name")`` in a module of this package; ``ctx["engine"]`` is the loaded default engine.
"""
from __future__ import annotations

from typing import Callable, List, Tuple

import numpy as np

from ..registry import Registry

SECTIONS: Registry[Callable[..., Tuple[str, dict]]] = Registry("bench section")

# long sections, run only when named with --only: ICS (~40 min: six hash-head trainings + 1M vectors),
# the 20-client load test (~2.5 min plus start-up)
HEAVY = {"ics", "loadtest"}


def pct(values: List[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")
