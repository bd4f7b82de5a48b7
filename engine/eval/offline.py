"""`python -m engine eval offline`: the offline benchmark suite, assembled from packages that install
here, evaluated with the packaged backbone (and with open_clip weights when they are cached), written to
docs/RESULTS.md with plots under docs/img/.

Protocol (composed retrieval, set ``cir``, split ``test``): every query is ranked against the gallery
records of its own ``gallery`` (twemoji or photos) in the test gallery split, the reference image
excluded; a query counts as a hit at K when any of its targets is in the top K (Recall@K, in percent).
Expansion re-ranks with the expander over the first nQE results (reference still excluded).
Nothing is tuned on the test split: checkpoints are chosen on validation splits by their trainers.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch

from ..backbones import create_backbone
from ..backbones.openclip import DEFAULT_ARCH, DEFAULT_TAG, pretrained_cached
from ..checkpoints import search_path
from ..config import ROOT, Settings
from ..process import configure_process
from ..defaults import engine_defaults
from ..fileio import atomic_write_text
from ..index.vectors import create_vector_index
from ..registry import Registry
from ..reports import merge_sections
from . import concepts, edits, expansion, gallery_queries, generalise
from .cir import (KS, available_expanders, cir_composers, cir_tensors, compose_queries, group_density, query_texts,
                  rank_queries, reads_text,
                  recall)
from .record import write_run_record

# the sections after the composed-retrieval tables: name -> function(args, ctx) -> (markdown, data)
OFFLINE_SECTIONS = Registry("offline section")
OFFLINE_SECTIONS.register("query-expansion")(expansion.offline_section)
OFFLINE_SECTIONS.register("backbone-versions")(concepts.offline_section)
OFFLINE_SECTIONS.register("generalise")(generalise.offline_section)
OFFLINE_SECTIONS.register("edits-seen")(edits.offline_section)
OFFLINE_SECTIONS.register("gallery-queries")(gallery_queries.offline_section)


def evaluate_cir(backbone, settings: Settings, split: str = "test", nqe: int = 0, ics_type: str = "ics-64",
                 ics_rerank: int = 64):
    """Recall@K of every available composer, with and without each expander (``nqe`` 0: each expander at
    the page defaults for its gallery, engine.defaults)."""
    nqe_note, floor = f"nQE = {nqe} for every expander, no floor", None
    d = engine_defaults(backbone, settings)
    if not nqe:
        chosen = ", ".join(f"{k} {v} (floor {d.floor_for(k):g})" for k, v in sorted(d.nqe.items())) or \
            f"{d.nqe_for('any')} for every expander"
        nqe, floor = d.gallery_nqe, d.floor_for
        nqe_note = f"nQE at the page defaults ({chosen}; at most {d.nqe_fraction:.0%} of the gallery)"

    queries, gallery, gemb, pos = cir_tensors(backbone, split)
    ref_emb = torch.from_numpy(gemb[[pos[q["reference"]] for q in queries]])
    composers, skipped = cir_composers(backbone, settings)
    expanders = available_expanders(backbone, settings, skipped)
    ics = None
    try:
        ics = create_vector_index(ics_type, backbone.embed_dim, len(gemb), checkpoint_dir=search_path(settings),
                                  fingerprint=backbone.fingerprint, rerank=ics_rerank)
        ics.build(gemb)
    except Exception as exc:  # no checkpoint for this backbone: flat index only
        skipped[f"index {ics_type}"] = str(exc)
        ics = None
    results, kinds = {}, sorted({q["kind"] for q in queries})
    kind_of = np.array([q["kind"] for q in queries])
    timings = {}
    all_vecs = compose_queries(backbone, composers, queries, ref_emb, timings)
    texts = query_texts(backbone, queries) if reads_text(expanders) else None  # for text-conditioned LAttQE
    density = group_density(gallery, gemb)  # each method ranked with the page's hub correction (engine.index.hubs)
    hub_note = ", ".join(f"{n} {d.hub_weight_for(n):g}" for n in all_vecs if d.hub_weight_for(n)) or "none"
    for name, qvecs in all_vecs.items():
        ranks = rank_queries(qvecs, queries, gallery, gemb, pos, expanders, nqe=nqe, floor=floor, density=density,
                             hub=d.hub_weight_for(name), texts=texts)
        if ics is not None:  # the compact index: Hamming short-list of R, then exact re-rank
            _, short = ics.search(qvecs, ics_rerank)
            ranks[f"none @ {ics.kind} (R={ics_rerank})"] = rank_queries(qvecs, queries, gallery, gemb, pos,
                                                                        restrict=short)["none"]
        for ex, r in ranks.items():
            results[(name, ex)] = {"all": recall(r), **{k: recall(r[kind_of == k]) for k in kinds},
                                   "ranks": r}
    return {"results": results, "skipped": skipped, "kinds": kinds, "n_queries": len(queries),
            "n_gallery": len(gallery), "compose_ms": timings, "queries": queries, "gemb": gemb, "nqe_note": nqe_note,
            "hub_note": hub_note}


def recall_curve_png(results, path: Path, expander: str = "none"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = np.arange(1, 51)
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    for (name, ex), r in results.items():
        if ex != expander:
            continue
        ax.plot(ks, [100.0 * np.mean(r["ranks"] <= k) for k in ks], label=name)
    ax.set_xlabel("K")
    ax.set_ylabel("Recall@K (%)")
    ax.set_title("Offline composed retrieval (test split)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def cir_markdown(ev, backbone, img_rel: str) -> str:
    res = ev["results"]
    lines = [f"Backbone `{backbone.fingerprint}`; {ev['n_queries']} test queries, {ev['n_gallery']} gallery "
             "images (twemoji and photos galleries ranked separately, reference excluded). Rows `@ ics-K` use "
             "the compact ICS index: Hamming short-list of R candidates, then exact re-rank. Expanders: "
             f"{ev.get('nqe_note', '')}. Hub correction weights (`engine.index.hubs`, the page's): "
             f"{ev.get('hub_note', 'none')}.", "",
             "| composer | expansion | " + " | ".join(f"R@{k}" for k in KS) + " |",
             "|---|---|" + "---|" * len(KS)]
    best = max(r["all"]["R@10"] for r in res.values())
    for (name, ex), r in sorted(res.items(), key=lambda kv: (kv[0][0], kv[0][1] != "none", kv[0][1])):
        cells = [f"{r['all'][f'R@{k}']:.1f}" for k in KS]
        if r["all"]["R@10"] == best:
            cells[2] = f"**{cells[2]}**"
        lines.append(f"| {name} | {ex} | " + " | ".join(cells) + " |")
    lines += ["", "Recall@10 per query kind (no expansion):", "",
              "| composer | " + " | ".join(ev["kinds"]) + " |", "|---|" + "---|" * len(ev["kinds"])]
    for (name, ex), r in sorted(res.items()):
        if ex == "none":
            lines.append(f"| {name} | " + " | ".join(f"{r[k]['R@10']:.1f}" for k in ev["kinds"]) + " |")
    if ev["skipped"]:
        lines += ["", "Not evaluated: " + "; ".join(f"{k} ({v})" for k, v in ev["skipped"].items())]
    lines += ["", f"![Recall@K]({img_rel})"]
    base = {n: r["all"]["R@10"] for (n, e), r in res.items() if e == "none" and n in ("image", "text", "sum")}
    learned = {n: r["all"]["R@10"] for (n, e), r in res.items() if e == "none" and n not in base}
    if base and learned:
        top_base = max(base, key=base.get)
        for n, v in learned.items():
            verdict = "beats" if v > base[top_base] else "does **not** beat"
            lines.append(f"\n- {n} ({v:.1f} R@10) {verdict} the best training-free baseline, {top_base} "
                         f"({base[top_base]:.1f}).")
    return _relative("\n".join(lines))


def _relative(text: str) -> str:
    """Docs never carry this machine's absolute paths."""
    return text.replace(str(ROOT) + "/", "").replace(str(ROOT), ".")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine eval offline")
    p.add_argument("--backbone", default="packaged")
    p.add_argument("--device", default="auto")
    p.add_argument("--nqe", type=int, default=0, help="neighbours used by the expanders in the CIR table (0: the "
                   "page defaults, chosen on validation and capped by the gallery size)")
    p.add_argument("--only", default="", help="re-measure only these sections (the others in --out are kept): "
                   "cir," + ",".join(OFFLINE_SECTIONS))
    p.add_argument("--out", default=str(ROOT / "docs" / "RESULTS.md"))
    p.add_argument("--record", default="", help="also write a JSON run record here")
    p.add_argument("--no-expanders", action="store_true", help="the generalise section without its expander table "
                   "(every expander with every method: the longest part of the run)")
    args = p.parse_args(argv)
    sections = [s for s in args.only.split(",") if s] or ["cir", *OFFLINE_SECTIONS]
    unknown = [s for s in sections if s != "cir" and s not in OFFLINE_SECTIONS]
    if unknown:
        p.error(f"unknown section {', '.join(unknown)}; choose from cir, {', '.join(OFFLINE_SECTIONS)}")

    t0 = time.time()
    settings = Settings()
    configure_process(settings)
    backbone = create_backbone(args.backbone, args.device, settings=settings)
    backbones = [backbone]

    try:
        if args.backbone == "packaged" and pretrained_cached(DEFAULT_ARCH, DEFAULT_TAG):
            backbones.append(create_backbone(f"open_clip:{DEFAULT_ARCH}/{DEFAULT_TAG}", args.device))
    except Exception:
        pass
    out = Path(args.out)
    img_dir = out.parent / "img"
    parts = ["# Results\n\nProduced by `python -m engine eval offline` (not written by hand); each section "
             "gives the date it was measured, and `--only X` re-measures section X and keeps the others. Data: "
             "the offline sets of `docs/data.md`, assembled from packages that install offline with fixed seeds; "
             "splits never share an image. Where a learned method loses to a baseline, the table says so.\n\n"
             "Hashing (mAP of ICS against LSH, ITQ-style PCA hashing and float embeddings at 16-128 bits, and "
             "recall of the compact index against exact search) is measured by `python -m engine bench --only "
             "ics`; see docs/ics.md."]

    def measured(since: float) -> str:
        return f"_Measured {time.strftime('%Y-%m-%d')} in {(time.time() - since) / 60:.1f} min on this machine._"

    record = {}
    if "cir" in sections:
        for b in backbones:
            print(f"[eval] composed retrieval with {b.name}", flush=True)
            t = time.time()
            ev = evaluate_cir(b, settings, nqe=args.nqe)
            slug = b.name.split(":")[0]
            png = img_dir / f"results_recall_{slug}.png"
            recall_curve_png(ev["results"], png)
            parts.append(f"## Composed retrieval ({b.name})\n\n{measured(t)}\n\n"
                         + cir_markdown(ev, b, f"img/{png.name}"))
            record[f"cir/{b.name}"] = {f"{n}+{e}": r["all"] for (n, e), r in ev["results"].items()}
    for name in sections:
        if name == "cir":
            continue
        fn = OFFLINE_SECTIONS.get(name)
        print(f"[eval] {name}", flush=True)
        t = time.time()
        md, data = fn(args, {"backbone": backbone, "settings": settings, "img_dir": img_dir})
        parts.append(f"## {name}\n\n{measured(t)}\n\n{md}")
        record[name] = data
    text = "\n\n".join(parts) + "\n"
    if out.exists() and args.only:  # re-measured sections only: keep the others as they are
        text = merge_sections(out.read_text(), parts[1:])

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, text)
    print(f"[eval] wrote {out} in {(time.time() - t0) / 60:.1f} min")
    if args.record:
        write_run_record(args.record, method="offline-suite", backbone_fingerprint=backbone.fingerprint,
                         checkpoint_hash="", template="", protocol_flags={"nqe": args.nqe}, metrics=record)
    return 0
