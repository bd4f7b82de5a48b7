"""Training and evaluation of the RTIC composer (``python -m engine train rtic``).

The command: options, the data sets (synthetic, or embedded by the backbone), training, the held-out report
and the checkpoints (written through the one checkpoint layer, :func:`engine.compose.rtic.save_rtic`)."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from ...backbones import create_backbone
from ...checkpoints import PARTS, file_name, slug
from ...compose.rtic import RTIC, RTICConfig, count_parameters, save_rtic
from ...config import ROOT, Settings, resolve_device
from ...process import configure_process
from ...data.cir_triplets import TripletSet, embed_triplets
from ...data.heldout import HELD_OUT_SOURCES
from ...data.tone import offline_cir_photos, tone_triplets
from ...errors import InputError
from ..anchor_fit import anchor_checkpoint
from ..gcn_graph import measure_gcn_memory
from .data import (
    load_triplets,
    open_vocab_set,
    open_vocab_triplets,
    split_by_reference_group,
    synthetic_triplets,
    tone_set,
)
from .loop import train_rtic
from .model import TrainConfig
from .report import held_out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m engine train rtic", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="cir", choices=["cir", "jsonl", "fashioniq", "cirr", "synthetic"],
                    help="cir = the offline composed-retrieval set (engine.data.formats)")
    ap.add_argument("--root", default="", help="data set root (fashioniq/cirr) or JSONL file/folder (jsonl)")
    ap.add_argument("--image-root", default=None, help="jsonl: folder that image paths are relative to")
    ap.add_argument("--categories", default="dress,shirt,toptee", help="fashioniq categories")
    ap.add_argument("--train-split", default="train")
    ap.add_argument("--eval-split", default="test", help="held-out split for the final report ('' = none)")
    ap.add_argument("--backbone", default=Settings().backbone)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default=None, help="checkpoint folder (default: CIS_CHECKPOINTS / assets/checkpoints)")
    ap.add_argument("--run-dir", default=None, help="resume state and history (default runs/rtic/<data>-<backbone>)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--report", default=None, help="write history + held-out recalls to this JSON file")
    ap.add_argument("--tone-edits", action="store_true",
                    help="cir: also train on the training photos' black-and-white and night edits "
                         "(photo + 'at night' -> its night version; engine.data.tone)")
    ap.add_argument("--open-vocab", action="store_true",
                    help="cir: also train on the open-vocabulary operation set's train side (XKCD colours, light "
                         "edits, category changes, compositional and undo triplets; engine.data.open_vocab) and "
                         "report its val side (new words, new templates)")
    ap.add_argument("--open-vocab-limit", type=int, default=0,
                    help="with --open-vocab: at most this many of its training queries (0 = all)")
    ap.add_argument("--open-vocab-eval", default="val", help="with --open-vocab: the side reported ('' = none)")
    ap.add_argument("--no-anchor", action="store_true",
                    help="cir: do not fit the prior anchor after training (engine.train.anchor_fit)")
    ap.add_argument("--max-targets", type=int, default=3,
                    help="training rows per query with many targets (e.g. category change); 0 = all")
    # model
    ap.add_argument("--n-blocks", type=int, default=4)
    ap.add_argument("--no-inner-skip", action="store_true")
    ap.add_argument("--no-gate", action="store_true")
    ap.add_argument("--text-proj", action="store_true")
    ap.add_argument("--image-proj", action="store_true")
    ap.add_argument("--leaky-slope", type=float, default=RTICConfig.negative_slope,
                    help="LeakyReLU negative slope (default 0.01, PyTorch's default as in the authors' code); "
                         "recorded in the checkpoint")
    # training
    d = TrainConfig()
    for name in ("epochs", "batch_size", "step_every", "gcn_layers", "seed", "gcn_epochs", "gcn_batch_size"):
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(d, name))
    for name in ("lr", "weight_decay", "momentum", "step_gamma", "margin", "cos_weight", "gcn_weight", "pair_weight",
                 "density", "p"):
        ap.add_argument("--" + name.replace("_", "-"), type=float, default=getattr(d, name))
    ap.add_argument("--group-by-reference", action="store_true",
                    help="batches of whole reference images: a photo's other edits are in its batch as negatives")
    ap.add_argument("--group-by-photo", action="store_true",
                    help="batches of whole source photos: a photo, its edited versions and every query from them "
                         "share a batch (the open-vocabulary set names each row's photo; elsewhere its reference)")
    ap.add_argument("--optimizer", default=d.optimizer, choices=["adamw", "sgd"])
    ap.add_argument("--loss", default=d.loss, choices=["dml", "triplet"])
    ap.add_argument("--gcn", action="store_true", help="also train RTIC + GCN stream (stage 2)")
    ap.add_argument("--correlation", default=d.correlation, choices=["target", "composed"])
    ap.add_argument("--gcn-init", default=d.gcn_init, choices=["scratch", "stage1"])
    ap.add_argument("--gcn-control", action="store_true",
                    help="with --gcn-init stage1: also continue stage 1 for the stage-2 epochs without the stream")
    ap.add_argument("--synthetic-dim", type=int, default=64, help="synthetic: embedding size")
    ap.add_argument("--synthetic-objects", type=int, default=60, help="synthetic: number of objects")
    ap.add_argument("--memory", default="", help="only measure GCN-stage memory for these N (comma list) and exit")
    ap.add_argument("--quiet", action="store_true")
    return ap



def _memory(args) -> int:
    """``--memory``: only the GCN stage's memory for the given N."""
    def show(r):
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}), flush=True)

    rows = measure_gcn_memory([int(x) for x in args.memory.split(",")], dim=args.synthetic_dim,
                              progress=not args.quiet, on_row=show)
    if args.report:
        Path(args.report).write_text(json.dumps(rows, indent=2))
    return 0


