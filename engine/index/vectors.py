"""FAISS vector indexes behind one small interface: exact, HNSW, IVF; GPU when CUDA FAISS is present."""
from __future__ import annotations

import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Tuple

import numpy as np

from ..errors import IndexLoadError, InputError
from ..fileio import atomic_path
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
        _add_in_blocks(index, vectors, self.options.get("progress"), self.kind)
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


def _add_in_blocks(index, vectors: np.ndarray, progress=None, label: str = "", block: int = 20_000) -> None:
    """``index.add(vectors)``, in blocks under a tqdm bar when ``progress`` is true (long HNSW / IVF builds)."""
    if not progress or len(vectors) <= block:
        index.add(vectors)
        return
    from tqdm import tqdm

    with tqdm(total=len(vectors), desc=f"building {label}", unit="vec", unit_scale=True, leave=False) as bar:
        for s in range(0, len(vectors), block):
            index.add(vectors[s:s + block])
            bar.update(min(block, len(vectors) - s))


class FlatIndex(_FaissIndex):
    """Exact inner-product search."""

    kind = "flat"

    def _make(self, n):
        return _faiss().IndexFlatIP(self.dim)


# HNSW defaults, chosen from `python -m engine bench --only ann` (docs/BENCHMARKS.md, ann): at 100k 512-d vectors
# efConstruction 80 builds in about 3x the time of 40 but keeps recall on hard (out-of-distribution) queries
# higher at every efSearch; efSearch 128 gives recall@10 1.000 on in-distribution queries at about 0.5 ms,
# a quarter of the 2 ms budget, and the best recall on out-of-distribution ones (composed queries can land
# between clusters), so the extra 0.25 ms over efSearch 64 is kept.
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 128


class HNSWIndex(_FaissIndex):
    """Approximate search on a HNSW graph (M links per node, efSearch candidates)."""

    kind = "hnsw"
    save_file = True

    def _make(self, n):
        faiss = _faiss()
        index = faiss.IndexHNSWFlat(self.dim, int(self.options.get("M", HNSW_M)), faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = int(self.options.get("ef_construction", HNSW_EF_CONSTRUCTION))
        self._apply_search_params(index)
        return index

    def _apply_search_params(self, index):
        index.hnsw.efSearch = int(self.options.get("ef_search", HNSW_EF_SEARCH))

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


# -- IVF-PQ for big galleries ----------------------------------------------------------------------------
IVFPQ_MIN_POINTS_PER_LIST = 39  # FAISS warns below 39 training points per coarse centroid
IVFPQ_TRAIN_PER_LIST = 50  # k-means sample: 50 points per list (FAISS's useful range is 39..256)
IVFPQ_DEFAULT_RERANK = 300  # candidates re-ranked exactly from float16 vectors (100 left recall@10 at 0.94 in tests)
IVFPQ_ID_BYTES = 8  # each inverted-list entry stores an int64 id beside its code


def parse_bytes(text) -> int:
    """'8G', '512MB', '1.5GiB', 4000000 -> bytes (powers of 1024 for K/M/G/T)."""
    if isinstance(text, (int, float)):
        return int(text)

    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(?:I?B)?\s*", str(text).upper())
    if not m:
        raise InputError(f"a memory budget is a size like 8G or 512MB, got {text!r}")
    return int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2) or " "))


