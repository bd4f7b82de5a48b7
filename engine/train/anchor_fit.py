"""Fitting a learned composer's prior anchor (engine.compose.anchor) on validation data held out by domain.

``python -m engine train anchor --composer rtic|rtic+gcn|context-i2w`` (run by each trainer at its end, and
by ``engine prepare``) does three things to the composer's checkpoint:

1. **banks**: the text bank holds the embeddings of the texts the composer trained on (RTIC: the offline CIR
   training queries' texts and the tone phrasings; Context-I2W: its training captions), the image bank 64
   spherical k-means centres of its training images;
2. **ramps and weight**: chosen on two validation sets, never on a test split: the *validation side of the
   held-out-domain suite* (``engine.eval.generalise``: photos, words and phrasings no trainer saw) and the
   composer's own *in-domain validation* (the offline CIR validation split, held-out sources left out). The
   rule: the highest sum of the suite's overall score and the in-domain R@10, less :data:`SHORTFALL_COST` times
   the *shortfall*: summed over the suite's query kinds, how far a kind's score falls below the best
   training-free method on that kind (image only, text only or the weighted sum; score of a kind =
   (R@1 + R@10) / 2; shortfalls within :data:`TOLERANCE` points count as none). Two families compete: one global trust (weight and
   familiarity ramps; no kind below the prior by more than the tolerance) and the operation router's
   per-operation trust *and prior text weight* (``engine.compose.router``: "a cat instead" may lean on the
   words, "the same car in red" on the reference), found by coordinate ascent;
3. the checkpoint is written again (atomically) with the anchor and the fit's figures (``anchor_fit``).
"""
from __future__ import annotations

import argparse
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..backbones import create_backbone
from ..checkpoints import search_dirs
from ..compose.context_i2w import load_context_i2w_composer, save_context_i2w
from ..compose.rtic import load_rtic_composer, save_rtic
from ..config import Settings
from ..process import configure_process
from ..data.cir_triplets import load_offline_cir
from ..data.features import embed_paths, embed_texts
from ..data.heldout import held_out_cir_images, keep_row
from ..data.open_vocab import load_open_vocab
from ..data.tone import TONE_TEXTS, offline_cir_photos
from ..eval.cir import cir_tensors, compose_queries
from ..eval.generalise import build_suite, suite_tensors
from ..eval.metrics import recall_from_ranks
from .context_i2w import load_pairs
from .router import operation_texts, train_router
from ..compose.anchor import (
    Anchor,
    AnchorConfig,
    familiarity,
    kmeans_prototypes,
    mask_content,
    operation_vocabulary,
    prior,
    ramp,
)

TOLERANCE = 1.0
SHORTFALL_COST = 3.0  # a point of a kind below its best training-free method costs three points of the total
WEIGHTS = (0.25, 0.5, 0.75, 1.0)
QUANTILES = (0.02, 0.1, 0.25, 0.5)
WIDTHS = (0.0, 0.02, 0.05, 0.1, 0.2)
TAU_GRID = np.linspace(0.0, 1.0, 21)
ROUTE_VALUES = (0.0, 0.25, 0.5, 0.75, 1.0)  # the trust an operation of the router can get
ALPHA_STEPS = tuple(np.round(np.linspace(0.0, 1.0, 11), 2))  # the prior text weights the fit's table holds
ROUTE_ALPHAS = (0.3, 0.5, 0.7, 0.8, 0.9, 1.0)  # the prior text weight an operation of the router can get
# the prior visual-block weight an operation can get on a backbone with a visual block (engine.compose.anchor.prior),
# beside the plain sum's 1 - text weight
ROUTE_VISUALS = (0.0, 0.25, 0.5, 1.0)


