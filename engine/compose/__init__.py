"""Composers. Importing this package registers every built-in composer and every learned one (the runtime
module of each spec in engine.checkpoints.PARTS), then the automatic method that routes between them."""
from importlib import import_module

from ..checkpoints import runtime_modules
from . import baselines  # noqa: F401  (registers the composers that learn nothing)
from .base import COMPOSERS, Composer, ComposerUnavailable, Composition, Query  # noqa: F401

for _module in runtime_modules(__name__):  # context_i2w, rtic, ...
    import_module(_module)

from . import auto  # noqa: E402,F401  (after the methods it routes to)
