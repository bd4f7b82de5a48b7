"""Compact binary gallery index: Hamming search over hash codes, then exact re-ranking in float.

``CompactBinaryIndex`` stores one packed code per image (K/8 bytes: 8 bytes at 64 bits) in a FAISS
binary index and the float16 embeddings for re-ranking. A search encodes the query with the same
hasher, takes the top ``rerank`` (R) candidates by Hamming distance and orders them by the exact
inner product with their stored embeddings.

Registered index types ``ics-16``, ``ics-32``, ``ics-64``, ``ics-128`` load the trained ICS hash head
``ics-<K>-<backbone slug>.safetensors`` found by :mod:`engine.checkpoints` (see :mod:`engine.index.ics`), refusing a checkpoint made for
another backbone. :class:`LSHIndex` (random projections, untrained) is the same index with an LSH
hasher, kept for comparisons (docs, benchmark) and not offered as a product index type.

Candidate structure: an exhaustive Hamming scan up to ``FLAT_MAX`` items, ``IndexBinaryHNSW`` above
(option ``binary_index`` forces one: ``flat``, ``hnsw``, ``mih`` for ``IndexBinaryMultiHash`` or ``ivf``
for ``IndexBinaryIVF``, which scans only the ``nprobe`` cells nearest the query code). The flat
scan is :class:`HammingScan` (numpy xor + vector popcount per cache-sized chunk, then a threshold
selection of the top R; option ``threads`` splits it over cores), which returns the same candidates as
FAISS's ``IndexBinaryFlat`` (kept as ``index`` for the other structures and for comparison) in about half
its time: FAISS keeps a heap of R entries while it scans.
"""
from __future__ import annotations

import json
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..checkpoints import describe_search_path, find, part
from ..errors import CheckpointError, IndexLoadError, InputError
from ..fileio import atomic_save_npy as _atomic_save_npy
from ..fileio import atomic_write_text as _atomic_write_text
from .ics import SUPPORTED_BITS, Hasher, load_ics
from .ics_baselines import LSHHasher
from .vectors import VECTOR_INDEXES, VectorIndex

FLAT_MAX = 2_000_000  # above this many items "auto" uses a HNSW graph over the binary codes
DEFAULT_RERANK = 1000
CODES_FILE = "vectors.codes.npy"
CODES_META = "vectors.codes.json"


def _faiss():
    import faiss  # heavy; only needed here

    return faiss


SCAN_CHUNK = 1 << 16  # codes per xor/popcount step: the chunk, its xor and its distances stay in L2
_POOLS: dict = {}


def _pool(workers: int) -> ThreadPoolExecutor:
    """One shared pool per size for the scan's extra shards (threads idle between queries)."""
    if workers not in _POOLS:
        _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="hamming-scan")
    return _POOLS[workers]