@dataclass
class FitSet:
    """One validation set, everything the ranking needs precomputed."""

    name: str
    image: torch.Tensor         # (B, D) reference embeddings
    text: torch.Tensor          # (B, D) text embeddings
    learned: torch.Tensor       # (B, D) the composer's own (un-anchored) query vectors
    gallery: torch.Tensor       # (N, D)
    candidate: torch.Tensor     # (B, N) bool: the query's own gallery, reference left out
    target: torch.Tensor        # (B, N) bool
    kinds: np.ndarray           # (B,) query kind
    texts: Sequence[str] = ()   # the queries' texts
    op_text: Optional[torch.Tensor] = None  # (B, D) the texts with their content words masked (with_operations)

    def ranks(self, q: torch.Tensor) -> np.ndarray:
        return self.ranks_of_scores(q @ self.gallery.T)

    def ranks_of_scores(self, s: torch.Tensor) -> np.ndarray:
        """1-based rank of the best target from (B, N) scores (a positive scale per row changes nothing)."""
        s = s.masked_fill(~self.candidate, float("-inf"))
        best = s.masked_fill(~self.target, float("-inf")).max(dim=1).values
        return ((s > best[:, None]).sum(dim=1) + 1).numpy()


def kind_scores(ranks: np.ndarray, kinds: np.ndarray) -> Dict[str, float]:
    """{kind: (R@1 + R@10) / 2} in % from 1-based ranks (the evaluation core's recall)."""
    out = {}
    for k in sorted(set(kinds.tolist())):
        rec = recall_from_ranks(ranks[kinds == k] - 1, (1, 10))
        out[k] = (rec["R@1"] + rec["R@10"]) / 2.0
    return out


def r10(ranks: np.ndarray) -> float:
    """R@10 in % from 1-based ranks."""
    return recall_from_ranks(ranks - 1, (10,))["R@10"]


# -- the validation sets ------------------------------------------------------------------------------------


def _text_embeddings(backbone, texts: Sequence[str]) -> torch.Tensor:
    return torch.from_numpy(np.asarray(embed_texts(backbone, list(texts)), dtype=np.float32))


def suite_set(backbone, composer) -> FitSet:
    """The validation side of the held-out-domain suite, with ``composer``'s un-anchored vectors."""
    suite = build_suite("val")
    gallery, gemb, pos, ref_emb, ref_paths = suite_tensors(backbone, suite)
    learned = compose_queries(backbone, {"x": composer}, suite.queries, ref_emb, ref_paths=ref_paths)["x"]
    names = np.array([g["gallery"] for g in gallery])
    cand = torch.zeros(len(suite.queries), len(gallery), dtype=torch.bool)
    tgt = torch.zeros_like(cand)
    for i, q in enumerate(suite.queries):
        cand[i] = torch.from_numpy(names == q["gallery"])
        cand[i, pos[q["reference"]]] = False
        tgt[i, [pos[t] for t in q["targets"]]] = True
    return FitSet("suite val", ref_emb.float(), _text_embeddings(backbone, [q["text"] for q in suite.queries]),
                  torch.from_numpy(learned).float(), torch.from_numpy(gemb).float(), cand, tgt & cand,
                  np.array([q["kind"] for q in suite.queries]), [q["text"] for q in suite.queries])


def in_domain_set(backbone, composer, split: str = "val") -> FitSet:
    """The offline CIR ``split`` without the held-out sources (the composer's own domain)."""
    queries, gallery, gemb, pos = cir_tensors(backbone, split)
    held = held_out_cir_images()
    queries = [q for q in queries if keep_row([q["reference"], *q["targets"]], held)]
    ref_emb = torch.from_numpy(gemb[[pos[q["reference"]] for q in queries]])
    learned = compose_queries(backbone, {"x": composer}, queries, ref_emb)["x"]
    names = np.array([g["gallery"] for g in gallery])
    keep_g = np.array([g["image"] not in held for g in gallery])
    cand = torch.zeros(len(queries), len(gallery), dtype=torch.bool)
    tgt = torch.zeros_like(cand)
    for i, q in enumerate(queries):
        cand[i] = torch.from_numpy((names == q["gallery"]) & keep_g)
        cand[i, pos[q["reference"]]] = False
        tgt[i, [pos[t] for t in q["targets"]]] = True
    return FitSet(f"cir {split}", ref_emb.float(), _text_embeddings(backbone, [q["text"] for q in queries]),
                  torch.from_numpy(learned).float(), torch.from_numpy(gemb).float(), cand, tgt & cand,
                  np.array([q["kind"] for q in queries]), [q["text"] for q in queries])


