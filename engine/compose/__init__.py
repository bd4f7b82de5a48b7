"""Composers. Importing this package registers every built-in composer."""
from . import baselines, context_i2w, rtic  # noqa: F401  (each registers its composers on import)
from . import auto  # noqa: F401,I001  (after the methods it routes to)
from .base import COMPOSERS, Composer, ComposerUnavailable, Composition, Query  # noqa: F401
