"""``python -m engine train lattqe``: options, data selection, training or re-flooring, checkpoint and report."""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from ...checkpoints import figures_of, file_name
from ...config import Settings
from ...process import configure_process
from ...errors import InputError
from ...eval.expanders import NQE_LIST, evaluate_expanders, format_table, labelled_features, plot_curves
from ...expand.lattqe import load_lattqe, save_lattqe
from ...fileio import atomic_write_text
from .data import class_list, fashion_mnist_pca, load_features, split_classes
from .loop import choose_floor, cir_guard, train_lattqe
from .model import TrainConfig
from .report import plot_history
from .composed import (ComposedConfig, build_set, choose_composed_floor, composed_eval, composed_sets, mean_recall,
                       page_nqe, train_composed)
from ...backbones import create_backbone


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine train lattqe", description="Train LAttQE on labelled embeddings.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--features", type=Path, help=".npz with 'embeddings' (N,D), 'labels' (N,), 'fingerprint'")
    src.add_argument("--labelled", metavar="PARTS",
                     help="offline labelled set parts, comma separated (e.g. emoji,photos,fmnist_small), "
                          "embedded with --backbone; trains on 'train', picks the epoch on 'val', "
                          "reports on the held-out test classes")
    src.add_argument("--fashion-mnist", action="store_true",
                     help="stand-in: Fashion-MNIST pixels projected by PCA (see --pca; CIS_FASHION_MNIST_DIR)")
    src.add_argument("--composed", action="store_true",
                     help="text-conditioned LAttQE (the modification text as a token) trained on composed queries "
                          "of the offline CIR train split (--methods compose them with --backbone); epoch and "
                          "weight floor chosen on the CIR val split")
    p.add_argument("--r10-guard", type=float, default=0.5, metavar="POINTS",
                   help="--composed: only weight floors that keep every method's validation R@10 within POINTS of "
                        "no expansion")
    p.add_argument("--methods", default="sum,rtic",
                   help="--composed: the composers whose queries it trains and is chosen on (comma list)")
    p.add_argument("--backbone", default="packaged", help="backbone for --labelled (create_backbone name)")
    p.add_argument("--device", default="auto")
    p.add_argument("--max-per-class", type=int, default=0, help="--labelled: at most N images per class and split")
    p.add_argument("--save-features", type=Path, default=None, help="also write the embedded --labelled splits (.npz)")
    p.add_argument("--pca", type=int, default=64, help="PCA size for --fashion-mnist")
    p.add_argument("--per-class", type=int, default=1000, help="items per class for --fashion-mnist")
    p.add_argument("--val-classes", default="7,8,9",
                   help="--fashion-mnist: validation classes (held out of training and of the PCA fit)")
    p.add_argument("--classes", default="",
                   help="--fashion-mnist: use only these classes (default all 10); the others are left out of the "
                        "PCA fit too, e.g. --classes 0,1,2,3,4,5,6 --val-classes 5,6 never sees 7, 8, 9")
    p.add_argument("--fingerprint", default="", help="backbone fingerprint (overrides the one in --features)")
    p.add_argument("--val-frac", type=float, default=0.3, help="share of classes held out for validation")
    p.add_argument("--out", type=Path, default=None, help="checkpoint folder (default: CIS_CHECKPOINTS)")
    p.add_argument("--name", default="", help="checkpoint file stem (lattqe*.safetensors/json; default lattqe, "
                                              "with --composed lattqe-<backbone>-text)")
    p.add_argument("--report", type=Path, default=None,
                   help="folder for eval JSON + PNG plots (mAP vs nQE on held-out classes, training curves)")
    p.add_argument("--eval-queries", type=int, default=1000)
    p.add_argument("--nqe-list", default=",".join(map(str, NQE_LIST)), help="nQE values of the report's curves")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    p.add_argument("--quiet", action="store_true")
    # the recipe's options; left out of the namespace when not given, so that each recipe (image-only TrainConfig,
    # --composed ComposedConfig) keeps its own defaults
    train_names = {f.name for f in fields(TrainConfig)}
    for f in [*fields(TrainConfig), *(f for f in fields(ComposedConfig) if f.name not in train_names)]:
        if f.name in ("positional", "center_inputs", "keep_query"):
            continue
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default),
                       default=f.default if f.name == "seed" else argparse.SUPPRESS,
                       help=f"(default {f.default}" + (f"; --composed: {getattr(ComposedConfig, f.name)})"
                                                       if hasattr(ComposedConfig, f.name) and f.name in train_names
                                                       and getattr(ComposedConfig, f.name) != f.default else ")"))
    p.add_argument("--no-positional", action="store_true", help="ablation: no positional encodings")
    p.add_argument("--no-center", action="store_true", help="ablation: feed raw (uncentred) vectors to the encoder")
    p.add_argument("--refloor", type=Path, default=None, metavar="CHECKPOINT",
                   help="no training: choose the weight floors of this LAttQE checkpoint on the validation "
                        "classes of the data given and write it to --out/--name")
    p.add_argument("--cir-guard", type=float, default=0.0, metavar="POINTS",
                   help="with --refloor: only floors that keep composed R@10 on the offline CIR validation split "
                        "within POINTS of no expansion for every composer (0 = off)")
    p.add_argument("--no-keep-query", action="store_true",
                   help="the paper's raw cosine weights (may be negative), no weight floor chosen on validation")
    return p