# -- banks ------------------------------------------------------------------------------------------------


def bank_inputs(part: str, record: Optional[dict] = None) -> tuple:
    """(texts, image files) the composer ``part`` trained on, held-out sources left out (with the
    open-vocabulary set's train side when its ``record`` says it trained on it)."""
    if part in ("rtic", "rtic+gcn"):
        trips = load_offline_cir("train", hold_out=True)
        if (record or {}).get("open_vocab"):
            trips = trips + load_open_vocab("train")
        texts = sorted({t.text for t in trips} | {x for v in TONE_TEXTS.values() for x in v})
        images = sorted({t.reference for t in trips} | {str(p) for p in offline_cir_photos("train", hold_out=True)})
        return texts, images
    if part == "context-i2w":
        data = ((record or {}).get("training") or {}).get("data") or "captions+recoloured"  # what it trained on
        pairs = load_pairs(str(data), "train")
        return sorted({p.caption for p in pairs}), sorted({str(p.path) for p in pairs})
    raise ValueError(f"no anchor for {part!r}")


def build_banks(backbone, texts: Sequence[str], images: Sequence[str], k: int = 64) -> Anchor:
    """The text bank, the image prototypes and the operation bank (the texts with their content words masked,
    each masked text once) with its vocabulary (engine.compose.anchor)."""
    text_bank = _text_embeddings(backbone, texts)
    image_emb = torch.from_numpy(embed_paths(backbone, list(images), desc="anchor image bank"))
    vocab = operation_vocabulary(texts)
    ops = sorted({mask_content(t, frozenset(vocab)) for t in texts})
    return Anchor(AnchorConfig(weight=0.0), text_bank, kmeans_prototypes(image_emb, k), _text_embeddings(backbone, ops),
                  vocab)


def with_operations(backbone, anchor: Anchor, *sets: FitSet) -> None:
    """Fills each set's ``op_text`` (its texts masked with ``anchor``'s vocabulary), for the fit to try."""
    for s in sets:
        s.op_text = _text_embeddings(backbone, [anchor.mask(t) for t in s.texts])


# -- the fit ----------------------------------------------------------------------------------------------


def _ramps(values: np.ndarray) -> List[tuple]:
    out = [(-1.0, -1.0)]
    for q, w in itertools.product(QUANTILES, WIDTHS):
        hi = float(np.quantile(values, q))
        out.append((hi - w, hi))
    return out


def _score_tables(anchor: Anchor, sets: Sequence[FitSet], priors: Sequence[tuple], split: int, with_ops: bool):
    """(per set: (familiarities {op: (B,)}, image familiarity, [prior scores (B, N) per prior], learned scores),
    per set: each query's rank at every (prior, tau) of the grids (P, B, len(TAU_GRID)))."""
    feats = {}
    for s in sets:
        ft, fv = anchor.familiarities(s.image, s.text)
        fo = familiarity(s.op_text, anchor.op_bank) if with_ops else ft
        l = F.normalize(s.learned, dim=-1)
        # the blend's scores are (1 - tau) p.g + tau l.g over its norm, a positive per-query scale that leaves
        # the ranking alone: the score matrices are computed once and every setting only mixes them
        feats[s.name] = ({0.0: ft, 1.0: fo}, fv, [prior(s.image, s.text, a, v, split) @ s.gallery.T
                                                  for a, v in priors], l @ s.gallery.T)
    # each query's rank at every (prior, tau) of the grids, computed once: a setting then only looks its ranks up
    # (text weight and tau rounded to the grids' steps for the fit; the composer applies the exact values)
    table = {s.name: np.stack([np.stack([s.ranks_of_scores((1 - t) * pa + t * feats[s.name][3]) for t in TAU_GRID],
                                        axis=1) for pa in feats[s.name][2]]) for s in sets}
    return feats, table


