"""The process-wide values an entry point sets from the :class:`engine.config.Settings` it built, in one call.

Two values cannot travel as arguments: the decode budget (:func:`engine.images.configure`, every decode in the
process shares it) and the offline data sets' source folders (:func:`engine.data.locations.configure`, a set is
built wherever it is first needed, deep inside a trainer or an evaluation). Every entry point (app.py, a
command's ``main``, each trainer's ``main``, the tools) calls :func:`configure_process` once where it builds its
Settings, so a new value of this kind is added here and no entry point can set one and forget the other
(tests/test_architecture.py). It sits in the offline-data layer because it configures ``engine.data``; the few
entry points that never reach a data set (``engine.compare`` in the serving layer below it, the CLI's
``index``/``search`` settings, ``eval/triplets.py``, ``loadtest.py``) size the decode budget alone with
``engine.images.configure``.
"""
from __future__ import annotations

from . import images
from .data import locations


def configure_process(settings) -> locations.DataSources:
    """Sizes the decode budget and sets the offline sets' sources from ``settings``; returns the sources."""
    images.configure(settings)
    return locations.configure(settings)
