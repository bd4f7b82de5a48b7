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
from typing import Dict, List, Optional

import numpy as np
import torch

from ..config import ROOT, Settings
from ..registry import Registry
from ..reports import merge_sections
from . import concepts, edits, expansion, gallery_queries, generalise
from .metrics import first_hit_ranks, recall_from_ranks

KS = (1, 5, 10, 50)
# the sections after the composed-retrieval tables: name -> function(args, ctx) -> (markdown, data)
OFFLINE_SECTIONS = Registry("offline section")
OFFLINE_SECTIONS.register("query-expansion")(expansion.offline_section)
OFFLINE_SECTIONS.register("backbone-versions")(concepts.offline_section)
OFFLINE_SECTIONS.register("generalise")(generalise.offline_section)
OFFLINE_SECTIONS.register("edits-seen")(edits.offline_section)
OFFLINE_SECTIONS.register("gallery-queries")(gallery_queries.offline_section)


def cir_tensors(backbone, split: str = "test"):
    """Queries, gallery records, gallery embeddings and reference features of the offline CIR set."""
    from ..data.features import embed_paths
    from ..data.builders import ensure_built
    from ..data.formats import image_path, load_split

    ensure_built("cir")  # the explicit build step (quick when built)
    queries = load_split("cir", split)
    gallery = load_split("cir", f"{split}_gallery")
    gemb = embed_paths(backbone, [image_path("cir", g["image"]) for g in gallery], desc=f"cir {split} gallery")
    pos = {g["image"]: i for i, g in enumerate(gallery)}
    return queries, gallery, gemb, pos


def reference_tokens(backbone, paths: List[Path], batch: int = 32) -> torch.Tensor:
    from ..images import load_image

    out = []
    with torch.no_grad():
        for i in range(0, len(paths), batch):
            x = torch.stack([backbone.preprocess(load_image(p)) for p in paths[i : i + batch]])
            out.append(backbone.encode_images_with_tokens(x)[1].cpu())
    return torch.cat(out)


def cir_composers(backbone, settings: Settings):
    """({name: composer} for every registered composer that loads for ``backbone`` plus the extra checkpoint
    variants, {name: why not} for the others)."""
    from ..compose import COMPOSERS, ComposerUnavailable

    composers, skipped = {}, {}
    for name in COMPOSERS:
        try:
            composers[name] = COMPOSERS.get(name)(backbone, checkpoint_dir=settings.checkpoints)
        except ComposerUnavailable as exc:
            skipped[name] = str(exc)
    composers.update(_variants(backbone, settings))
    return composers, skipped


def compose_queries(backbone, composers: dict, queries, ref_emb: torch.Tensor,
                    timings: Optional[dict] = None, ref_paths: Optional[List[Path]] = None,
                    trusts: Optional[dict] = None) -> Dict[str, np.ndarray]:
    """{composer name: query vectors (Q, D)} for the CIR ``queries`` (alpha 0.5), the reference embeddings
    ``ref_emb`` (Q, D) given; visual tokens are computed only when a composer needs them (Context-I2W), from
    ``ref_paths`` (default: the queries' references in the offline CIR set).
    ``timings``: filled with each composer's ms per query (the token extraction not counted); ``trusts``: filled
    with each anchored composer's share of the learned correction per query (its explanation's ``trust``)."""
    from ..compose import Query
    from ..data.formats import image_path

    tokens = None
    if any(getattr(c, "name", "") == "context-i2w" for c in composers.values()):
        if ref_paths is None:
            ref_paths = [image_path("cir", q["reference"]) for q in queries]
        unique = sorted({str(p) for p in ref_paths})  # each reference's tokens once, however many queries use it
        row = {p: i for i, p in enumerate(unique)}
        tokens = reference_tokens(backbone, [Path(p) for p in unique])[[row[str(p)] for p in ref_paths]]
    out = {}
    with torch.no_grad():
        for name, comp in composers.items():
            t = time.perf_counter()
            done = comp.compose_many([Query(text=q["text"], image_embedding=ref_emb[i], has_image=True, alpha=0.5,
                                            image_tokens=None if tokens is None else tokens[i])
                                      for i, q in enumerate(queries)])
            out[name] = np.stack([c.vector for c in done])
            if trusts is not None and any("trust" in c.explanation for c in done):  # (a routed method's may not be first)
                trusts[name] = np.array([float(c.explanation.get("trust", 0.0)) for c in done])
            if timings is not None:
                timings[name] = (time.perf_counter() - t) / len(queries) * 1e3
    return out


def rank_queries(qvecs: np.ndarray, queries, gallery, gemb, pos, expanders: Optional[dict] = None,
                 nqe=8, restrict: Optional[np.ndarray] = None, floor=None) -> Dict[str, np.ndarray]:
    """{expander name: best target rank per query (1-based)}; 'none' is the plain ranking.

    ``nqe``: the neighbours each expander averages, an int or ``nqe(expander name, candidates) -> int`` (the
    page defaults: ``EngineDefaults.gallery_nqe``); ``floor(expander name) -> float``: only neighbours at least
    that close to the query are averaged in, none that close keeps the query (``EngineDefaults.floor_for``).

    ``restrict`` (Q, R) gallery ids: only these candidates can be returned (a compact index's
    Hamming short-list); the others rank last."""
    groups = np.array([g["gallery"] for g in gallery])
    ranks = {name: np.zeros(len(queries), np.int64) for name in ["none", *(expanders or {})]}
    for qi, q in enumerate(queries):
        cand = np.flatnonzero(groups == q["gallery"])
        cand = cand[cand != pos[q["reference"]]]
        targets = {pos[t] for t in q["targets"]}
        vecs = gemb[cand]
        first = vecs @ qvecs[qi]
        if restrict is not None:
            first = np.where(np.isin(cand, restrict[qi]), first, -np.inf)
        for name in ranks:
            s = first
            if name != "none":
                k = nqe(name, len(cand)) if callable(nqe) else nqe
                order = np.argsort(-first, kind="stable")[:k]
                if floor is not None:
                    order = order[first[order] >= floor(name)]
                if len(order):
                    s = vecs @ expanders[name].expand(qvecs[qi], vecs[order], first[order]).vector
            r = first_hit_ranks(s[None], np.isin(cand, list(targets))[None])[0]
            ranks[name][qi] = int(r) + 1 if np.isfinite(r) else len(cand) + 1
    return ranks