def fit(anchor: Anchor, suite: FitSet, domain: FitSet, tolerance: float = TOLERANCE, split: int = 0) -> tuple:
    """(AnchorConfig, report) by the rule of the module text. ``split`` > 0: the first dimension of the
    backbone's visual block; the router's operations may then also weigh that block apart (ROUTE_VISUALS)."""
    ops = (0.0, 1.0) if anchor.op_bank is not None and all(s.op_text is not None for s in (suite, domain)) else (0.0,)
    alphas = alpha_grid(anchor.config.alpha)
    a0 = alphas.index(round(anchor.config.alpha, 4))
    split = split if anchor.router is not None else 0
    # the priors the table holds: the plain sums first (row i: text weight alphas[i]), then the channel-aware ones
    priors = [(a, None) for a in alphas] + [(a, v) for a in ROUTE_ALPHAS for v in ROUTE_VISUALS if split]
    feats, table = _score_tables(anchor, (suite, domain), priors, split, len(ops) > 1)
    prior_suite = kind_scores(table[suite.name][a0, :, 0], suite.kinds)
    prior_domain = r10(table[domain.name][a0, :, 0])
    # the best training-free method on each kind: image only (alpha 0), text only (alpha 1), the sum (alpha 0.5)
    free = {name: kind_scores(table[suite.name][alphas.index(a), :, 0], suite.kinds)
            for name, a in (("image", 0.0), ("text", 1.0), ("sum", 0.5))}
    best_free = {k: max(free[n][k] for n in free) for k in prior_suite}
    fv_in = feats[domain.name][1].numpy()

    def objective(ks: dict, dom: float) -> tuple:
        """(the suite's overall score + the in-domain R@10 - SHORTFALL_COST x the shortfall below the best
        training-free method, summed over the kinds beyond the tolerance; that shortfall)."""
        short = sum(max(0.0, best_free[k] - ks[k] - tolerance) for k in ks)
        return (float(np.mean(list(ks.values()))) + dom - SHORTFALL_COST * short, round(short, 6))

    def score(cfg: AnchorConfig):
        out = {}
        for s in (suite, domain):
            ft, fv, _, _ = feats[s.name]
            tau = cfg.weight * ramp(ft[cfg.op], cfg.text_lo, cfg.text_hi) * ramp(fv, cfg.image_lo, cfg.image_hi)
            col = np.rint(tau.numpy() * (len(TAU_GRID) - 1)).astype(np.int64)
            out[s.name] = table[s.name][a0, np.arange(len(col)), col]
        ks = kind_scores(out[suite.name], suite.kinds)
        return ks, r10(out[domain.name])

    best_cfg = AnchorConfig(weight=0.0, alpha=anchor.config.alpha)
    best = (objective(prior_suite, prior_domain), prior_suite, prior_domain)
    tried = 0
    grid = [(op, w, t, i) for op in ops for w, t, i in itertools.product(
        WEIGHTS, _ramps(feats[domain.name][0][op].numpy()), _ramps(fv_in))]
    for op, w, (tlo, thi), (ilo, ihi) in grid:
        cfg = AnchorConfig(w, tlo, thi, ilo, ihi, anchor.config.alpha, op)
        ks, dom = score(cfg)
        tried += 1
        if any(ks[k] < prior_suite[k] - tolerance for k in prior_suite):
            continue
        obj = objective(ks, dom)
        if obj[0] > best[0][0] + 1e-9:
            best_cfg, best = cfg, (obj, ks, dom)
    routed = None
    if anchor.router is not None:
        routed = _fit_routes(anchor, suite, domain, feats, table, priors, objective, best_cfg, split)
        if routed[0][0] > best[0][0] + 1e-9:
            best_cfg, best = routed[1], routed[0:1] + routed[2:4]
    full_ks, full_dom = score(AnchorConfig(1.0, alpha=anchor.config.alpha))
    report = {"rule": f"max suite overall + in-domain R@10 - {SHORTFALL_COST:g} x the shortfall of the suite-val kinds "
                      f"below the best training-free method (image, text or sum; beyond {tolerance} point)",
              "settings_tried": tried,
              "prior": {"suite_val_kinds": _r(prior_suite), "in_domain_r10": round(prior_domain, 2)},
              "best_training_free": _r(best_free),
              "unanchored": {"suite_val_kinds": _r(full_ks), "in_domain_r10": round(full_dom, 2)},
              "chosen": {"suite_val_kinds": _r(best[1]), "in_domain_r10": round(best[2], 2)},
              "shortfall_below_training_free": round(best[0][1], 2),
              "in_domain_set": domain.name, "suite_set": suite.name}
    if routed is not None:
        report["routes"] = {"chosen": bool(best_cfg.route),
                            "trust": dict(zip(anchor.router.classes, [round(float(v), 2) for v in routed[4]])),
                            "prior_text_weight": dict(zip(anchor.router.classes, [round(float(v), 2) for v in routed[5]])),
                            "total": round(routed[0][0], 2)}
        if routed[6] is not None:
            report["routes"]["prior_visual_weight"] = dict(zip(anchor.router.classes,
                                                               [round(float(v), 2) for v in routed[6]]))
        if best_cfg.route:
            anchor.router.trust = torch.tensor(routed[4], dtype=torch.float32)
            anchor.router.alpha = torch.tensor(routed[5], dtype=torch.float32)
            anchor.router.visual = None if routed[6] is None else torch.tensor(routed[6], dtype=torch.float32)
    return best_cfg, report


