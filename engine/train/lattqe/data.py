"""LAttQE training data: class-disjoint splits, label encoding, the offline labelled set's and
Fashion-MNIST's features, feature files (``--features``)."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np

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


def encode_labels(labels: Sequence) -> np.ndarray:
    """Any labels -> int64 codes 0..C-1."""
    _, codes = np.unique(np.asarray(labels), return_inverse=True)
    return codes.astype(np.int64)


def fashion_mnist_pca(dim: int = 64, per_class: int = 1000, val_classes: Sequence[int] = (7, 8, 9),
                      seed: int = 0) -> Tuple[np.ndarray, np.ndarray, str]:
    """Stand-in embeddings: Fashion-MNIST training pixels projected by PCA fit on the training
    classes only (``val_classes`` are held out). Files come from :mod:`engine.data.fashion_mnist`.

    Returns (embeddings (N, dim) L2-normalised, labels (N,), pseudo fingerprint).
    """
    from ...data import fashion_mnist

    images, y = fashion_mnist.load("train")
    rng = np.random.default_rng(seed)
    keep = np.sort(np.concatenate([rng.permutation(np.flatnonzero(y == c))[:per_class] for c in np.unique(y)]))
    x, y = images[keep].reshape(len(keep), -1).astype(np.float32) / 255.0, y[keep]
    fit = x[~np.isin(y, val_classes)]
    mean = fit.mean(0)
    _, _, vt = np.linalg.svd(fit - mean, full_matrices=False)
    emb = l2n((x - mean) @ vt[:dim].T)
    return emb.astype(np.float32), y, f"fashion-mnist-pixels-pca{dim}"


HELD_OUT_FILES = {"train": ("train",), "val": ("val",), "test": ("query", "db")}


def labelled_features(parts: Sequence[str], backbone_name: str = "packaged", device: str = "auto",
                      splits: Sequence[str] = ("train", "val", "test"), max_per_class: int = 0, seed: int = 0,
                      ) -> Tuple[Dict[str, Tuple[np.ndarray, np.ndarray]], str]:
    """Embed the offline ``labelled`` set (parts e.g. emoji, photos, fmnist_small) with a backbone.

    Returns ({split: (embeddings, labels "part:label")}, backbone fingerprint). Splits are class
    disjoint; "test" is the held-out query + db files (parts without test classes are skipped there).
    ``max_per_class`` > 0 keeps at most that many random images per class and split.
    """
    import random

    from ...backbones import create_backbone
    from ...data.features import embed_paths
    from ...data.builders import ensure_built
    from ...data.formats import image_path, load_split

    ensure_built("labelled")  # the explicit build step (quick when built)
    backbone = create_backbone(backbone_name, device)
    out = {}
    for split in splits:
        paths, labels = [], []
        for part in parts:
            if split == "test" and part.startswith("fmnist"):
                continue  # Fashion-MNIST parts have train + val classes only (their query/db mix both)
            recs = [r for name in HELD_OUT_FILES[split] for r in load_split("labelled", name, part)]
            if max_per_class > 0:
                by: Dict[str, list] = {}
                for r in recs:
                    by.setdefault(str(r["label"]), []).append(r)
                rng = random.Random(f"{seed}:{part}:{split}")
                recs = [r for lab in sorted(by) for r in (by[lab] if len(by[lab]) <= max_per_class
                                                          else rng.sample(by[lab], max_per_class))]
            for r in recs:
                paths.append(image_path("labelled", r["image"]))
                labels.append(f"{part}:{r['label']}")
        if paths:
            x = embed_paths(backbone, paths, desc=f"embedding labelled {split}")
            out[split] = (np.asarray(x, np.float32), np.asarray(labels))
    return out, backbone.fingerprint


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
