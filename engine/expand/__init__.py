"""Query expanders. Importing this package registers every built-in expander."""
from .base import EXPANDERS, Expander, ExpanderUnavailable, Expansion, NoExpansion  # noqa: F401

for _mod in ("baselines", "lattqe"):
    try:
        __import__(f"{__name__}.{_mod}")
    except ModuleNotFoundError as _exc:
        if _exc.name != f"{__name__}.{_mod}":
            raise
