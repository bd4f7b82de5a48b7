"""Query expanders. Importing this package registers every built-in expander."""
from . import baselines, lattqe  # noqa: F401  (each registers its expanders on import)
from .base import EXPANDERS, Expander, ExpanderUnavailable, Expansion, NoExpansion  # noqa: F401