def alpha_grid(alpha: float) -> List[float]:
    """The prior's text weights the fit's table holds: :data:`ALPHA_STEPS` and the anchor's own ``alpha``."""
    return sorted({round(float(a), 4) for a in ALPHA_STEPS} | {round(float(alpha), 4)})


def _fit_routes(anchor: Anchor, suite: FitSet, domain: FitSet, feats: dict, table: dict, priors: Sequence[tuple],
                objective, start: AnchorConfig, split: int = 0, passes: int = 3) -> tuple:
    """Coordinate ascent on the router's per-operation trust (values of :data:`ROUTE_VALUES`), per-operation
    prior text weight (values of :data:`ROUTE_ALPHAS`) and, with a visual block (``split``), per-operation
    visual-block weight (the plain sum's or one of :data:`ROUTE_VISUALS`), the image ramp of ``start`` kept, by
    ``objective``. Returns (objective, config, kinds, in-domain R@10, trust, text weights, visual weights or
    None when every operation kept the plain sum's)."""
    probs = {s.name: anchor.router.probabilities(s.text) for s in (suite, domain)}
    cfg = AnchorConfig(1.0, -1.0, -1.0, start.image_lo, start.image_hi, anchor.config.alpha, 0.0, 1.0)
    # each table row as (text weight, visual-block weight); a plain sum's visual weight is 1 - its text weight
    grid_a = np.asarray([a for a, _ in priors], dtype=np.float32)
    grid_v = np.asarray([1 - a if v is None else v for a, v in priors], dtype=np.float32)
    ramps = {s.name: ramp(feats[s.name][1], cfg.image_lo, cfg.image_hi) for s in (suite, domain)}

    def effective(alpha: np.ndarray, visual: np.ndarray) -> np.ndarray:
        return np.where(np.isnan(visual), 1 - alpha, visual).astype(np.float32)

    def evaluate(trust: np.ndarray, alpha: np.ndarray, visual: np.ndarray):
        out = {}
        for s in (suite, domain):
            p = probs[s.name]
            tau = (p @ torch.from_numpy(trust).float()) * ramps[s.name]
            col = np.rint(tau.numpy() * (len(TAU_GRID) - 1)).astype(np.int64)
            a = (p @ torch.from_numpy(alpha).float()).numpy()
            v = (p @ torch.from_numpy(effective(alpha, visual))).numpy()
            # the nearest (text weight, visual weight) of the table
            row = (np.abs(a[:, None] - grid_a[None, :]) + np.abs(v[:, None] - grid_v[None, :])).argmin(axis=1)
            out[s.name] = table[s.name][row, np.arange(len(col)), col]
        ks = kind_scores(out[suite.name], suite.kinds)
        dom = r10(out[domain.name])
        return objective(ks, dom), ks, dom

    k = len(anchor.router.classes)
    trust = np.zeros(k, dtype=np.float32)
    alpha = np.full(k, anchor.config.alpha, dtype=np.float32)
    visual = np.full(k, np.nan, dtype=np.float32)  # nan: the plain sum's
    visuals = (np.nan, *(ROUTE_VISUALS if split else ()))
    best = evaluate(trust, alpha, visual)
    for _ in range(passes):
        moved = False
        for i in range(k):
            for t, a, v in itertools.product(ROUTE_VALUES, ROUTE_ALPHAS, visuals):
                t_trial, a_trial, v_trial = trust.copy(), alpha.copy(), visual.copy()
                t_trial[i], a_trial[i], v_trial[i] = t, a, v
                res = evaluate(t_trial, a_trial, v_trial)
                if res[0][0] > best[0][0] + 1e-9:
                    trust, alpha, visual, best, moved = t_trial, a_trial, v_trial, res, True
        if not moved:
            break
    if np.isnan(visual).all():
        return best[0], cfg, best[1], best[2], trust, alpha, None
    cfg.visual_from = float(split)
    return best[0], cfg, best[1], best[2], trust, alpha, effective(alpha, visual)


