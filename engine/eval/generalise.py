"""`python -m engine eval generalise`: the held-out-domain suite.

The offline CIR set's splits share sources, phrasings and category words with training, so its validation
rewards fitting that vocabulary. This suite is built only from what no trainer sees (``engine.data.heldout``):

* **images**: the real photographs of the held-out sources (GCompris, scikit-image / scikit-learn samples);
* **category changes** (kind ``category``): a photo + a template naming another thing of the side, whose
  words occur in no training text ("a cheetah instead"); targets: every photo of that thing on the side;
* **attribute edits** of the photos (kinds ``tint``: red / green / blue cast, ``bw``, ``night``, ``sepia``;
  ``engine.data.tone.photo_edit``): the photo + a phrasing -> its own edited version, in a gallery of every
  photo in every version, so the photo's other versions are the hardest negatives;
* **phrasings** from templates no trainer uses (checked against every training text);
* **open-vocabulary kinds** (``engine.eval.generalise_open``): ``compositional``, ``colour-new``, ``light``,
  ``undo`` and ``rephrased``, in the words and templates of the open-vocabulary set's side of the same name
  (``engine.data.open_vocab``; trainers see only its train side), in a gallery of their own (``open``).

Two sides, ``val`` and ``test``, disjoint by photo, by category word (a thing's photos all fall on one side)
and by template. Every recipe, checkpoint, the default method and the expansion defaults are chosen on
``val`` (``--choose``); ``test`` is read once, after. Figures: R@1 / R@10 (%) per method and query kind
with 95 % bootstrap intervals (1,000 resamples of the queries); the reference is always left out.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..backbones import create_backbone
from ..checkpoints import PARTS
from ..compose import COMPOSERS
from ..compose.auto import (MEMBERS, choose_routes, cross_fitted_score, overall_of_ranks, routed_vectors,
                           router_of)
from ..data.features import embed_paths, embed_texts
from ..config import Settings
from ..process import configure_process
from ..data.formats import image_path, load_split
from ..data.heldout import is_held_out, words
from ..data.rules import unit_hash
from ..data.tone import edited_file
from ..data.vocabulary import training_texts, training_vocabulary
from ..index import hubs
from ..defaults import EngineDefaults, engine_defaults, gallery_nqe, write_defaults
from .cir import (available_expanders, cir_composers, compose_queries, group_density, hub_grid_ranks, query_texts,
                  rank_queries)
from .expander_offer import overall_change, queries_changed, texts_of
from .generalise_open import open_queries
from .hubness import hubness
from .metrics import recall_from_ranks

SIDES = ("val", "test")
SEED = 0
KS = (1, 10)
EDITS = ("tint-red", "tint-green", "tint-blue", "bw", "night", "sepia")
OLD_KINDS = ("category", "tint", "bw", "night", "sepia")
KINDS = (*OLD_KINDS, "compositional", "colour-new", "light", "undo", "rephrased")
# names that are no thing to look for (colours, numbers, letters, generic words)
NOT_A_THING = frozenset({"animal", "color", "colour", "gray", "grey", "mauve", "sixteen", "zero", "reptile",
                         "f", "sea", "monument"})
CATEGORY_TEMPLATES = {
    "val": ("{} instead", "show me {} instead", "replace it with {}"),
    "test": ("swap it for {}", "the same sort of picture, but of {}", "now make it {}"),
}
ATTRIBUTE_TEMPLATES = {
    "val": {"tint": ("give it a {c} tint", "with a {c} colour cast"),
            "bw": ("make it monochrome", "in greyscale"),
            "night": ("as if taken after dark", "make it a nighttime shot"),
            "sepia": ("in sepia tones", "like an old sepia print")},
    "test": {"tint": ("bathed in {c} light", "seen through a {c} filter"),
             "bw": ("drained of all colour", "as a grayscale picture"),
             "night": ("after sunset, in the dark", "the same view by night"),
             "sepia": ("with a brownish vintage sepia look", "as an old-fashioned sepia photograph")},
}


def kind_of_edit(edit: str) -> str:
    return "tint" if edit.startswith("tint-") else edit


def _with_article(name: str) -> str:
    if name.endswith("s") and not name.endswith("ss"):
        return name
    return ("an " if name[0] in "aeiou" else "a ") + name


@dataclass
class Suite:
    side: str
    queries: List[dict]                 # id, kind, edit, reference, text, targets, gallery (ids as below)
    items: Dict[str, Path]              # gallery item id ("<gallery>:<file>") -> image file
    galleries: Dict[str, List[str]] = field(default_factory=dict)   # gallery name -> item ids

    def summary(self) -> dict:
        kinds: Dict[str, int] = {}
        for q in self.queries:
            kinds[q["kind"]] = kinds.get(q["kind"], 0) + 1
        return {"side": self.side, "queries": len(self.queries), "by_kind": kinds,
                "gallery": {g: len(v) for g, v in self.galleries.items()}}


def held_out_photos(seed: int = SEED) -> List[dict]:
    """[{image (Path), name, group, source, side}] of every held-out photo, with its suite side."""
    vocab = training_vocabulary()
    out = []
    for split in ("train", "val", "test"):
        for rec in load_split("captions", split):
            if not is_held_out(rec.get("source", "")):
                continue
            name = rec["caption"].split(",")[0].strip().lower().rstrip(".")
            novel = bool(words(name)) and not (words(name) & vocab) and name not in NOT_A_THING and len(name) > 2
            key = f"name:{name}" if novel else rec["group"]
            side = "val" if unit_hash(seed, f"generalise:{key}") < 0.5 else "test"
            out.append({"image": image_path("captions", rec["image"]), "name": name if novel else None,
                        "group": rec["group"], "source": rec["source"], "side": side})
    return sorted(out, key=lambda r: str(r["image"]))


# the offline sets the suite is made from: the held-out photos and their names (captions), the training
# vocabulary it must avoid (cir, captions, and the open-vocabulary set's train words)
SUITE_SETS = ("captions", "cir")


def build_suite(side: str, seed: int = SEED, edit_root=None) -> Suite:
    """The ``side`` half of the suite (edited versions written once under the cache, like the tone edits)."""
    from ..data.builders import ensure_built

    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}")
    ensure_built(*SUITE_SETS)  # the explicit build step of everything that reads the suite (quick when built)
    photos = [p for p in held_out_photos(seed) if p["side"] == side]
    rng = np.random.default_rng([seed, SIDES.index(side)])
    items: Dict[str, Path] = {}
    galleries: Dict[str, List[str]] = {"category": [], "attribute": [], "open": []}

    def add(gallery: str, path: Path) -> str:
        key = f"{gallery}:{path}"
        if key not in items:
            items[key] = Path(path)
            galleries[gallery].append(key)
        return key

    queries: List[dict] = []
    # category changes: every photo to two other things of the side
    by_name: Dict[str, List[Path]] = {}
    for p in photos:
        add("category", p["image"])
        if p["name"]:
            by_name.setdefault(p["name"], []).append(p["image"])
    names = sorted(by_name)
    templates = CATEGORY_TEMPLATES[side]
    for i, p in enumerate(photos):
        others = [n for n in names if n != p["name"]]
        for j, n in enumerate(rng.choice(others, size=min(2, len(others)), replace=False) if others else []):
            text = templates[(2 * i + j) % len(templates)].format(_with_article(str(n)))
            queries.append({"id": f"{side}:category:{i}:{j}", "kind": "category", "edit": "", "text": text,
                            "reference": f"category:{p['image']}", "gallery": "category",
                            "targets": [f"category:{t}" for t in by_name[str(n)]]})
    # attribute edits: every photo to each of its edited versions
    attr = ATTRIBUTE_TEMPLATES[side]
    for i, p in enumerate(photos):
        ref = add("attribute", p["image"])
        for edit in EDITS:
            kind = kind_of_edit(edit)
            target = add("attribute", edited_file(p["image"], edit, edit_root))
            phrasing = attr[kind][i % len(attr[kind])]
            text = phrasing.format(c=edit.split("-", 1)[-1]) if kind == "tint" else phrasing
            queries.append({"id": f"{side}:{edit}:{i}", "kind": kind, "edit": edit, "text": text,
                            "reference": ref, "gallery": "attribute", "targets": [target]})
    queries += open_queries(side, photos, add, edit_root, seed)
    seen = training_texts()
    clash = sorted({q["text"] for q in queries if q["text"].strip().lower() in seen})
    if clash:
        raise ValueError(f"suite phrasings used in training: {clash[:3]}")
    return Suite(side, queries, items, galleries)


# -- evaluation ------------------------------------------------------------------------------------------------


def bootstrap_interval(hits: np.ndarray, n: int = 1000, seed: int = 0) -> tuple:
    """95 % percentile interval (in %) of the mean of ``hits`` (0/1 per query) over ``n`` resamples."""
    hits = np.asarray(hits, dtype=np.float32)
    if len(hits) == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = hits[rng.integers(0, len(hits), size=(n, len(hits)))].mean(axis=1) * 100.0
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def summarise(ranks: np.ndarray, kinds: np.ndarray, ks: Sequence[int] = KS) -> dict:
    """{kind or "all": {"R@K": value, "R@K_ci": (lo, hi), "n": queries}} from 1-based ranks."""
    out = {}
    for kind in ["all", *KINDS]:
        sel = np.ones(len(ranks), bool) if kind == "all" else kinds == kind
        if not sel.any():
            continue
        row = {"n": int(sel.sum())}
        for k in ks:
            hits = ranks[sel] <= k
            row[f"R@{k}"] = float(hits.mean() * 100.0)
            row[f"R@{k}_ci"] = bootstrap_interval(hits)
        out[kind] = row
    out["overall"] = overall_score(out)
    return out


def overall_score(by_kind: dict) -> float:
    """One number per method: the mean over the query kinds of (R@1 + R@10) / 2, each kind weighing the same."""
    vals = [(by_kind[k]["R@1"] + by_kind[k]["R@10"]) / 2 for k in KINDS if k in by_kind]
    return float(np.mean(vals)) if vals else float("nan")


def suite_tensors(backbone, suite: Suite):
    """(gallery records, embeddings, item id -> row, reference embeddings, reference paths) of one side."""

    keys = list(suite.items)
    files = sorted({str(suite.items[k]) for k in keys})
    emb = embed_paths(backbone, files, desc=f"generalise {suite.side}")
    row_of_file = {f: i for i, f in enumerate(files)}
    gemb = emb[[row_of_file[str(suite.items[k])] for k in keys]]
    gallery = [{"image": k, "gallery": k.split(":", 1)[0]} for k in keys]
    pos = {k: i for i, k in enumerate(keys)}
    ref_emb = torch.from_numpy(gemb[[pos[q["reference"]] for q in suite.queries]])
    ref_paths = [suite.items[q["reference"]] for q in suite.queries]
    return gallery, gemb, pos, ref_emb, ref_paths


def rank_suite(qvecs: np.ndarray, suite: Suite, gallery, gemb, pos, expander=None, nqe: int = 0,
               fraction: float = 1.0, floor: float = -1.0, hub: float = 0.0,
               density: Optional[np.ndarray] = None, texts: Optional[np.ndarray] = None) -> np.ndarray:
    """1-based best target rank of every query (reference left out); with ``expander``, re-ranked after
    expanding from the first ``gallery_nqe(nqe, gallery size)`` results of the query's own gallery; ``hub``:
    the hub correction's weight, ``density`` each row's (:func:`engine.eval.cir.group_density`); ``texts``: theirs."""

    ranks = np.zeros(len(suite.queries), np.int64)
    for g, members in suite.galleries.items():
        sel = [i for i, q in enumerate(suite.queries) if q["gallery"] == g]
        if not sel:
            continue
        exps = {"x": expander} if expander is not None else None
        r = rank_queries(qvecs[sel], [suite.queries[i] for i in sel], gallery, gemb, pos, exps,
                         nqe=gallery_nqe(nqe, len(members), fraction), floor=lambda name: floor,
                         density=density, hub=hub, texts=None if texts is None else texts[sel], plain=exps is None)
        ranks[sel] = r["x" if expander is not None else "none"]
    return ranks


def evaluate(backbone, settings: Settings, side: str, composers: Optional[dict] = None, expanders: bool = True,
             defaults: Optional[dict] = None) -> dict:
    """Every composer (and, with ``expanders``, every expander at the page defaults) on one side."""

    suite = build_suite(side)
    gallery, gemb, pos, ref_emb, ref_paths = suite_tensors(backbone, suite)
    if composers is None:
        composers, _ = cir_composers(backbone, settings)
    trusts: dict = {}
    qv = compose_queries(backbone, composers, suite.queries, ref_emb, ref_paths=ref_paths, trusts=trusts)
    kinds = np.array([q["kind"] for q in suite.queries])
    # what a text-conditioned expander (lattqe-text) reads: encoded only when one is ranked (texts_of)
    ev_texts: dict = {"texts": lambda: query_texts(backbone, suite.queries)}
    d = defaults or engine_defaults(backbone, settings)
    density = group_density(gallery, gemb)
    results, plain = {}, {}
    for name, vecs in qv.items():
        plain[name] = rank_suite(vecs, suite, gallery, gemb, pos, hub=d.hub_weight_for(name), density=density)
        results[(name, "none")] = summarise(plain[name], kinds)
    if expanders:
        for ex_name, ex in _expanders(backbone, settings).items():
            for name, vecs in qv.items():
                r = rank_suite(vecs, suite, gallery, gemb, pos, ex, d.nqe_for(ex_name), d.nqe_fraction,
                               d.floor_for(ex_name), d.hub_weight_for(name), density, **texts_of(ev_texts, ex))
                results[(name, ex_name)] = summarise(r, kinds)
    return {"side": side, "suite": suite.summary(), "results": results, "suite_obj": suite, "density": density,
            "hub": {n: d.hub_weight_for(n) for n in qv},
            "tensors": (gallery, gemb, pos), "vectors": qv, "texts": ev_texts["texts"], "kinds": kinds, "trust": trusts, "ranks": plain,
            "classes": operation_classes(backbone, composers, suite.queries),
            "hubness": suite_hubness(qv, suite, gemb, pos, hub={n: d.hub_weight_for(n) for n in qv}, density=density)}


def operation_classes(backbone, composers: dict, queries) -> Optional[List[str]]:
    """The operation router's class of each query's text (None without an anchored composer's router)."""

    router = router_of(composers)
    if router is None:
        return None
    t = torch.from_numpy(np.asarray(embed_texts(backbone, [q["text"] for q in queries]), dtype=np.float32))
    return [router.classes[i] for i in router.probabilities(t).argmax(dim=-1).tolist()]


USED = 0.25  # a learned correction counts as used on a query when its share tau is at least this


def suite_hubness(qv: dict, suite: Suite, gemb: np.ndarray, pos: dict, k: int = 10, hub: Optional[dict] = None,
                  density: Optional[np.ndarray] = None) -> dict:
    """{method: {gallery: hubness of its top k}} (engine.eval.hubness), the reference left out, each method
    ranked with its hub correction (``hub``: {method: weight}, ``density``: each row's)."""
    out: dict = {}
    for g, members in suite.galleries.items():
        sel = [i for i, q in enumerate(suite.queries) if q["gallery"] == g]
        if not sel:
            continue
        cols = [pos[m] for m in members]
        col_of = {c: j for j, c in enumerate(cols)}
        refs = [col_of.get(pos.get(suite.queries[i]["reference"], -1), -1) for i in sel]
        for name, vecs in qv.items():
            w = (hub or {}).get(name, 0.0)
            sims = vecs[sel] @ gemb[cols].T
            penalty = hubs.penalty(sims, density[cols][None], w) if w and density is not None else 0.0
            out.setdefault(name, {})[g] = hubness(sims - penalty, k, refs)
    return out


def _expanders(backbone, settings: Settings) -> dict:

    return available_expanders(backbone, settings)


# -- choosing on the validation side ------------------------------------------------------------------------------

NQE_GRID = (1, 2, 4, 8, 64)
FLOOR_GRID = (-1.0, 0.8, 0.9, 0.95)
NQE_FRACTION = 0.02


def choose(backbone, settings: Settings, ev: dict, expander_grid: bool = True) -> dict:
    """The defaults chosen on the validation side ``ev`` (an :func:`evaluate` result on ``val``):

    * **method**: the best overall score (:func:`overall_score`) among the composers that take a text alone
      (a text-only query must work with the default); ties (within 0.5 point) go to the training-free sum;
    * **nQE and floor per expander**: over :data:`NQE_GRID` (capped at :data:`NQE_FRACTION` of each gallery)
      and :data:`FLOOR_GRID` (the least cosine a neighbour needs to the query to be averaged in; -1: all), the
      pair whose worst R@10 change over the composers is highest (ties: the lower floor, which expands more
      often, then the smaller nQE); with ``expander_grid`` off, the expanders keep the record's earlier values
      for this backbone (the fallback where there is none) and only the method is chosen again."""
    if ev["side"] != "val":
        raise ValueError("defaults are chosen on the validation side only")
    hub, hub_grid = choose_hub(ev)
    ev = with_hub(ev, hub)
    res = ev["results"]
    scores = {n: r["overall"] for (n, e), r in res.items() if e == "none" and n != "auto"}
    # the default is a method the page offers (a registered composer: RTIC+GCN is a checkpoint the evaluation and
    # the automatic method read, not a page method)
    textable = [n for n in scores if n != "image" and _takes_text_alone(ev, n) and n in COMPOSERS]
    best = max(textable, key=lambda n: scores[n])
    method = "sum" if "sum" in scores and scores[best] - scores["sum"] <= 0.5 else best
    auto = choose_auto(ev)
    if auto and auto["cross_fitted"] > scores[method] + 0.5:  # a single (seed) method keeps near-ties
        method = "auto"
    suite = ev["suite_obj"]
    gallery, gemb, pos = ev["tensors"]
    base = {n: r["all"]["R@10"] for (n, e), r in res.items() if e == "none"}
    nqe, floors, grid, changed = {}, {}, {}, {}
    chosen = {"method": method, "overall_val": {n: round(s, 2) for n, s in scores.items()}}
    if auto:
        chosen.update(routes=auto["routes"], auto_val_cross_fitted=round(auto["cross_fitted"], 2))
        routed = routed_vectors(ev["vectors"], ev["classes"], auto["routes"])
        auto_hub, auto_grid = choose_hub({**ev, "vectors": {"auto": routed}})
        hub["auto"], hub_grid["auto"] = auto_hub["auto"], auto_grid["auto"]
    chosen["hub_weight"] = {n: w for n, w in sorted(hub.items()) if w}
    chosen["hub_val"] = ev["hub_val"]
    chosen["hub_grid_val"] = {HUB_GALLERY: hub_grid}
    if not expander_grid:
        kept = engine_defaults(backbone, settings)
        # how many validation queries of the chosen method each expander moves at the kept values (the page
        # offers only those that move some): the chosen method's vectors only, so this stays a matter of minutes
        if method == "auto":

            vecs = {method: routed_vectors(ev["vectors"], ev["classes"], auto["routes"])}
        else:
            vecs = {method: ev["vectors"][method]}
        exps = _expanders(backbone, settings)
        changed = {ex_name: _queries_changed({**ev, "vectors": vecs}, ex, kept.nqe_for(ex_name), kept.floor_for(ex_name))
                   for ex_name, ex in exps.items()}
        overall = {n: overall_change({**ev, "vectors": vecs}, ex, kept.nqe_for(n), kept.floor_for(n), NQE_FRACTION,
                                     rank_suite) for n, ex in exps.items()}
        return {**chosen, "nqe": dict(kept.nqe), "floor": dict(kept.floor), "nqe_fraction": kept.nqe_fraction,
                "queries_changed": changed, "expander_overall_val": overall, "queries_changed_of": method}
    for ex_name, ex in _expanders(backbone, settings).items():
        rows = {}
        for value in NQE_GRID:
            for fl in FLOOR_GRID:
                # all queries' R@10 from the evaluation core (0-based ranks), without the bootstrap intervals
                # summarise() would draw and the grid does not read
                worst = min(recall_from_ranks(rank_suite(v, suite, gallery, gemb, pos, ex, value, NQE_FRACTION, fl,
                                                         **texts_of(ev, ex)) - 1, (10,))["R@10"] - base[n]
                            for n, v in ev["vectors"].items())
                rows[(value, fl)] = round(worst, 2)
        grid[ex_name] = {f"nqe {v}, floor {fl:g}": w for (v, fl), w in rows.items()}
        nqe[ex_name], floors[ex_name] = max(rows, key=lambda vf: (rows[vf], -vf[1], -vf[0]))
        changed[ex_name] = _queries_changed(ev, ex, nqe[ex_name], floors[ex_name])
    return {**chosen, "nqe": nqe, "floor": floors, "nqe_fraction": NQE_FRACTION, "grid_worst_r10_change": grid,
            "queries_changed": changed}


HUB_GRID = (0.0, 0.1, 0.2, 0.3, 0.4, 0.6)
HUB_TIE = 0.1  # a larger weight must beat a smaller one by more than this (overall points) to be chosen


HUB_GALLERY = "category"  # the suite's gallery of distinct photos: the shape of a gallery the page searches


def choose_hub(ev: dict) -> Tuple[Dict[str, float], Dict[str, Dict[str, float]]]:
    """({method: hub correction weight} (engine.index.hubs), {method: {weight: score}}): per method, the weight of
    :data:`HUB_GRID` with the best score on the validation side's gallery of distinct photos (:data:`HUB_GALLERY`);
    a larger weight only when it is more than :data:`HUB_TIE` better (0, no correction, wins ties).

    Not on the whole suite: its attribute and open galleries hold every photo in several edited versions, tight
    clusters a page's gallery does not have, and most of the correction's gain there comes from those clusters
    (with near-duplicates left out of the density most of the gain went), while on the gallery of distinct photos
    the correction lowered the learned composers and text only. The second dict holds each method's score there
    at every weight (the record's ``hub_grid_val``)."""
    out: Dict[str, float] = {}
    grid: Dict[str, Dict[str, float]] = {}
    if not ev["vectors"]:
        return out, grid
    suite, kinds, density = ev["suite_obj"], ev["kinds"], ev.get("density")
    gallery, gemb, pos = ev["tensors"]
    sel = [i for i, q in enumerate(suite.queries) if q["gallery"] == HUB_GALLERY]
    queries = [suite.queries[i] for i in sel]
    for name, vecs in ev["vectors"].items():
        best_w, best = 0.0, -1.0
        by_weight = hub_grid_ranks(vecs[sel], queries, gallery, gemb, pos, density, HUB_GRID)
        for w in HUB_GRID:
            score = overall_of_ranks(by_weight[w], kinds[sel])
            grid.setdefault(name, {})[f"{w:g}"] = round(score, 2)
            if score > best + (HUB_TIE if w else 0.0):
                best_w, best = w, score
        out[name] = best_w
    return out, grid


def with_hub(ev: dict, hub: Dict[str, float]) -> dict:
    """``ev`` with each method's plain ranks and results recomputed under its hub weight (``hub_val``: the
    overall score before and after, per method)."""
    suite, kinds, density = ev["suite_obj"], ev["kinds"], ev.get("density")
    gallery, gemb, pos = ev["tensors"]
    ranks, results, before_after = dict(ev.get("ranks") or {}), dict(ev["results"]), {}
    for name, vecs in ev["vectors"].items():
        w = hub.get(name, 0.0)
        off = overall_of_ranks(rank_suite(vecs, suite, gallery, gemb, pos), kinds)
        ranks[name] = rank_suite(vecs, suite, gallery, gemb, pos, hub=w, density=density)
        results[(name, "none")] = summarise(ranks[name], kinds)
        before_after[name] = [round(off, 2), round(results[(name, "none")]["overall"], 2)]
    return {**ev, "ranks": ranks, "results": results, "hub": dict(hub), "hub_val": before_after}


def choose_auto(ev: dict) -> Optional[dict]:
    """The automatic method's route table chosen on the validation side ``ev`` (engine.compose.auto) and its
    cross-fitted overall score (routes chosen on half the reference photos, scored on the other half), or None
    without the router's classes."""

    if not ev.get("classes"):
        return None
    ranks = {m: r for m, r in ev["ranks"].items() if m in MEMBERS}
    if "sum" not in ranks:
        return None
    groups = [q["reference"] for q in ev["suite_obj"].queries]
    return {"routes": choose_routes(ranks, ev["classes"], ev["kinds"]),
            "cross_fitted": cross_fitted_score(ranks, ev["classes"], ev["kinds"], groups)}


def _queries_changed(ev: dict, expander, nqe: int, floor: float) -> int:
    """:func:`engine.eval.expander_offer.queries_changed` over the suite (its ranking: :func:`rank_suite`)."""
    return queries_changed(ev, expander, nqe, floor, NQE_FRACTION, rank_suite)


def choose_defaults(backbone, settings: Settings, out: Optional[Path] = None, expander_grid: bool = True) -> tuple:
    """Evaluates the validation side, chooses (:func:`choose`) and writes the defaults record for ``backbone``
    into ``out`` (default: assets/checkpoints). Returns (evaluation, choice, record path). Used by
    ``--choose`` and by ``engine prepare`` after it trained a composer for a new backbone."""
    ev = evaluate(backbone, settings, "val", expanders=False, defaults=EngineDefaults())  # chosen afresh
    chosen = choose(backbone, settings, ev, expander_grid)
    command = "python -m engine eval generalise --side val --choose" + ("" if expander_grid else " --method-only")
    path = write_defaults(backbone, chosen, out, command=command)
    return ev, chosen, path


def _takes_text_alone(ev: dict, name: str) -> bool:
    """The baselines that read the text, the automatic method (the sum without an image), and the learned
    composers that fall back to their prior without an image (their spec: engine.checkpoints.PARTS[name].text_alone)."""
    return name in ("text", "sum", "auto") or (name in PARTS and PARTS[name].text_alone)


# -- report ------------------------------------------------------------------------------------------------------


def _cell(row: dict, k: int) -> str:
    lo, hi = row[f"R@{k}_ci"]
    return f"{row[f'R@{k}']:.1f} [{lo:.0f}–{hi:.0f}]"


def markdown(ev: dict, backbone) -> str:
    res = ev["results"]
    s = ev["suite"]
    lines = [f"Side `{ev['side']}`: {s['queries']} queries ({', '.join(f'{k} {v}' for k, v in s['by_kind'].items())}); "
             f"galleries: {s['gallery']['category']} photos (category changes), {s['gallery']['attribute']} photos in "
             f"every version (attribute edits), {s['gallery'].get('open', 0)} in the open kinds' versions; reference left out; backbone `{backbone.fingerprint}`. Cells: "
             "R@K in % with the 95 % bootstrap interval.", "",
             "| method | overall | all R@10 | " + " | ".join(f"{k} R@1 | {k} R@10" for k in KINDS) + " |",
             "|---|---|---|" + "---|---|" * len(KINDS)]
    for (name, ex), r in sorted(res.items(), key=lambda kv: (kv[0][1] != "none", kv[0][1], kv[0][0])):
        if ex != "none":
            continue
        cells = [f"{_cell(r[k], 1)} | {_cell(r[k], 10)}" if k in r else "– | –" for k in KINDS]
        lines.append(f"| {name} | {r['overall']:.1f} | {_cell(r['all'], 10)} | " + " | ".join(cells) + " |")
    lines += _use_and_hub_lines(ev)
    exps = sorted({ex for (_, ex) in res if ex != "none"})
    if exps:
        lines += ["", "R@10 over all queries with each expander at the page defaults (change against no expansion):", "",
                  "| method | none | " + " | ".join(exps) + " |", "|---|---|" + "---|" * len(exps)]
        for name in sorted({n for (n, _) in res}):
            base = res[(name, "none")]["all"]["R@10"]
            cells = [f"{res[(name, e)]['all']['R@10']:.1f} ({res[(name, e)]['all']['R@10'] - base:+.1f})"
                     for e in exps if (name, e) in res]
            lines.append(f"| {name} | {base:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _use_and_hub_lines(ev: dict) -> List[str]:
    """How often each learned correction is used, and each method's hubness, as Markdown lines."""
    lines = []
    if ev.get("trust"):
        lines += ["", f"Learned correction used (share tau >= {USED:g}) on: " + "; ".join(
            f"{n} {100 * float((t >= USED).mean()):.1f} % of the queries (mean tau {float(t.mean()):.2f})"
            for n, t in sorted(ev["trust"].items())) + "."]
    hub = ev.get("hubness") or {}
    if hub:
        gals = sorted({g for v in hub.values() for g in v})
        weights = {n: w for n, w in (ev.get("hub") or {}).items() if w}
        lines += ["", "Hubness of each method's top 10 (skewness of the 10-occurrence over the gallery; in brackets the "
                  "largest share of the queries that one item answers), each method ranked with the hub correction "
                  "weight chosen for it on validation (`engine.index.hubs`; " + (", ".join(
                      f"{n} {w:g}" for n, w in sorted(weights.items())) or "none chosen") + "; the others 0):", "",
                  "| method | " + " | ".join(gals) + " |", "|---|" + "---|" * len(gals)]
        for name in sorted(hub):
            cells = [f"{hub[name][g]['skew']:.2f} ({100 * hub[name][g]['max_share']:.0f} %)" if g in hub[name] else "–"
                     for g in gals]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def offline_section(args, ctx):
    """The ``generalise`` section of ``eval offline`` (the test side, read with the shipped defaults)."""
    ev = evaluate(ctx["backbone"], ctx["settings"], "test", expanders=not getattr(args, "no_expanders", False))
    return markdown(ev, ctx["backbone"]), {**_jsonable(ev["results"]), "hubness": ev["hubness"],
                                           "learned_use": {n: float((t >= USED).mean()) for n, t in ev["trust"].items()}}


def _jsonable(results: dict) -> dict:
    return {f"{n}+{e}": r for (n, e), r in results.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine eval generalise", description=__doc__.split("\n\n")[0])
    p.add_argument("--side", default="test", choices=SIDES)
    p.add_argument("--backbone", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--no-expanders", action="store_true")
    p.add_argument("--choose", action="store_true", help="(val side) choose the default method and nQE per "
                   "expander, and write them to the defaults record beside the checkpoints")
    p.add_argument("--method-only", action="store_true", help="with --choose: choose the default method only; the "
                   "expanders keep the record's earlier nQE and floor (their grid takes about 20 min an expander)")
    p.add_argument("--out", default="", help="write the defaults record here (with --choose; default: "
                   "assets/checkpoints)")
    p.add_argument("--json", default="", help="also write the figures to this JSON file")
    p.add_argument("--summary", action="store_true", help="only print the suite's counts")
    args = p.parse_args(argv)

    settings = Settings()
    configure_process(settings)
    if args.summary:
        for side in SIDES:
            print(json.dumps(build_suite(side).summary()))
        return 0
    if args.choose and args.side != "val":
        p.error("--choose reads the validation side only (--side val)")
    backbone = create_backbone(args.backbone or settings.backbone, args.device, settings=settings)
    t0 = time.time()
    if args.choose:
        ev, chosen, path = choose_defaults(backbone, settings, Path(args.out) if args.out else None,
                                           expander_grid=not args.method_only)
        print(markdown(ev, backbone))
        print(json.dumps(chosen, indent=1))
        print(f"wrote {path}")
    else:
        ev = evaluate(backbone, settings, args.side, expanders=not args.no_expanders)
        print(markdown(ev, backbone))
    if args.json:
        Path(args.json).write_text(json.dumps({"side": args.side, "suite": ev["suite"],
                                               "results": _jsonable(ev["results"]), "hubness": ev["hubness"],
                                               "trust": {n: t.tolist() for n, t in ev["trust"].items()}},
                                              indent=1, default=str))
    print(f"[generalise] {(time.time() - t0) / 60:.1f} min")
    return 0
