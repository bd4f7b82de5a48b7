"""Query-expansion sections of `python -m engine eval offline` and `python -m engine bench`."""
from __future__ import annotations

import numpy as np


def _lattqe_model(backbone, settings):
    from . import EXPANDERS, ExpanderUnavailable

    try:
        return EXPANDERS.get("lattqe")(embed_dim=backbone.embed_dim, checkpoint_dir=settings.checkpoints,
                                       fingerprint=backbone.fingerprint).model
    except ExpanderUnavailable:
        return None


def offline_section(args, ctx):
    """mAP on the held-out classes of the offline labelled set (packaged embeddings) + mAP vs nQE plot."""
    from ..train.lattqe import evaluate_expanders, format_table, labelled_features, plot_curves

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


def bench_section(args, ctx):
    """Added latency per query of each expander at k = 64 for 512-d embeddings, share of a whole query."""
    from ..search import search
    from ..train.lattqe import bench_expanders

    eng = ctx["engine"]
    times = []
    for i in range(10):
        times.append(search(eng, image=i, text="the same but red", method="sum").timings_ms["total"])
    e2e = float(np.median(times))
    res = bench_expanders(dim=512, k=64, n_gallery=10000, n_queries=100, end_to_end_ms=e2e)
    rows = [f"| {name} | {r['expand_ms']:.2f} | {r['second_search_ms']:.2f} | {r['added_ms']:.2f} | "
            f"{100 * r.get('share', float('nan')):.1f}% | {r['batched_qps']:.0f} |" for name, r in res.items()]
    md = "\n".join([
        f"512-d synthetic gallery of 10,000, nQE = 64, 100 queries; share = added / (end-to-end query without "
        f"expansion on the bundled gallery, p50 {e2e:.1f} ms, + added). Target for LAttQE: at most 20%. "
        "The paper reports about 250 queries/s for LAttQE on a Tesla M40 GPU.", "",
        "| expander | expand ms | second search ms | added ms | share of query | batched queries/s |",
        "|---|---|---|---|---|---|", *rows])
    return md, res