def _r(d: dict) -> dict:
    return {k: round(v, 2) for k, v in d.items()}


# -- applying it to a checkpoint --------------------------------------------------------------------------


def anchor_checkpoint(backbone, part: str, checkpoint_dir=None, progress: bool = True,
                      keep_banks: bool = False, new_router: bool = False, visual_prior: bool = False) -> dict:
    """Builds, fits and stores the anchor of the ``part`` checkpoint for ``backbone`` found in
    ``checkpoint_dir`` (rewritten in place). Returns the fit's report.

    ``keep_banks``: the banks, the operation vocabulary and the router already stored with the checkpoint are
    kept and only the ramps, trusts and prior text weights are fitted again (no training image embedded, no
    router trained: minutes instead of a quarter of an hour on 2 cores); without a stored anchor, as usual.
    ``new_router`` (with ``keep_banks``): the router is trained again from :func:`operation_texts` (a change of
    its texts), the banks still kept. ``visual_prior``: the router's operations may also weigh the backbone's visual
    block apart (engine.compose.anchor.prior; off by default, see docs/rtic.md)."""
    if part in ("rtic", "rtic+gcn"):
        composer = load_rtic_composer(backbone, checkpoint_dir, variant=part)
        model, record = composer.model, composer.record
    elif part == "context-i2w":
        composer = load_context_i2w_composer(backbone, checkpoint_dir)
        model, record = composer.mapper, composer.record
    else:
        raise ValueError(f"no anchor for {part!r}")
    path = _checkpoint_path(part, record, checkpoint_dir, backbone)
    stored = composer.anchor if keep_banks else None
    composer.anchor = None                       # fit on the composer's own vectors
    if stored is not None and stored.text_bank is not None and stored.image_bank is not None:
        anchor = Anchor(AnchorConfig(weight=0.0, alpha=stored.config.alpha), stored.text_bank, stored.image_bank,
                        stored.op_bank, sorted(stored.vocab), stored.router)
        n_texts, router_acc = int(stored.text_bank.shape[0]), (record.get("anchor_fit") or {}).get("router_train_accuracy")
        if anchor.router is None or new_router:
            anchor.router, router_acc = train_router(backbone, operation_texts())
        command = f"python -m engine train anchor --composer {part} --keep-banks" + (" --new-router" * new_router)
        command += " --visual-prior" * visual_prior
    else:
        texts, images = bank_inputs(part, record)
        anchor = build_banks(backbone, texts, images)
        anchor.router, router_acc = train_router(backbone, operation_texts())
        n_texts, command = len(texts), f"python -m engine train anchor --composer {part}" + " --visual-prior" * visual_prior
    suite = suite_set(backbone, composer)
    domain = in_domain_set(backbone, composer)
    with_operations(backbone, anchor, suite, domain)
    cfg, report = fit(anchor, suite, domain, split=visual_split(backbone) if visual_prior else 0)
    if not cfg.route:
        anchor.router = None  # not chosen: nothing stored
    if router_acc is not None:
        report["router_train_accuracy"] = round(float(router_acc), 3)
    anchor.config = cfg
    report.update(config=cfg.to_dict(), text_bank=n_texts, image_bank=int(anchor.image_bank.shape[0]),
                  command=command)
    extra = {**record, "anchor_fit": report}  # each saver makes the record's own keys again (checkpoints.figures_of)
    if part == "context-i2w":
        save_context_i2w(path, model, backbone, extra, half=record.get("stored_dtype") == "float16", anchor=anchor)
    else:
        save_rtic(path, model, backbone.fingerprint, record.get("backbone_name", backbone.name), extra, anchor,
                  variant=part)
    if progress:
        print(json.dumps(report, indent=1))
    return report


