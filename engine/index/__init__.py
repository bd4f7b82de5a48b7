"""Gallery indexing, storage and vector indexes. Importing this package registers every index type."""
from .vectors import VECTOR_INDEXES, VectorIndex, create_vector_index  # noqa: F401

for _mod in ("ics_index",):
    try:
        __import__(f"{__name__}.{_mod}")
    except ModuleNotFoundError as _exc:
        if _exc.name != f"{__name__}.{_mod}":
            raise