def _train_config(args) -> TrainConfig:
    return TrainConfig(**{f.name: getattr(args, f.name, f.default) for f in fields(TrainConfig)
                          if f.name not in ("positional", "center_inputs", "keep_query")},
                       positional=not args.no_positional, center_inputs=not args.no_center,
                       keep_query=not args.no_keep_query)


def _labelled(args):
    parts = [p.strip() for p in args.labelled.split(",") if p.strip()]
    feats, fp = labelled_features(parts, args.backbone, args.device, max_per_class=args.max_per_class,
                                  seed=args.seed)
    source = f"labelled {'+'.join(parts)}" + (f" (max {args.max_per_class}/class)" if args.max_per_class else "")
    if args.save_features:
        args.save_features.parent.mkdir(parents=True, exist_ok=True)
        arrays = {f"{k}_{n}": v for k, (xe, ye) in feats.items() for n, v in (("embeddings", xe), ("labels", ye))}
        np.savez(args.save_features, fingerprint=np.array(fp), **arrays)
    return feats, fp, source


def _feature_file(args):
    feats, fp = load_features(args.features)
    if "all" in feats:
        x, y = feats.pop("all")
        tr, va = split_classes(y, args.val_frac, args.seed)
        feats = {"train": (x[tr], y[tr]), "val": (x[va], y[va])}
    return feats, fp, args.features.name


def _fashion_mnist(args):
    val_classes = class_list(args.val_classes, "--val-classes")
    classes = class_list(args.classes, "--classes") if args.classes.strip() else list(range(10))
    if not set(val_classes) < set(classes):
        raise InputError("--val-classes must be some, not all, of --classes")
    unused = [c for c in range(10) if c not in classes]
    x, y, fp = fashion_mnist_pca(dim=args.pca, per_class=args.per_class, seed=args.seed,
                                 val_classes=sorted(set(val_classes) | set(unused)))
    source = (f"Fashion-MNIST pixels, PCA {args.pca}, {args.per_class}/class, classes "
              f"{','.join(map(str, classes))}, validation {','.join(map(str, val_classes))}")
    va = np.isin(y, val_classes)  # the PCA was fit without the validation (and unused) classes
    tr = np.isin(y, classes) & ~va
    return {"train": (x[tr], y[tr]), "val": (x[va], y[va])}, fp, source


