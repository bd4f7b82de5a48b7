"""Comparison hashers for ICS: random-projection LSH (SimHash) and ITQ-style PCA hashing.

Both share the :class:`engine.index.ics.Hasher` interface (``encode`` -> packed bits, ``identity``).
"""
from __future__ import annotations

import hashlib

import numpy as np

from ..errors import InputError
from .ics import Hasher, pack_bits


class LSHHasher(Hasher):
    """Sign of random Gaussian projections (SimHash): data-independent, untrained."""

    name = "lsh"

    def __init__(self, dim: int, bits: int, seed: int = 0):
        self.dim, self.bits, self.seed = dim, bits, seed
        self.projection = np.random.default_rng(seed).standard_normal((dim, bits)).astype(np.float32)

    def encode(self, vectors):
        return pack_bits(np.asarray(vectors, dtype=np.float32) @ self.projection >= 0)

    def identity(self):
        return f"lsh-{self.dim}-{self.bits}-{self.seed}"


class ITQHasher(Hasher):
    """ITQ-style PCA hashing: centre, project on the top-K principal axes, learn a rotation R that
    minimises ``||B - V R||_F`` by alternating ``B = sign(V R)`` and ``R = U W^T`` from the SVD
    ``V^T B = U S W^T`` (orthogonal Procrustes)."""

    name = "itq"

    def __init__(self, train: np.ndarray, bits: int, iterations: int = 50, seed: int = 0):
        x = np.asarray(train, dtype=np.float64)
        if bits > x.shape[1]:
            raise InputError(f"ITQ needs bits <= embedding size ({x.shape[1]}), got {bits}")
        self.dim, self.bits = x.shape[1], bits
        self.mean = x.mean(0)
        xc = x - self.mean
        _, _, vt = np.linalg.svd(xc, full_matrices=False)
        self.pca = vt[:bits].T
        v = xc @ self.pca
        rng = np.random.default_rng(seed)
        r, _ = np.linalg.qr(rng.standard_normal((bits, bits)))
        for _ in range(iterations):
            b = np.where(v @ r >= 0, 1.0, -1.0)
            u, _, wt = np.linalg.svd(v.T @ b)
            r = u @ wt
        self.rotation = r
        self.projection = (self.pca @ r).astype(np.float32)
        self.offset = (self.mean @ self.pca @ r).astype(np.float32)

    def encode(self, vectors):
        return pack_bits(np.asarray(vectors, dtype=np.float32) @ self.projection - self.offset >= 0)

    def identity(self):
        return "itq-" + hashlib.sha256(self.projection.tobytes()).hexdigest()[:16]
