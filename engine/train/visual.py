"""Fit the packaged backbone's visual channel (``python -m engine.train.visual``; docs/backbones.md).

The projection (mean + principal directions of the classifier's pooled features) is fitted on the
*training* classes of the offline labelled set; ``--choose`` picks the channel's share ``w`` by the mAP of
image-to-image retrieval on its *validation* classes (every image queries the rest). The test classes are
never read here. The result is written (atomically) beside the packaged backbone's text tables.
"""
from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

import numpy as np
import torch
from PIL import Image

from ..backbones.concepts import mix
from ..backbones.packaged import BRIDGES, PackagedBackbone
from ..backbones.visual import VisualChannel, fit_projection, projection_path
from ..config import Settings
from ..process import configure_process
from ..data.builders import ensure_built
from ..data.formats import image_path, load_split
from ..eval.metrics import average_precisions
from ..fileio import atomic_write_bytes
from ..eval.expanders import HELD_OUT_FILES

PARTS = ("emoji", "photos")
WEIGHTS = (0.0, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9)


def labelled_paths(split: str) -> Tuple[List[Path], np.ndarray]:
    ensure_built("labelled")
    paths, labels = [], []
    for part in PARTS:
        for name in HELD_OUT_FILES[split]:
            for r in load_split("labelled", name, part):
                paths.append(image_path("labelled", r["image"]))
                labels.append(f"{part}:{r['label']}")
    return paths, np.asarray(labels)


@torch.no_grad()
def pooled_and_bridge(backbone, paths: Sequence[Path], batch: int = 32) -> Tuple[np.ndarray, np.ndarray]:
    """(N, C) pooled classifier features and (N, text_dim) bridge embeddings of image files."""
    pooled, bridge = [], []
    for i in range(0, len(paths), batch):
        ims = []
        for p in paths[i : i + batch]:
            with Image.open(p) as im:
                ims.append(backbone.preprocess(im.convert("RGBA").convert("RGB")))
        class_part, scores, fmap = backbone.image_parts(torch.stack(ims))
        emb = mix(class_part, scores, backbone.concept_text, backbone.concepts) if scores else class_part
        pooled.append(fmap.mean(dim=(2, 3)).float().cpu())
        bridge.append(emb.float().cpu())
    return torch.cat(pooled).numpy(), torch.cat(bridge).numpy()


def leave_one_out_map(x: np.ndarray, labels: np.ndarray) -> float:
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    rel = labels[:, None] == labels[None, :]
    return float(np.nanmean(average_precisions(x @ x.T, rel, exclude=np.eye(len(x), dtype=bool))))


def choose_weight(channel: VisualChannel, pooled: np.ndarray, bridge: np.ndarray, labels: np.ndarray,
                  weights: Sequence[float] = WEIGHTS) -> Tuple[float, Dict[float, float]]:
    """The share ``w`` with the best validation mAP (ties: the smaller share, which changes less)."""
    scores = {}
    for w in weights:
        channel.weight = w
        emb = channel.join(torch.from_numpy(bridge), torch.from_numpy(pooled)).numpy()
        scores[w] = leave_one_out_map(emb, labels)
    best = max(weights, key=lambda w: (round(scores[w], 4), -w))
    return best, scores


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.train.visual", description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="lite0")
    ap.add_argument("--dim", type=int, default=128, help="size of the visual block")
    ap.add_argument("--out", type=Path, default=None, help="folder (default: the shipped assets folder)")
    ap.add_argument("--choose", action="store_true", help="also report the share w chosen on validation")
    ap.add_argument("--bridge", default="names", choices=BRIDGES, help="the class prompts of the bridge the "
                    "validation mAP is measured with (the projection does not depend on it)")
    args = ap.parse_args(argv)
    settings = Settings()  # the entry point's settings: the decode budget and the offline sets' sources
    configure_process(settings)
    backbone = PackagedBackbone(args.variant, visual=0.0, bridge=args.bridge)  # the bridge alone: the projection is fitted below
    paths, _ = labelled_paths("train")
    pooled, _ = pooled_and_bridge(backbone, paths)
    mean, comps = fit_projection(pooled, args.dim)
    buf = io.BytesIO()
    np.savez(buf, mean=mean, components=comps)
    out = projection_path(args.variant, args.out)
    atomic_write_bytes(out, buf.getvalue())
    print(f"fitted a {args.dim}-d visual projection on {len(paths)} training images -> {out.name}")
    if args.choose:
        vpaths, vlabels = labelled_paths("val")
        vpooled, vbridge = pooled_and_bridge(backbone, vpaths)
        channel = VisualChannel(torch.from_numpy(mean), torch.from_numpy(comps), 0.0, "")
        best, scores = choose_weight(channel, vpooled, vbridge, vlabels)
        print("validation classes, image-to-image mAP by share w: "
              + ", ".join(f"w={w:g}: {m:.4f}" for w, m in scores.items()) + f"; chosen w = {best:g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