def visual_split(backbone) -> int:
    """The first dimension of the backbone's visual block (the packaged backbone's visual channel:
    engine.backbones.visual), 0 when its image embeddings have none (texts and images fill every dimension)."""
    text_dim, dim = int(getattr(backbone, "text_dim", 0) or 0), int(getattr(backbone, "embed_dim", 0) or 0)
    return text_dim if getattr(backbone, "visual", None) is not None and 0 < text_dim < dim else 0


def _checkpoint_path(part: str, record: dict, checkpoint_dir, backbone) -> Path:
    """The file the composer was loaded from, on the checkpoint search path."""
    for d in search_dirs(checkpoint_dir):
        p = Path(d) / record["file"]
        if p.is_file():
            return p
    raise FileNotFoundError(record["file"])


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine train anchor", description=__doc__.split("\n\n")[0])
    p.add_argument("--composer", required=True, choices=["rtic", "rtic+gcn", "context-i2w"])
    p.add_argument("--backbone", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument("--checkpoints", default=None, help="folder of the checkpoint (default: the search path)")
    p.add_argument("--keep-banks", action="store_true", help="keep the banks and the router stored with the "
                   "checkpoint; fit only the ramps, trusts and per-operation prior text weights again")
    p.add_argument("--new-router", action="store_true", help="with --keep-banks: train the operation router again "
                   "(its texts changed) and keep only the banks")
    p.add_argument("--visual-prior", action="store_true", help="let each operation also weigh the backbone's visual "
                   "block apart in the prior (channel-aware prior; off by default: docs/rtic.md says why)")
    args = p.parse_args(argv)
    if args.new_router and not args.keep_banks:
        p.error("--new-router goes with --keep-banks (without it the router is always trained again)")
    settings = Settings()
    configure_process(settings)
    backbone = create_backbone(args.backbone or settings.backbone, args.device, settings=settings)
    anchor_checkpoint(backbone, args.composer, args.checkpoints or settings.checkpoints, keep_banks=args.keep_banks,
                      new_router=args.new_router, visual_prior=args.visual_prior)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
