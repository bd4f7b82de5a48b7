"""Composers. Importing this package registers every built-in composer."""
from .base import COMPOSERS, Composer, ComposerUnavailable, Composition, Query  # noqa: F401
from . import baselines  # noqa: F401

# Learned composers register themselves on import; a missing optional module must not break the rest.
for _mod in ("context_i2w", "rtic"):
    try:
        __import__(f"{__name__}.{_mod}")
    except ModuleNotFoundError as _exc:  # the module is not written yet
        if _exc.name != f"{__name__}.{_mod}":
            raise