def _data(args):
    """(x, y, train mask, validation mask, test split or None, fingerprint, source) of the data asked for."""
    loader = _labelled if args.labelled else (_feature_file if args.features is not None else _fashion_mnist)
    feats, fp, source = loader(args)
    if "train" not in feats or "val" not in feats:
        raise InputError("the data gave no train/validation images")
    x = np.concatenate([feats["train"][0], feats["val"][0]])
    y = np.concatenate([feats["train"][1], feats["val"][1]])
    tr = np.r_[np.ones(len(feats["train"][0]), bool), np.zeros(len(feats["val"][0]), bool)]
    va = ~tr
    if set(np.unique(y[tr]).tolist()) & set(np.unique(y[va]).tolist()):
        raise InputError("training and validation share classes; the split must be class disjoint")
    fp = args.fingerprint or fp
    if not fp:
        raise InputError("no backbone fingerprint: pass --fingerprint or store one in the .npz")
    return x, y, tr, va, feats.get("test"), fp, source


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = Settings()
    configure_process(settings)
    if args.composed:
        return _composed(args, settings)
    args.name = args.name or "lattqe"
    cfg = _train_config(args)
    x, y, tr, va, test, fp, source = _data(args)
    print(f"LAttQE: {source}; {tr.sum()} training items ({len(np.unique(y[tr]))} classes), "
          f"{va.sum()} validation items ({len(np.unique(y[va]))} held-out classes), dim {x.shape[1]}")
    t0 = time.time()
    if args.refloor is not None:
        return _refloor(args, cfg, fp, x[va], y[va], settings)
    model, history = train_lattqe(x[tr], y[tr], x[va], y[va], cfg, progress=not args.quiet)
    best = max(history, key=lambda h: h["val_map"])
    floor = choose_floor(model, x[va], y[va], cfg) if cfg.keep_query else None
    out_dir = args.out or Path(settings.checkpoints)
    if floor is not None:  # the validation figure of the model as shipped (floor chosen)
        best = {**best, "val_map": floor["val_map"]}
    extra = {"train": asdict(cfg), "data": source, "best_epoch": best["epoch"], "val_map": best["val_map"],
             "floor_selection": floor,
             "val_map_none": best["val_map_none"], "val_map_aqe": best["val_map_aqe"],
             "train_seconds": round(time.time() - t0, 1), "history": history,
             "val_classes": [str(c) for c in np.unique(y[va])],
             "train_classes": [str(c) for c in np.unique(y[tr])]}
    path = save_lattqe(model, out_dir / f"{args.name}.safetensors", fp, extra)
    print(f"best epoch {best['epoch']}: val mAP {best['val_map']:.4f} (no QE {best['val_map_none']:.4f}, "
          f"AQE {best['val_map_aqe']:.4f})" + (f", weight floor {floor['weight_floor']:.1f}" if floor else "")
          + f"; checkpoint {path}")
    if args.report is not None:
        ex, ey, where = (test[0], test[1], "test") if test is not None else (x[va], y[va], "val")
        _report(args, model, history, ex, ey, where, source, fp)
    return 0


def _report(args, model, history, ex, ey, where: str, source: str, fp: str) -> None:
    """The eval JSON, the mAP-vs-nQE and training plots and the table, on the ``where`` classes."""
    args.report.mkdir(parents=True, exist_ok=True)
    nqe_list = [int(v) for v in args.nqe_list.split(",") if v.strip()]
    res = evaluate_expanders(ex, ey, model, nqe_list=nqe_list, n_queries=args.eval_queries, seed=args.seed,
                             progress=not args.quiet)
    res.update(source=source, fingerprint=fp, split=where)
    atomic_write_text(args.report / f"{args.name}_eval.json", json.dumps(res, indent=1))
    plot_curves(res, args.report / f"{args.name}_map_vs_nqe.png", title=f"mAP vs nQE, held-out {where} classes")
    plot_history(history, args.report / f"{args.name}_training.png")
    print(format_table(res))


