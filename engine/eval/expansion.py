"""Query-expansion section of `python -m engine eval offline`: mAP vs nQE on held-out classes."""
from __future__ import annotations

from ..checkpoints import search_path
from ..expand import EXPANDERS, ExpanderUnavailable
from .expanders import evaluate_expanders, format_table, labelled_features, plot_curves


def _lattqe_model(backbone, settings):
    try:
        return EXPANDERS.get("lattqe")(embed_dim=backbone.embed_dim, checkpoint_dir=search_path(settings),
                                       fingerprint=backbone.fingerprint).model
    except ExpanderUnavailable:
        return None


def offline_section(args, ctx):
    """mAP on the held-out classes of the offline labelled set (packaged embeddings) + mAP vs nQE plot."""

    backbone, settings = ctx["backbone"], ctx["settings"]
    feats, _ = labelled_features(["emoji", "photos"], backbone_name=getattr(args, "backbone", "packaged"),
                                 splits=("test",))
    x, y = feats["test"]
    model = _lattqe_model(backbone, settings)
    res = evaluate_expanders(x, y, model=model, nqe_list=(1, 2, 4, 8, 16, 32, 64, 128), n_queries=len(x))
    png = ctx["img_dir"] / "results_map_vs_nqe.png"
    plot_curves(res, png)
    best = {m: max(c.values()) for m, c in res["curves"].items() if c}
    lines = [f"Held-out classes of the labelled set (emoji + photos test classes): {res['n_items']} images, "
             f"{res['n_classes']} classes, every image queries the rest; mAP (0..1). No expansion: "
             f"**{res['none']:.3f}**.", "", format_table(res), "", f"![mAP vs nQE](img/{png.name})", ""]
    if model is None:
        lines.append("LAttQE was not evaluated: no checkpoint for this backbone.")
    beats = [m for m, v in best.items() if v > res["none"]]
    lines.append("Methods that beat no expansion at their best nQE: " + (", ".join(beats) if beats else "none") + ".")
    return "\n".join(lines), {"none": res["none"], "curves": res["curves"]}

