"""Gallery indexing, storage and vector indexes. Importing this package registers every index type."""
from . import ics_index  # noqa: F401  (registers the compact binary index types)
from .vectors import VECTOR_INDEXES, VectorIndex, create_vector_index  # noqa: F401
