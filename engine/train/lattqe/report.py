"""The LAttQE trainer's own report: the training history plot (the expander evaluation it also reports is
``engine.eval.expanders``)."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

from ...fileio import atomic_save_figure
from ...labels import expand_label


def plot_history(history: List[Dict], path) -> Path:
    """Training curves: loss per epoch and validation mAP per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ep = [h["epoch"] for h in history]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
    a.plot(ep, [h["loss"] for h in history], label="total")
    a.plot(ep, [h["contrastive"] for h in history], label="contrastive")
    a.plot(ep, [h["bce"] for h in history], label="aux BCE")
    a.set_xlabel("epoch")
    a.set_ylabel("training loss")
    a.set_yscale("log")
    a.legend(fontsize=8)
    b.plot(ep, [h["val_map"] for h in history], marker="o", ms=3, label="LAttQE")
    if history and "val_map_none" in history[0]:
        b.axhline(history[0]["val_map_none"], color="k", ls=":", label=expand_label("none"))
    if history and "val_map_aqe" in history[0]:
        b.axhline(history[0]["val_map_aqe"], color="gray", ls="--", label="AQE")
    b.set_xlabel("epoch")
    b.set_ylabel("validation mAP (nQE=64)")
    b.legend(fontsize=8)
    for ax in (a, b):
        ax.grid(alpha=0.3)
    return atomic_save_figure(fig, path)


# ============================================================================ training
