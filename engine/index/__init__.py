"""Gallery indexing, storage and vector indexes. Importing this package registers every index type, the learned
ones included (the runtime module of each spec in engine.checkpoints.PARTS: the compact binary ICS indexes)."""
from importlib import import_module

from ..checkpoints import runtime_modules
from .vectors import VECTOR_INDEXES, VectorIndex, create_vector_index  # noqa: F401

for _module in runtime_modules(__name__):  # ics_index, ...
    import_module(_module)
