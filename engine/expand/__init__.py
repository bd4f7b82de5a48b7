"""Query expanders. Importing this package registers every built-in expander and every learned one (the runtime
module of each spec in engine.checkpoints.PARTS)."""
from importlib import import_module

from ..checkpoints import runtime_modules
from . import baselines  # noqa: F401  (registers the expanders that learn nothing)
from .base import EXPANDERS, Expander, ExpanderUnavailable, Expansion, NoExpansion  # noqa: F401

for _module in runtime_modules(__name__):  # lattqe, ...
    import_module(_module)