def smallest(d: np.ndarray, r: int, top: int, mask: Optional[np.ndarray] = None) -> np.ndarray:
    """Positions of the ``r`` smallest of the distances ``d`` (uint8, at most ``top``), ordered by
    (distance, position): what ``np.argsort(d, kind="stable")[:r]`` gives, without sorting all of ``d``.

    The distance of the about-2r-th smallest of a strided sample is a threshold ``t`` that usually holds
    r to a few r items; one pass marks ``d <= t`` (``t`` grows until at least r are marked) and only the
    marked items are sorted."""
    n = len(d)
    if r >= n:
        return np.argsort(d, kind="stable")
    m = np.empty(n, bool) if mask is None else mask[:n]
    sample = np.sort(d[::max(1, n // 4096)], kind="stable")  # a radix sort for uint8
    t = int(sample[min(len(sample) - 1, 2 * r * len(sample) // n)])
    while True:
        np.less_equal(d, t, out=m)
        ids = np.flatnonzero(m)
        if len(ids) >= r or t >= top:
            break
        t += 1
    return ids[np.argsort(d[ids], kind="stable")[:r]]


class HammingScan:
    """Exhaustive Hamming top-r over packed binary codes (N, B bytes), in numpy.

    Per chunk of :data:`SCAN_CHUNK` codes the codes are xor-ed with the query code as 64-bit words (32, 16
    or 8 bits when B is not a multiple of 8) and counted with ``np.bitwise_count`` (a vector popcount), one
    uint8 distance per item, and the chunk's items within a threshold ``t`` are kept while the chunk is in
    cache. ``t`` is the distance of the about-3r-th nearest of a fixed strided sample of 4,096 codes, so it
    usually keeps a few r items; when it keeps fewer than r the shard is scanned again keeping every
    distance (:func:`smallest`). The kept items are sorted: ties go to the lower ids and the result is
    ordered by (distance, id), the set and order of a stable sort of all distances.

    ``threads`` > 1 splits the codes into that many contiguous shards scanned at once (numpy releases the
    GIL inside these loops; the calling thread takes the first shard) and merges the shards' top r.
    Scratch buffers are per calling thread, so concurrent searches are safe."""

    SAMPLE = 4096
    MIN_SHARD = 1 << 15

    def __init__(self, codes: np.ndarray, bits: int, threads: int = 1):
        codes = np.ascontiguousarray(codes, dtype=np.uint8)
        nbytes = codes.shape[1]
        word = next(w for w in (8, 4, 2, 1) if nbytes % w == 0)
        self.word = np.dtype(f"u{word}")
        self.words = codes.view(self.word)  # (N, nbytes / word)
        if self.words.shape[1] == 1:
            self.words = self.words[:, 0]
        self.bits, self.n = int(bits), len(codes)
        self.sample = self.words[::max(1, self.n // self.SAMPLE)].copy()
        self.threads = max(1, min(int(threads), self.n // self.MIN_SHARD))  # a thread per >= 32k codes
        bounds = np.linspace(0, self.n, self.threads + 1).astype(int)
        self.shards = list(zip(bounds[:-1], bounds[1:]))
        self._local = threading.local()

    def _scratch(self):
        b = getattr(self._local, "buffers", None)
        if b is None:
            shape = (SCAN_CHUNK,) + self.words.shape[1:]
            b = self._local.buffers = [{
                "xor": np.empty(shape, self.word), "count": np.empty(shape, np.uint8) if len(shape) > 1 else None,
                "d": np.empty(SCAN_CHUNK, np.uint8), "mask": np.empty(SCAN_CHUNK, bool)} for _ in self.shards]
        return b

    def _distances(self, words: np.ndarray, qword: np.ndarray, b: dict, out: np.ndarray) -> np.ndarray:
        """Hamming distances of ``words`` (at most SCAN_CHUNK codes) to the query, written to ``out``."""
        x = b["xor"][:len(words)]
        np.bitwise_xor(words, qword, out=x)
        if b["count"] is None:
            return np.bitwise_count(x, out=out)
        c = b["count"][:len(words)]
        np.bitwise_count(x, out=c)
        return np.add.reduce(c, axis=1, out=out)

    def _threshold(self, qword: np.ndarray, r: int, m: int) -> int:
        x = self.sample ^ qword
        d = np.bitwise_count(x) if x.ndim == 1 else np.bitwise_count(x).sum(1)
        d = np.sort(d, kind="stable")  # a radix sort for small integers
        return int(d[min(len(d) - 1, 3 * r * len(d) // max(1, m))])

    def _shard(self, s: int, qword: np.ndarray, r: int, b: dict):
        """(ids, distances) of the shard's r nearest codes, nearest first, ties by id."""
        lo, hi = self.shards[s]
        r = min(r, hi - lo)
        t = self._threshold(qword, r, hi - lo)
        ids, dist = [], []
        for a in range(lo, hi, SCAN_CHUNK):
            e = min(a + SCAN_CHUNK, hi)
            d = self._distances(self.words[a:e], qword, b, b["d"][:e - a])
            hit = np.flatnonzero(np.less_equal(d, t, out=b["mask"][:e - a]))
            if len(hit):
                ids.append(hit + a)
                dist.append(d[hit])
        ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        if len(ids) < r:  # the sampled threshold kept too few: keep every distance of the shard
            d = np.empty(hi - lo, np.uint8)
            for a in range(lo, hi, SCAN_CHUNK):
                self._distances(self.words[a:min(a + SCAN_CHUNK, hi)], qword, b, d[a - lo:a - lo + SCAN_CHUNK])
            ids = smallest(d, r, self.bits)
            return ids + lo, d[ids]
        dist = np.concatenate(dist)
        order = np.argsort(dist, kind="stable")[:r]
        return ids[order], dist[order]

    def search(self, qcode: np.ndarray, r: int) -> np.ndarray:
        """ids of the ``min(r, N)`` codes nearest to one packed query code (B,) uint8, nearest first."""
        if self.n == 0 or r < 1:
            return np.zeros(0, np.int64)
        qword = np.ascontiguousarray(qcode, dtype=np.uint8).reshape(-1).view(self.word)
        qword = qword[0] if self.words.ndim == 1 else qword
        b = self._scratch()
        if len(self.shards) == 1:
            return self._shard(0, qword, r, b[0])[0]
        pool = _pool(len(self.shards) - 1)
        futures = [pool.submit(self._shard, s, qword, r, b[s]) for s in range(1, len(self.shards))]
        parts = [self._shard(0, qword, r, b[0])] + [f.result() for f in futures]
        ids = np.concatenate([p[0] for p in parts])  # shard order = id order: a stable sort keeps ties by id
        return ids[np.argsort(np.concatenate([p[1] for p in parts]), kind="stable")[:r]]


def ivf_nlist(n: int) -> int:
    """Cells of the binary IVF structure for ``n`` codes: the power of two nearest sqrt(n) (1,024 at 1M)."""
    return int(2 ** round(np.log2(max(1.0, np.sqrt(max(n, 1))))))


class CompactBinaryIndex(VectorIndex):
    """Binary codes + float16 re-rank vectors behind the :class:`VectorIndex` interface."""

    def __init__(self, dim: int, hasher: Hasher, kind: str = "binary", rerank: int = DEFAULT_RERANK,
                 binary_index: str = "auto", **options):
        super().__init__(dim, **options)
        if hasher.dim != dim:
            raise InputError(f"the {hasher.name} hasher expects {hasher.dim}-d vectors, the index has {dim}-d")
        if int(rerank) < 1:
            raise InputError(f"rerank (candidates re-ranked in float) must be >= 1, got {rerank}")
        if binary_index not in ("auto", "flat", "hnsw", "mih", "ivf"):
            raise InputError(f"binary_index must be auto, flat, hnsw, mih or ivf, got {binary_index!r}")
        threads = options.get("threads", 1)
        if not isinstance(threads, int) or threads < 1:
            raise InputError(f"threads (cores the Hamming scan is split over) must be an integer >= 1, got {threads!r}")
        self.kind = kind
        self.hasher = hasher
        self.bits = int(hasher.bits)
        self.rerank = int(rerank)
        self.binary_index = binary_index
        self.codes = np.zeros((0, self.bits // 8), np.uint8)
        self.vectors16 = np.zeros((0, dim), np.float16)
        self._vectors16_t = None  # torch view of vectors16 (no copy) for the re-rank gather
        self.index = None
        self.scan: Optional[HammingScan] = None  # the flat structure's search (numpy), see HammingScan
        self.structure = ""

    # -- building ---------------------------------------------------------------------------
    def _structure_for(self, n: int) -> str:
        if self.binary_index != "auto":
            return self.binary_index
        return "flat" if n <= FLAT_MAX else "hnsw"

    def _make_binary(self, codes: np.ndarray):
        faiss = _faiss()
        self.structure = self._structure_for(len(codes))
        if self.structure == "hnsw":
            index = faiss.IndexBinaryHNSW(self.bits, int(self.options.get("M", 16)))
            index.hnsw.efConstruction = int(self.options.get("ef_construction", 64))
            index.hnsw.efSearch = max(int(self.options.get("ef_search", 0)), self.rerank)
        elif self.structure == "mih":
            nhash = int(self.options.get("nhash", max(1, self.bits // 16)))
            index = faiss.IndexBinaryMultiHash(self.bits, nhash, self.bits // nhash)
            index.nflip = int(self.options.get("nflip", 2))
        elif self.structure == "ivf":
            return self._make_ivf(codes)
        else:
            index = faiss.IndexBinaryFlat(self.bits)
        if len(codes):
            index.add(np.ascontiguousarray(codes))
        return index

    def _make_ivf(self, codes: np.ndarray):
        """``IndexBinaryIVF``: k-means cells of codes (Hamming k-means, trained on up to 100 codes per cell);
        a search scans the ``nprobe`` cells nearest to the query code instead of every code. Options:
        ``nlist`` (default: the power of two nearest sqrt(N), 1,024 at 1M) and ``nprobe`` (default 16)."""
        faiss = _faiss()
        n = len(codes)
        nlist = int(self.options.get("nlist", 0)) or ivf_nlist(n)
        nlist = max(1, min(nlist, n // 39 if n >= 39 else 1))  # FAISS wants >= 39 training codes per cell
        self._quantizer = faiss.IndexBinaryFlat(self.bits)  # held here: the IVF index does not own it
        index = faiss.IndexBinaryIVF(self._quantizer, self.bits, nlist)
        index.nprobe = int(self.options.get("nprobe", 16))
        if n:
            train = codes if n <= 100 * nlist else codes[np.random.default_rng(0).choice(n, 100 * nlist, replace=False)]
            index.train(np.ascontiguousarray(train))
            index.add(np.ascontiguousarray(codes))
        return index

    def _set_content(self, codes: np.ndarray, vectors: np.ndarray) -> None:
        self.codes = np.ascontiguousarray(codes, dtype=np.uint8)
        self.vectors16 = np.ascontiguousarray(vectors, dtype=np.float16)
        self.index = self._make_binary(self.codes)
        self.scan = HammingScan(self.codes, self.bits, self.options.get("threads", 1)) \
            if self.structure == "flat" else None
        self.ntotal = len(self.codes)

    def build(self, vectors: np.ndarray) -> None:
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise InputError(f"expected ({'N'}, {self.dim}) vectors, got {vectors.shape}")
        codes = np.concatenate([self.hasher.encode(vectors[i:i + 65536]) for i in range(0, len(vectors), 65536)]) \
            if len(vectors) else np.zeros((0, self.bits // 8), np.uint8)
        self._set_content(codes, vectors)

    # -- searching --------------------------------------------------------------------------
    def candidates(self, queries: np.ndarray, r: int) -> np.ndarray:
        """(Q, r) ids of the ``r`` nearest codes by Hamming distance (-1 where fewer exist)."""
        qcodes = self.hasher.encode(np.asarray(queries, np.float32))
        r = max(1, min(int(r), self.ntotal))
        if self.scan is not None:
            return np.stack([self.scan.search(c, r) for c in qcodes]) if len(qcodes) else np.zeros((0, r), np.int64)
        _, ids = self.index.search(np.ascontiguousarray(qcodes), r)
        return ids

    def search(self, queries, k):
        queries = np.ascontiguousarray(np.atleast_2d(queries), dtype=np.float32)
        if queries.shape[1] != self.dim:
            raise InputError(f"query vectors must have {self.dim} values, got {queries.shape[1]}")
        k = max(1, int(k))
        scores = np.full((len(queries), k), -np.inf, np.float32)
        out = np.full((len(queries), k), -1, np.int64)
        if self.ntotal == 0:
            return scores, out
        cand = self.candidates(queries, max(k, self.rerank))
        for qi, row in enumerate(cand):
            row = row[row >= 0]
            s = np.einsum("ij,j->i", self.gather_f32(row), queries[qi])  # see gather_f32
            top = np.argsort(-s, kind="stable")[:k]
            scores[qi, :len(top)] = s[top]
            out[qi, :len(top)] = row[top]
        return scores, out

    def gather_f32(self, rows: np.ndarray) -> np.ndarray:
        """``vectors16[rows]`` as float32: the same values as ``vectors16[rows].astype(np.float32)`` (float16 ->
        float32 is exact), gathered and converted by torch, whose vectorised half -> float conversion takes
        0.5 ms on 1000 x 512 candidates against 1.6 ms for numpy's. The inner products that follow use einsum
        on the calling thread: a BLAS matrix-vector product spreads over threads and cost 2-13 ms on a loaded
        machine; einsum's sums differ from BLAS's only in rounding (<= 1e-6)."""
        t = self._vectors16_t
        if t is None or t.data_ptr() != self.vectors16.ctypes.data or len(t) != len(self.vectors16):
            if not len(self.vectors16):
                return self.vectors16[rows].astype(np.float32)
            with warnings.catch_warnings():  # a read-only (e.g. memory-mapped) array: only read here
                warnings.simplefilter("ignore", UserWarning)
                t = self._vectors16_t = torch.from_numpy(self.vectors16)
        return t.index_select(0, torch.from_numpy(np.ascontiguousarray(rows, np.int64))).float().numpy()

    # -- persistence ------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        folder = Path(folder)
        _atomic_save_npy(folder / CODES_FILE, self.codes)
        meta = {"kind": self.kind, "bits": self.bits, "count": int(self.ntotal), "hasher": self.hasher.identity()}
        _atomic_write_text(folder / CODES_META, json.dumps(meta, indent=1))

    def load(self, folder: Path, vectors: np.ndarray) -> None:
        """Restore the codes saved with the index; re-encode when they are absent or were made by
        another hasher (e.g. a retrained checkpoint). A damaged codes file raises IndexLoadError."""
        folder = Path(folder)
        path, meta_path = folder / CODES_FILE, folder / CODES_META
        if not path.exists() or not meta_path.exists():
            return self.build(vectors)
        try:
            meta = json.loads(meta_path.read_text())
            codes = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise IndexLoadError(f"the binary codes file {path} is damaged ({exc}); rebuild the index") from None
        if meta.get("hasher") != self.hasher.identity() or int(meta.get("bits", -1)) != self.bits:
            return self.build(vectors)  # codes from another hash head: stale, re-encode
        if codes.dtype != np.uint8 or codes.ndim != 2 or codes.shape != (len(vectors), self.bits // 8):
            raise IndexLoadError(
                f"{path} holds codes of shape {codes.shape}, expected ({len(vectors)}, {self.bits // 8}); "
                "rebuild the index")
        self._set_content(codes, vectors)

    # -- reporting --------------------------------------------------------------------------
    def bytes_per_item(self) -> float:
        return self.bits / 8.0

    def describe(self) -> dict:
        return {
            "type": self.kind,
            "items": int(self.ntotal),
            "bits": self.bits,
            "bytes_per_item": self.bits / 8.0,
            "bytes_per_item_with_rerank_vectors": self.bits / 8.0 + 2.0 * self.dim,
            "float32_bytes_per_item": 4.0 * self.dim,
            "rerank": self.rerank,
            "binary_index": self.structure or self._structure_for(self.ntotal),
            "hasher": self.hasher.identity(),
        }


class LSHIndex(CompactBinaryIndex):
    """The same compact index with untrained random-projection codes (comparison baseline)."""

    def __init__(self, dim: int, bits: int = 64, seed: int = 0, **options):
        super().__init__(dim, LSHHasher(dim, bits, seed), kind=f"lsh-{bits}", **options)


def find_ics_checkpoints(bits: int, checkpoint_dir=None, fingerprint: Optional[str] = None,
                         dim: Optional[int] = None) -> list:
    """[(path, record)] of the ``bits``-bit ICS heads on the search path (engine.checkpoints) made for
    ``fingerprint`` and ``dim``, best first (search-path position, then file name). Files are named
    ``ics-<K>-<backbone slug>.safetensors``; the older ``ics-<K>.safetensors`` is still read."""
    return find("ics", fingerprint, checkpoint_dir, dim=dim, bits=int(bits))


def make_ics_index(bits: int, dim: int, n: int = 0, checkpoint_dir=None, fingerprint: Optional[str] = None,
                   rerank: int = DEFAULT_RERANK, **options) -> CompactBinaryIndex:
    """Factory behind ``ics-<bits>``: loads the ICS head for the backbone found by the checkpoint layer
    (CheckpointError when missing, damaged, made for another backbone fingerprint or embedding size)."""
    folder = checkpoint_dir or None  # None: the checkpoint layer's search path
    found = find_ics_checkpoints(bits, folder, fingerprint, dim)
    if not found:
        others = find_ics_checkpoints(bits, folder, None, None)
        if others:  # load one to say why it does not fit (other backbone / size)
            load_ics(others[0][0], fingerprint=fingerprint, dim=dim)
        raise CheckpointError(
            f"index type ics-{bits} needs a trained hash head ics-{bits}-<backbone>.safetensors for this backbone "
            f"in {describe_search_path(folder)}, which is missing; {part('ics').train_hint(bits=bits)} (docs/ics.md), "
            "or pick another index type"
        )
    path = found[0][0]
    model = load_ics(path, fingerprint=fingerprint, dim=dim)
    if model.bits != bits:
        raise CheckpointError(f"{path.name} holds a {model.bits}-bit hash head, not {bits} bits")
    options.pop("gpu", None)
    return CompactBinaryIndex(dim, model, kind=f"ics-{bits}", rerank=rerank, **options)


def available_ics_types(checkpoint_dir=None, fingerprint: Optional[str] = None, dim: Optional[int] = None) -> list:
    """The ``ics-K`` index types whose checkpoint exists and fits this backbone (fingerprint, embedding size)."""
    folder = checkpoint_dir or None  # None: the checkpoint layer's search path
    return [f"ics-{bits}" for bits in SUPPORTED_BITS if find_ics_checkpoints(bits, folder, fingerprint, dim)]


def _register() -> None:
    for bits in SUPPORTED_BITS:
        name = f"ics-{bits}"
        if name not in VECTOR_INDEXES:
            VECTOR_INDEXES.register(name)(lambda dim, n=0, _b=bits, **o: make_ics_index(_b, dim, n, **o))


_register()
