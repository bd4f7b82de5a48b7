"""The packaged backbone's visual channel: what a picture looks like, beside what its classes are called.

The class-name bridge places an image among the *names* of the ImageNet classes it resembles, so two photos
of one object kind meet only where the classifier names them alike (a blue sedan and a pair of pliers both
spread over "tool-like" names). The classifier's penultimate features (the pooled final feature map) keep
far more of the picture. The channel is those features, centred on the mean of a bank of training photos
and projected onto its principal directions (``mean``, ``components``), L2-normalised.

The image embedding is ``[sqrt(1 - w^2) * bridge ; w * visual]``: both blocks unit length, so every image
has the same share ``w`` in the visual block; a text embedding is ``[text ; 0]``. Hence text-to-image scores
are the bridge's scores times a constant (text-only rankings are unchanged), image-to-image scores add the
visual similarity, and a composed query keeps the reference's look as far as its image weight keeps it.
The projection is fitted by ``python -m engine.train.visual`` and shipped beside the text tables.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

SHIPPED = Path(__file__).resolve().parents[2] / "assets" / "prebuilt" / "packaged"


def projection_path(variant: str, folder: Optional[Path] = None) -> Path:
    return Path(folder or SHIPPED) / f"visual-{variant}.npz"


@dataclass
class VisualChannel:
    mean: torch.Tensor        # (C,)
    components: torch.Tensor  # (C, V)
    weight: float             # the visual block's share w in (0, 1)
    digest: str               # content hash of the projection (part of the backbone fingerprint)

    @property
    def dim(self) -> int:
        return int(self.components.shape[1])

    def project(self, pooled: torch.Tensor) -> torch.Tensor:
        """(B, C) pooled classifier features -> (B, V) unit-length visual channel."""
        z = (pooled.float() - self.mean.to(pooled.device)) @ self.components.to(pooled.device)
        return F.normalize(z, dim=-1)

    def join(self, bridge: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """(B, D) unit-length bridge + (B, C) pooled features -> (B, D + V) unit-length image embedding."""
        w = self.weight
        return torch.cat([(1 - w * w) ** 0.5 * bridge, w * self.project(pooled).to(bridge.dtype)], dim=-1)

    def tag(self) -> str:
        return f"visual-{self.digest}-w{self.weight:g}"


def load_channel(variant: str, weight: float, folder: Optional[Path] = None) -> Optional[VisualChannel]:
    """The shipped projection of ``variant`` (None when it has none, or ``weight`` is 0)."""
    path = projection_path(variant, folder)
    if weight <= 0 or not path.is_file():
        return None
    raw = path.read_bytes()
    with np.load(path, allow_pickle=False) as z:
        mean, comps = z["mean"].astype(np.float32), z["components"].astype(np.float32)
    if mean.ndim != 1 or comps.ndim != 2 or comps.shape[0] != mean.shape[0] or not np.isfinite(comps).all():
        raise ValueError(f"{path.name} is not a visual projection (mean (C,), components (C, V))")
    return VisualChannel(torch.from_numpy(mean), torch.from_numpy(comps), float(weight),
                         hashlib.sha256(raw).hexdigest()[:8])


def fit_projection(pooled: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and the ``dim`` leading principal directions (C, dim) of a bank of pooled features (N, C).
    Signs are fixed (largest-magnitude entry of each direction positive) so a refit is reproducible."""
    x = np.asarray(pooled, np.float64)
    mean = x.mean(0)
    cov = np.cov((x - mean).T)
    vals, vecs = np.linalg.eigh(cov)
    comps = vecs[:, ::-1][:, :dim]
    signs = np.sign(comps[np.abs(comps).argmax(0), np.arange(comps.shape[1])])
    return mean.astype(np.float32), (comps * signs).astype(np.float32)