def recall(ranks: np.ndarray, ks=KS) -> Dict[str, float]:
    """R@K (percent) from 1-based ranks, by the evaluation core (engine.eval.metrics)."""
    return recall_from_ranks(np.asarray(ranks) - 1, ks)


def available_expanders(backbone, settings: Settings, skipped: Optional[dict] = None) -> dict:
    """{name: expander} of every registered expander (but "none") available for ``backbone``; the others'
    reasons go into ``skipped`` as "expander NAME"."""
    from ..expand import EXPANDERS, ExpanderUnavailable

    out = {}
    for name in EXPANDERS:
        if name == "none":
            continue
        try:
            out[name] = EXPANDERS.get(name)(embed_dim=backbone.embed_dim, checkpoint_dir=settings.checkpoints,
                                            fingerprint=backbone.fingerprint)
        except ExpanderUnavailable as exc:
            if skipped is not None:
                skipped[f"expander {name}"] = str(exc)
    return out


def evaluate_cir(backbone, settings: Settings, split: str = "test", nqe: int = 0, ics_type: str = "ics-64",
                 ics_rerank: int = 64):
    """Recall@K of every available composer, with and without each expander (``nqe`` 0: each expander at
    the page defaults for its gallery, engine.defaults)."""
    from ..defaults import engine_defaults

    nqe_note, floor = f"nQE = {nqe} for every expander, no floor", None
    if not nqe:
        d = engine_defaults(backbone, settings)
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
        from ..index.vectors import create_vector_index

        ics = create_vector_index(ics_type, backbone.embed_dim, len(gemb), checkpoint_dir=settings.checkpoints,
                                  fingerprint=backbone.fingerprint, rerank=ics_rerank)
        ics.build(gemb)
    except Exception as exc:  # no checkpoint for this backbone: flat index only
        skipped[f"index {ics_type}"] = str(exc)
        ics = None
    results, kinds = {}, sorted({q["kind"] for q in queries})
    kind_of = np.array([q["kind"] for q in queries])
    timings = {}
    all_vecs = compose_queries(backbone, composers, queries, ref_emb, timings)
    for name, qvecs in all_vecs.items():
        ranks = rank_queries(qvecs, queries, gallery, gemb, pos, expanders, nqe=nqe, floor=floor)
        if ics is not None:  # the compact index: Hamming short-list of R, then exact re-rank
            _, short = ics.search(qvecs, ics_rerank)
            ranks[f"none @ {ics.kind} (R={ics_rerank})"] = rank_queries(qvecs, queries, gallery, gemb, pos,
                                                                        restrict=short)["none"]
        for ex, r in ranks.items():
            results[(name, ex)] = {"all": recall(r), **{k: recall(r[kind_of == k]) for k in kinds},
                                   "ranks": r}
    return {"results": results, "skipped": skipped, "kinds": kinds, "n_queries": len(queries),
            "n_gallery": len(gallery), "compose_ms": timings, "queries": queries, "gemb": gemb, "nqe_note": nqe_note}


def _variants(backbone, settings):
    """Extra checkpoints of registered composers to evaluate side by side (e.g. RTIC trained with GCN)."""
    from ..compose import ComposerUnavailable
    from ..compose.rtic import load_rtic_composer

    out = {}
    try:
        out["rtic+gcn"] = load_rtic_composer(backbone, settings.checkpoints, variant="rtic+gcn")
    except ComposerUnavailable:
        pass
    return out


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
             f"{ev.get('nqe_note', '')}.", "",
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
    args = p.parse_args(argv)
    sections = [s for s in args.only.split(",") if s] or ["cir", *OFFLINE_SECTIONS]
    unknown = [s for s in sections if s != "cir" and s not in OFFLINE_SECTIONS]
    if unknown:
        p.error(f"unknown section {', '.join(unknown)}; choose from cir, {', '.join(OFFLINE_SECTIONS)}")
    from ..backbones import create_backbone

    t0 = time.time()
    settings = Settings()
    backbone = create_backbone(args.backbone, args.device)
    backbones = [backbone]
    from ..backbones.openclip import pretrained_cached, DEFAULT_ARCH, DEFAULT_TAG

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
    from ..fileio import atomic_write_text

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, text)
    print(f"[eval] wrote {out} in {(time.time() - t0) / 60:.1f} min")
    if args.record:
        from .record import write_run_record

        write_run_record(args.record, method="offline-suite", backbone_fingerprint=backbone.fingerprint,
                         checkpoint_hash="", template="", protocol_flags={"nqe": args.nqe}, metrics=record)
    return 0
