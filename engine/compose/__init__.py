"""Composers. Importing this package registers every built-in composer."""
from . import baselines, context_i2w, rtic  # noqa: F401  (each registers its composers on import)
from .base import COMPOSERS, Composer, ComposerUnavailable, Composition, Query  # noqa: F401
