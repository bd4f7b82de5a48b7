"""A wall-time limit around a trainer, set by ``python -m engine prepare``.

Every trainer's epoch loop asks :func:`another_epoch_fits` after each epoch: when the limit is set and one
more epoch as long as the last one would pass it, training ends there (at least one epoch always runs) and
the checkpoint holds the epochs done. The limit is context-local, so the app's background ``prepare``
thread does not affect trainers elsewhere in the process."""
from __future__ import annotations

import contextlib
import contextvars
import time
from typing import Iterator, Optional

_DEADLINE: contextvars.ContextVar = contextvars.ContextVar("cis_train_deadline", default=None)


@contextlib.contextmanager
def train_deadline(at: Optional[float]) -> Iterator[None]:
    """Trainers run inside this block stop at the last epoch that ends before ``at``
    (a ``time.perf_counter()`` value; None = no limit)."""
    token = _DEADLINE.set(at)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def another_epoch_fits(last_epoch_s: float) -> bool:
    """False when a limit is set and another epoch of ``last_epoch_s`` seconds would end after it."""
    at = _DEADLINE.get()
    return at is None or time.perf_counter() + float(last_epoch_s) <= at