def ivfpq_params(n: int, dim: int, memory_budget=None, rerank=None) -> dict:
    """IVF-PQ parameters from the gallery size, the dimension and a memory budget (bytes; None = no limit).

    The rules, in the spirit of autofaiss:

    * ``nlist`` (coarse cells) = the power of two nearest ``4 * sqrt(N)``, at most ``N / 39`` so every
      centroid has 39 training points; the k-means sample is ``50 * nlist`` vectors; ``nprobe`` = nlist / 16
      (at least 8, at most nlist);
    * ``m`` (PQ bytes per vector, 8-bit codes) = the largest divisor of ``dim`` with sub-vectors of 4 to 32
      dimensions, at most ``dim / 8`` (64 at 512-d), such that the index fits the budget: per vector ``m`` code
      bytes + 8 id bytes (+ ``2 * dim`` float16 bytes when exact re-ranking is on), plus the coarse centroids
      and PQ codebooks (``4 * dim * (nlist + 256)`` bytes);
    * exact re-rank of the top ``rerank`` candidates (default 300) from float16 vectors is on when its
      vectors fit the budget beside the smallest code, off otherwise (or when ``rerank`` = 0).

    Raises InputError when not even the smallest code fits."""
    n, dim = max(int(n), 1), int(dim)
    nlist = 1 << max(0, round(np.log2(4 * np.sqrt(n))))
    while nlist > 1 and nlist * IVFPQ_MIN_POINTS_PER_LIST > n:
        nlist //= 2
    choices = [m for m in range(dim // 4, 0, -1) if dim % m == 0 and 4 <= dim // m <= 32 and m <= max(1, dim // 8)]
    if not choices:
        choices = [m for m in range(dim, 0, -1) if dim % m == 0][-1:]
    fixed = 4 * dim * (nlist + 256)
    budget = parse_bytes(memory_budget) if memory_budget not in (None, "", 0) else None
    want_rerank = IVFPQ_DEFAULT_RERANK if rerank is None else int(rerank)

    def fits(m, with_rerank):
        return budget is None or fixed + n * (m + IVFPQ_ID_BYTES + (2 * dim if with_rerank else 0)) <= budget

    use_rerank = want_rerank > 0 and fits(choices[-1], True)
    fitting = [m for m in choices if fits(m, use_rerank)]
    if not fitting:
        need = fixed + n * (choices[-1] + IVFPQ_ID_BYTES)
        raise InputError(f"a memory budget of {budget:,} bytes is too small for an IVF-PQ index of {n:,} "
                         f"{dim}-d vectors; it needs at least {need:,} bytes")
    m = fitting[0]
    return {"nlist": nlist, "m": m, "nbits": int(min(8, np.log2(n))) if n >= 2 else 1,
            "nprobe": min(nlist, max(8, nlist // 16)), "train_size": min(n, max(IVFPQ_TRAIN_PER_LIST * nlist, 20_000)), "rerank": want_rerank if use_rerank else 0,
            "bytes_per_item": m + IVFPQ_ID_BYTES + (2 * dim if use_rerank else 0),
            "index_bytes": fixed + n * (m + IVFPQ_ID_BYTES + (2 * dim if use_rerank else 0)), "budget": budget}


class IVFPQIndex(_FaissIndex):
    """Inverted file + product quantisation for galleries past what float vectors in memory allow.

    Parameters come from :func:`ivfpq_params` (N, dimension, the ``memory_budget`` option: the entry point
    passes ``CIS_INDEX_MEMORY_BUDGET`` from its Settings); any of ``nlist``, ``m``, ``nprobe``, ``rerank`` can be
    given as options. The codes are trained on a sample and added in blocks, so building never needs a
    float32 copy of the whole gallery beyond the one it is given. With re-ranking on, the top ``rerank``
    candidates of the PQ search are re-ordered by their exact inner product with the float16 vectors.
    Option ``on_disk``: load the inverted lists memory-mapped from ``vectors.faiss`` instead of into RAM."""

    kind = "ivfpq"
    save_file = True
    takes_float16 = True  # build/load accept the gallery's float16 matrix and re-rank from it without a copy

    def __init__(self, dim: int, n: int = 0, **options):
        super().__init__(dim, **options)
        self._set_params(n)
        self.vectors16 = np.zeros((0, dim), np.float16)

    def _set_params(self, n: int) -> None:
        budget = self.options.get("memory_budget") or None  # CIS_INDEX_MEMORY_BUDGET, passed by the entry point
        self.params = ivfpq_params(n, self.dim, budget, self.options.get("rerank"))
        for key in ("nlist", "m", "nprobe", "train_size"):
            if self.options.get(key):
                self.params[key] = int(self.options[key])
        if self.dim % self.params["m"]:
            raise InputError(f"PQ code size m = {self.params['m']} must divide the dimension {self.dim}")
        self.rerank = int(self.params["rerank"])

    def _make(self, n):
        faiss = _faiss()
        nlist = max(1, min(self.params["nlist"], n // IVFPQ_MIN_POINTS_PER_LIST or 1))
        self.params["nlist"] = nlist
        quantizer = faiss.IndexFlatIP(self.dim)
        index = faiss.IndexIVFPQ(quantizer, self.dim, nlist, self.params["m"], self.params["nbits"],
                                 faiss.METRIC_INNER_PRODUCT)
        index.cp.niter = 10  # coarse k-means: 10 iterations are enough for the cells, 25 (default) takes 2.5x
        self._quantizer = quantizer
        self._apply_search_params(index)
        return index

    def _apply_search_params(self, index):
        index.nprobe = int(min(index.nlist, self.params["nprobe"]))

    def build(self, vectors):
        n = len(vectors)
        self._set_params(n)  # the size it was created for may be a guess
        index = self._make(n)
        size = min(n, int(self.params["train_size"]))
        sample = np.random.default_rng(0).choice(n, size, replace=False) if size < n else np.arange(n)
        index.train(np.ascontiguousarray(vectors[np.sort(sample)], dtype=np.float32))
        block = 50_000
        bar = None
        if self.options.get("progress") and n > block:
            from tqdm import tqdm

            bar = tqdm(total=n, desc="building ivfpq", unit="vec", unit_scale=True, leave=False)
        for s in range(0, n, block):
            index.add(np.ascontiguousarray(vectors[s:s + block], dtype=np.float32))
            if bar is not None:
                bar.update(min(block, n - s))
        if bar is not None:
            bar.close()
        self._keep_rerank_vectors(vectors)
        self._cpu = index
        self.index = self._to_gpu(index)
        self.ntotal = index.ntotal

    def _keep_rerank_vectors(self, vectors):
        if self.rerank:
            self.vectors16 = vectors if getattr(vectors, "dtype", None) == np.float16 else \
                np.asarray(vectors, dtype=np.float32).astype(np.float16)
        else:
            self.vectors16 = np.zeros((0, self.dim), np.float16)

    def load(self, folder, vectors):
        path = Path(folder) / self.file_name
        if self.options.get("on_disk") and path.exists():
            faiss = _faiss()
            try:  # inverted lists stay in the file, paged in by the OS as cells are probed
                index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP)
            except Exception as exc:
                raise IndexLoadError(f"the vector index file {path} is damaged ({exc}); rebuild the index") from None
            if index.d != self.dim or index.ntotal != len(vectors):
                raise IndexLoadError(f"{path} does not match the stored embeddings; rebuild the index")
            self._apply_search_params(index)
            self._cpu = self.index = index
            self.ntotal = index.ntotal
        else:
            super().load(folder, vectors)
        if self.ntotal and not isinstance(self._cpu, _faiss().IndexIVFPQ):
            raise IndexLoadError(f"{path} is not an IVF-PQ index; rebuild the index")
        self.params["nlist"] = int(self._cpu.nlist)
        self.params["m"] = int(self._cpu.pq.M)
        self._keep_rerank_vectors(vectors)

    def search(self, queries, k):
        queries = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        k = max(1, min(int(k), self.ntotal))
        if not self.rerank:
            return self.index.search(queries, k)
        scores, ids = self.index.search(queries, max(k, self.rerank))
        out_s = np.full((len(queries), k), -np.inf, np.float32)
        out_i = np.full((len(queries), k), -1, np.int64)
        for qi, row in enumerate(ids):
            row = row[row >= 0]
            # einsum on this thread: a multi-threaded BLAS product for one query stalls on a loaded machine
            s = np.einsum("ij,j->i", self.vectors16[row].astype(np.float32), queries[qi])
            top = np.argsort(-s, kind="stable")[:k]
            out_s[qi, :len(top)] = s[top]
            out_i[qi, :len(top)] = row[top]
        return out_s, out_i

    def bytes_per_item(self) -> float:
        return float(self.params["m"] + IVFPQ_ID_BYTES + (2 * self.dim if self.rerank else 0))

    def describe(self) -> dict:
        d = super().describe()
        d.update({k: self.params[k] for k in ("nlist", "m", "nprobe")}, rerank=self.rerank,
                 code_bytes_per_item=self.params["m"] + IVFPQ_ID_BYTES)
        return d


# name -> factory(dim, n_items, **options) -> VectorIndex
VECTOR_INDEXES: Registry[VectorIndex] = Registry("index type")
VECTOR_INDEXES.register("flat")(lambda dim, n=0, **o: FlatIndex(dim, **o))
VECTOR_INDEXES.register("hnsw")(lambda dim, n=0, **o: HNSWIndex(dim, **o))
VECTOR_INDEXES.register("ivf")(lambda dim, n=0, **o: IVFIndex(dim, **o))
VECTOR_INDEXES.register("ivfpq")(lambda dim, n=0, **o: IVFPQIndex(dim, n, **o))


def resolve_index_type(kind: str, n: int) -> str:
    if kind in ("", "auto"):
        return "flat" if n <= AUTO_EXACT_MAX else "hnsw"
    return kind


def create_vector_index(kind: str, dim: int, n: int = 0, **options) -> VectorIndex:
    kind = resolve_index_type(kind, n)
    return VECTOR_INDEXES.get(kind)(dim, n, **options)
