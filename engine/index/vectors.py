"""FAISS vector indexes behind one small interface: exact, HNSW, IVF; GPU when CUDA FAISS is present."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Tuple

import numpy as np

from ..errors import IndexLoadError
from ..registry import Registry

AUTO_EXACT_MAX = 50_000  # galleries up to this size use the exact index under "auto"


def _faiss():
    import faiss  # imported lazily: it is heavy and only needed here

    return faiss


def gpu_count() -> int:
    try:
        faiss = _faiss()
        return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    except Exception:
        return 0


class VectorIndex(ABC):
    """Search by inner product over L2-normalised vectors."""

    kind: str = ""

    def __init__(self, dim: int, **options):
        self.dim = dim
        self.options = options
        self.ntotal = 0

    @abstractmethod
    def build(self, vectors: np.ndarray) -> None:
        """Index ``vectors`` (N, dim) float32, replacing any previous content."""

    @abstractmethod
    def search(self, queries: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """(Q, dim) -> (scores (Q, k), ids (Q, k)); missing slots have id -1."""

    def save(self, folder: Path) -> None:
        """Persist what cannot be rebuilt cheaply from the stored embeddings (default: nothing)."""

    def load(self, folder: Path, vectors: np.ndarray) -> None:
        """Restore from ``folder`` (and the stored embeddings); default rebuilds from the vectors."""
        self.build(vectors)

    def bytes_per_item(self) -> float:
        return 4.0 * self.dim

    def describe(self) -> dict:
        return {"type": self.kind, "items": int(self.ntotal), "bytes_per_item": round(self.bytes_per_item(), 1)}


class _FaissIndex(VectorIndex):
    file_name = "vectors.faiss"
    save_file = False

    def _make(self, n: int):
        raise NotImplementedError  # each subclass builds its own FAISS structure

    def _to_gpu(self, index):
        if self.options.get("gpu", True) and gpu_count() > 0:
            faiss = _faiss()
            try:
                return faiss.index_cpu_to_all_gpus(index)
            except Exception:
                return index
        return index

    def build(self, vectors):
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        index = self._make(len(vectors))
        if not index.is_trained:
            index.train(vectors)
        index.add(vectors)
        self._cpu = index
        self.index = self._to_gpu(index)
        self.ntotal = index.ntotal

    def search(self, queries, k):
        queries = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        k = max(1, min(int(k), self.ntotal))
        scores, ids = self.index.search(queries, k)
        return scores, ids

    def save(self, folder):
        if self.save_file:
            faiss = _faiss()
            from ..fileio import atomic_path

            with atomic_path(folder / self.file_name) as tmp:
                faiss.write_index(self._cpu, str(tmp))

    def load(self, folder, vectors):
        path = folder / self.file_name
        if not self.save_file or not path.exists():
            return self.build(vectors)
        faiss = _faiss()
        try:
            index = faiss.read_index(str(path))
        except Exception as exc:
            raise IndexLoadError(f"the vector index file {path} is damaged ({exc}); rebuild the index") from None
        if index.d != self.dim or index.ntotal != len(vectors):
            raise IndexLoadError(f"{path} does not match the stored embeddings; rebuild the index")
        self._apply_search_params(index)
        self._cpu = index
        self.index = self._to_gpu(index)
        self.ntotal = index.ntotal

    def _apply_search_params(self, index):
        pass


class FlatIndex(_FaissIndex):
    """Exact inner-product search."""

    kind = "flat"

    def _make(self, n):
        return _faiss().IndexFlatIP(self.dim)


class HNSWIndex(_FaissIndex):
    """Approximate search on a HNSW graph (M links per node, efSearch candidates)."""

    kind = "hnsw"
    save_file = True

    def _make(self, n):
        faiss = _faiss()
        index = faiss.IndexHNSWFlat(self.dim, int(self.options.get("M", 32)), faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = int(self.options.get("ef_construction", 80))
        self._apply_search_params(index)
        return index

    def _apply_search_params(self, index):
        index.hnsw.efSearch = int(self.options.get("ef_search", 128))

    def _to_gpu(self, index):  # FAISS has no GPU HNSW; keep it on the CPU
        return index


class IVFIndex(_FaissIndex):
    """Approximate search on an inverted file (nlist coarse cells, nprobe visited)."""

    kind = "ivf"
    save_file = True

    def _make(self, n):
        faiss = _faiss()
        nlist = int(self.options.get("nlist", max(1, min(4 * int(np.sqrt(max(n, 1))), n // 39 or 1))))
        quantizer = faiss.IndexFlatIP(self.dim)
        index = faiss.IndexIVFFlat(quantizer, self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
        self._quantizer = quantizer
        index.nprobe = int(self.options.get("nprobe", max(1, nlist // 16)))
        return index

    def _apply_search_params(self, index):
        index.nprobe = int(self.options.get("nprobe", max(1, index.nlist // 16)))


# name -> factory(dim, n_items, **options) -> VectorIndex
VECTOR_INDEXES: Registry[VectorIndex] = Registry("index type")
VECTOR_INDEXES.register("flat")(lambda dim, n=0, **o: FlatIndex(dim, **o))
VECTOR_INDEXES.register("hnsw")(lambda dim, n=0, **o: HNSWIndex(dim, **o))
VECTOR_INDEXES.register("ivf")(lambda dim, n=0, **o: IVFIndex(dim, **o))


def resolve_index_type(kind: str, n: int) -> str:
    if kind in ("", "auto"):
        return "flat" if n <= AUTO_EXACT_MAX else "hnsw"
    return kind


def create_vector_index(kind: str, dim: int, n: int = 0, **options) -> VectorIndex:
    kind = resolve_index_type(kind, n)
    return VECTOR_INDEXES.get(kind)(dim, n, **options)