def _refloor(args, cfg: TrainConfig, fp: str, val_x: np.ndarray, val_y: np.ndarray, settings) -> int:
    """``--refloor CHECKPOINT``: the weights stay, the floors are chosen again on the validation classes
    (with ``--cir-guard P``: only among the floors that keep composed retrieval on the CIR validation split
    within P points of R@10 of no expansion for every composer)."""
    model, record = load_lattqe(args.refloor, fingerprint=fp)
    guard = None
    if args.cir_guard > 0:
        guard = cir_guard(model, create_backbone(args.backbone, "cpu"), args.cir_guard, settings=settings)
        print(f"CIR validation guard ({args.cir_guard:g} points of R@10): floors allowed {guard['allowed']}")
    floor = choose_floor(model, val_x, val_y, cfg, allowed=None if guard is None else guard["allowed"])
    if guard is not None:
        floor["cir_guard"] = guard
    keep = figures_of(record, "fingerprint", "embed_dim", "weights")
    keep["train"] = record.get("recipe") or record.get("train") or {}
    keep.update(floor_selection=floor, val_map=floor["val_map"])
    out_dir = args.out or Path(settings.checkpoints)
    path = save_lattqe(model, out_dir / f"{args.name}.safetensors", fp, keep)
    print(f"weight floor {floor['weight_floor']:.1f} (query side), {floor['dba_weight_floor']:.1f} (LAttDBA); "
          f"val mAP {keep['val_map']:.4f} (no QE {floor['val_map_none']:.4f}); checkpoint {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def _composed(args, settings) -> int:
    """``--composed``: text-conditioned LAttQE on the offline CIR set's composed queries (engine.train.lattqe.composed)."""
    cfg = ComposedConfig(**{f.name: getattr(args, f.name, f.default) for f in fields(ComposedConfig)})
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    device = "cpu" if args.device == "auto" else args.device
    backbone = create_backbone(args.backbone, device)
    t0 = time.time()
    raw = composed_sets(backbone, methods, settings)
    train, val = (build_set(*raw[s]) for s in ("train", "val"))
    nqe = page_nqe(backbone, settings, raw["val"])
    print(f"LAttQE (text): {len(train.q)} composed training queries ({', '.join(methods)}), {len(val.q)} validation "
          f"queries; page nQE on validation {sorted(set(nqe.tolist()))}")
    model, history = train_composed(train, val, cfg, val_nqe=nqe, progress=not args.quiet)
    best = max(history, key=lambda h: h["val_recall"])
    floor = choose_composed_floor(model, val, nqe, r10_guard=args.r10_guard)
    at_page, at_8 = composed_eval(model, val, nqe), composed_eval(model, val, 8)
    figures = {"page_nqe": at_page, "nqe_8": at_8}
    changed = sum(v["top10_changed"] for v in at_page.values())
    extra = {"train": {**asdict(cfg), "methods": methods}, "data": "offline CIR train split (held-out sources left "
             "out), composed by " + "+".join(methods), "best_epoch": best["epoch"], "floor_selection": floor,
             "validation": {"split": "val", "metric": "mean of R@1, R@5, R@10 over " + "+".join(methods), "scores": {
                 "lattqe-text": round(mean_recall(at_page), 2), "none": round(mean_recall(at_page, none=True), 2)}},
             "composed_val": figures, "queries_changed_val": changed,
             "train_seconds": round(time.time() - t0, 1), "history": history,
             "command": "python -m engine train lattqe --composed" + (
                 f" --methods {args.methods}" if args.methods != "sum,rtic" else "")}
    out_dir = args.out or Path(settings.checkpoints)
    name = args.name or Path(file_name("lattqe", backbone.name, "text")).stem
    path = save_lattqe(model, out_dir / f"{name}.safetensors", backbone.fingerprint, extra)
    print(f"best epoch {best['epoch']}, weight floor {floor['weight_floor']:g}; checkpoint {path}")
    for label, res in (("page nQE", at_page), ("nQE 8", at_8)):
        for m, v in res.items():
            print(f"  val {label:8s} {m:10s} R@10 none {v['r10_none']:6.2f}  lattqe-text {v['r10']:6.2f}  "
                  f"(no text {v['r10_no_text']:6.2f}); R@1 none {v['r1_none']:6.2f}  lattqe-text {v['r1']:6.2f} "
                  f"(no text {v['r1_no_text']:6.2f}); "
                  f"top 10 changed on {v['top10_changed']} of {v['queries']}")
    return 0
