"""LAttQE training data: class-disjoint splits, label encoding, the offline labelled set's and
Fashion-MNIST's features, feature files (``--features``)."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

from ...data import fashion_mnist
from ...errors import InputError
from ...expand.base import l2n


def split_classes(labels: Sequence, val_frac: float = 0.3, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """Boolean masks (train, val) over items such that no class is in both (at least 1 class each)."""
    labels = np.asarray(labels)
    classes = np.unique(labels)
    if len(classes) < 2:
        raise InputError(f"need at least 2 classes to split train/validation, got {len(classes)}")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(classes)
    n_val = int(min(max(1, round(val_frac * len(classes))), len(classes) - 1))
    val_classes = perm[:n_val]
    val = np.isin(labels, val_classes)
    return ~val, val


def fashion_mnist_pca(dim: int = 64, per_class: int = 1000, val_classes: Sequence[int] = (7, 8, 9),
                      seed: int = 0) -> Tuple[np.ndarray, np.ndarray, str]:
    """Stand-in embeddings: Fashion-MNIST training pixels projected by PCA fit on the training
    classes only (``val_classes`` are held out). Files come from :mod:`engine.data.fashion_mnist`.

    Returns (embeddings (N, dim) L2-normalised, labels (N,), pseudo fingerprint).
    """
    images, y = fashion_mnist.load("train")
    rng = np.random.default_rng(seed)
    keep = np.sort(np.concatenate([rng.permutation(np.flatnonzero(y == c))[:per_class] for c in np.unique(y)]))
    x, y = images[keep].reshape(len(keep), -1).astype(np.float32) / 255.0, y[keep]
    fit = x[~np.isin(y, val_classes)]
    mean = fit.mean(0)
    _, _, vt = np.linalg.svd(fit - mean, full_matrices=False)
    emb = l2n((x - mean) @ vt[:dim].T)
    return emb.astype(np.float32), y, f"fashion-mnist-pixels-pca{dim}"


# ============================================================================ metrics


def load_features(path: Path) -> Tuple[Dict[str, Tuple[np.ndarray, np.ndarray]], str]:
    """An .npz with either 'embeddings' + 'labels' (one set, split by class here) or per-split
    '<split>_embeddings' + '<split>_labels' (as written by --save-features), plus 'fingerprint'."""
    try:
        with np.load(path, allow_pickle=False) as f:
            fp = str(f["fingerprint"]) if "fingerprint" in f.files else ""
            if "embeddings" in f.files:
                out = {"all": (f["embeddings"].astype(np.float32), f["labels"])}
            else:
                out = {s: (f[f"{s}_embeddings"].astype(np.float32), f[f"{s}_labels"])
                       for s in ("train", "val", "test") if f"{s}_embeddings" in f.files}
    except (OSError, KeyError, ValueError) as exc:
        raise InputError(f"{path.name}: expected an .npz with arrays 'embeddings', 'labels' "
                         f"(or train_/val_/test_ prefixed ones) and 'fingerprint' ({exc})") from exc
    if not out or ("all" not in out and not {"train", "val"} <= set(out)):
        raise InputError(f"{path.name}: no embeddings/labels (or train_ and val_ arrays) found")
    for name, (x, y) in out.items():
        if x.ndim != 2 or len(x) != len(y):
            raise InputError(f"{path.name}: {name} embeddings {x.shape} and labels {y.shape} do not match")
    return out, fp


def class_list(text: str, option: str) -> List[int]:
    try:
        out = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        out = []
    if not out or not all(0 <= c <= 9 for c in out):
        raise InputError(f"{option} takes Fashion-MNIST class numbers 0 to 9 separated by commas, got {text!r}")
    return out