@dataclass
class Sets:
    """The embedded data of one run: training rows, the held-out split and its tone edits (where there are)."""

    train: TripletSet
    fingerprint: str
    backbone_name: str
    backbone: Any = None
    test: Optional[TripletSet] = None
    test_trips: Optional[list] = None  # held-out queries (their kinds), gallery [(path, kind)]
    test_gallery: Optional[list] = None
    tone: Optional[TripletSet] = None  # the held-out split's tone-edit set (cir only)
    tone_trips: Optional[list] = None
    tone_gallery: Optional[list] = None
    n_tone: int = 0  # tone-edit training triplets
    open: Optional[TripletSet] = None  # the open-vocabulary set's validation side (--open-vocab)
    open_trips: Optional[list] = None
    open_gallery: Optional[list] = None
    n_open: int = 0  # open-vocabulary training queries


def _synthetic_sets(args) -> Sets:
    full = synthetic_triplets(n_objects=args.synthetic_objects, dim=args.synthetic_dim, seed=args.seed)
    n_att = len(full.texts)
    train, test = split_by_reference_group(full, full.ref // n_att, seed=args.seed)
    return Sets(train, f"synthetic@{args.synthetic_dim}-{args.seed}", "synthetic", test=test)


def _embedded_sets(args, device: str) -> Sets:
    """The training split (with the tone edits when asked) and the held-out split, embedded by the backbone."""
    backbone = create_backbone(args.backbone, device=device)
    progress = not args.quiet
    train_trips, _ = load_triplets(args, args.train_split)
    n_tone = 0
    if args.tone_edits:
        tone_trips = tone_triplets(offline_cir_photos(args.train_split, hold_out=True))[0]
        n_tone = len(tone_trips)
        train_trips = train_trips + tone_trips
    n_open = 0
    if args.open_vocab:
        open_trips = open_vocab_triplets("train", args.open_vocab_limit)
        n_open = len(open_trips)
        train_trips = train_trips + open_trips
    train = embed_triplets(backbone, train_trips, progress=progress, max_targets=args.max_targets)
    sets = Sets(train, backbone.fingerprint, backbone.name, backbone, n_tone=n_tone, n_open=n_open)
    if args.open_vocab and args.open_vocab_eval:
        sets.open, sets.open_trips, sets.open_gallery = open_vocab_set(backbone, args.open_vocab_eval, progress=progress)
    if args.eval_split:
        sets.test_trips, sets.test_gallery = load_triplets(args, args.eval_split)
        sets.test = embed_triplets(backbone, sets.test_trips, progress=progress,
                                   gallery=[p for p, _ in sets.test_gallery])
        if args.data == "cir":
            sets.tone, sets.tone_trips, sets.tone_gallery = tone_set(backbone, args.eval_split, progress=progress)
    return sets


def _save(args, sets: Sets, result: dict, cfg: TrainConfig, metrics: dict, tone_metrics: dict,
          out_dir: Path) -> None:
    """Writes the RTIC and RTIC+GCN checkpoints (and, for the offline CIR set, fits their prior anchor)."""
    for variant, model in result["models"].items():
        if variant not in ("rtic", "rtic+gcn"):
            continue
        path = out_dir / file_name(PARTS[variant].stem, sets.backbone_name)
        extra = {"train_config": asdict(cfg), "data": args.data,
                 "held_out": metrics.get(variant, {}), "history": result["history"][variant],
                 # every method on the same split
                 "held_out_all": metrics, "eval_split": args.eval_split,
                 # the same split's photos' tone edits (R@1 decides there: each photo has three versions)
                 "held_out_tone": tone_metrics, "tone_edits": bool(args.tone_edits),
                 "open_vocab": bool(args.open_vocab),
                 "graph": result["graph"] if variant == "rtic+gcn" else None}
        if args.data == "cir":
            extra["held_out_sources"] = list(HELD_OUT_SOURCES)
        save_rtic(path, model, sets.fingerprint, sets.backbone_name, extra, variant=variant)
        print(f"saved {variant} -> {path}")
        if args.data == "cir" and not args.no_anchor:
            anchor_checkpoint(sets.backbone, variant, out_dir, progress=not args.quiet)
            print(f"anchored {variant} to the weighted sum (engine.train.anchor_fit)")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    settings = Settings()  # the entry point's settings: the decode budget and the offline sets' sources
    configure_process(settings)

    if args.memory:
        return _memory(args)
    if args.tone_edits and args.data != "cir":
        raise InputError("--tone-edits needs --data cir: the tone edits are made from the offline CIR set's photos")
    if args.open_vocab and args.data != "cir":
        raise InputError("--open-vocab needs --data cir: the open-vocabulary set is made from the offline sets' photos")
    device = resolve_device(args.device)
    cfg = TrainConfig.from_dict({**vars(args), "device": device})
    sets = _synthetic_sets(args) if args.data == "synthetic" else _embedded_sets(args, device)
    train = sets.train
    model_cfg = RTICConfig(
        dim=train.dim, n_blocks=args.n_blocks, inner_skip=not args.no_inner_skip, gating=not args.no_gate,
        text_proj=args.text_proj, image_proj=args.image_proj, negative_slope=args.leaky_slope,
    )
    run_dir = Path(args.run_dir) if args.run_dir else ROOT / "runs" / "rtic" / f"{args.data}-{slug(sets.backbone_name)}"
    run_dir.mkdir(parents=True, exist_ok=True)
    if sets.n_tone:
        print(f"tone edits: {sets.n_tone} of the training triplets (the {args.train_split} split's photos)")
    if sets.n_open:
        print(f"open vocabulary: {sets.n_open} of the training queries (engine.data.open_vocab, train side)")
    print(f"RTIC: {len(train)} training triplets, D={train.dim}, "
          f"{count_parameters(RTIC(model_cfg)):,} parameters, backbone {sets.fingerprint}")
    result = train_rtic(train, model_cfg, cfg, run_dir=run_dir, resume=args.resume, fingerprint=sets.fingerprint,
                        progress=not args.quiet)
    metrics, by_kind = held_out(sets.test, sets.test_trips if args.data == "cir" else None, sets.test_gallery,
                                result["models"])
    tone_metrics, tone_by_kind = held_out(sets.tone, sets.tone_trips, sets.tone_gallery, result["models"], "tone ")
    open_metrics, open_by_kind = held_out(sets.open, sets.open_trips, sets.open_gallery, result["models"], "open ")
    if result["graph"]:
        print("graph:", json.dumps(result["graph"]))
    report: Dict[str, Any] = {
        "train_config": asdict(cfg), "model_config": asdict(model_cfg), "train_triplets": len(train),
        "test_triplets": len(sets.test) if sets.test is not None else 0, "history": result["history"],
        "graph": result["graph"], "held_out": metrics, "held_out_by_kind": by_kind,
        "held_out_tone": tone_metrics, "held_out_tone_by_kind": tone_by_kind,
        "tone_edits": bool(args.tone_edits), "tone_triplets": sets.n_tone,
        "open_vocab": bool(args.open_vocab), "open_vocab_queries": sets.n_open, "held_out_open": open_metrics,
        "held_out_open_by_kind": open_by_kind, "open_vocab_eval": args.open_vocab_eval if args.open_vocab else "",
        "eval_split": args.eval_split, "backbone_fingerprint": sets.fingerprint, "data": args.data}
    (run_dir / "history.json").write_text(json.dumps(report, indent=2))
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=2))
    out_dir = Path(args.out) if args.out else (run_dir if args.data == "synthetic" else Path(settings.checkpoints))
    _save(args, sets, result, cfg, metrics, tone_metrics, out_dir)
    return 0
