"""Train the Context-I2W mapper on image-caption pairs (``python -m engine train context-i2w``).

Options, the mapper to start from (new, the authors' checkpoint, or the saved one with ``--eval-only``), the
pairs, training, held-out evaluation, the checkpoint (and its prior anchor) and the report."""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch

from ...backbones.factory import create_backbone
from ...checkpoints import PARTS, file_name
from ...compose.context_i2w import (
    ContextI2WConfig,
    ContextI2WMapper,
    count_parameters,
    load_authors_checkpoint,
    load_context_i2w,
    save_context_i2w,
)
from ...config import Settings
from ...process import configure_process
from ...data.heldout import HELD_OUT_SOURCES
from ...errors import InputError
from ..anchor_fit import anchor_checkpoint
from .data import Pair, _cache_root, load_pairs, prepare_features, split_pairs
from .loop import train_mapper
from .model import SMALL_CONFIG, TrainConfig
from .report import evaluate_cir, evaluate_pairs, local_share


def _parser() -> argparse.ArgumentParser:
    d, t = ContextI2WConfig(vision_width=1, token_dim=1, context_dim=1), TrainConfig()
    ap = argparse.ArgumentParser(prog="python -m engine train context-i2w", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="captions", help="'captions' (offline set), 'recoloured' (the offline CIR set's colour edits), "
                    "'open-vocab' (the open-vocabulary set's colour and light edits, train side), "
                    "'captions+recoloured+open-vocab', a CSV/TSV/JSONL file or a CC3M-style folder")
    ap.add_argument("--image-root", default=None, help="folder that relative image paths in a pair file start from")
    ap.add_argument("--split", default="train", help="captions: training split")
    ap.add_argument("--val-split", default="val", help="captions: held-out split ('' = none)")
    ap.add_argument("--val-fraction", type=float, default=0.1, help="pair files/folders: held-out share (by image)")
    ap.add_argument("--max-pairs", type=int, default=0, help="use at most this many training pairs (0 = all)")
    ap.add_argument("--backbone", default=Settings().backbone)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default=None, help="checkpoint folder (default: CIS_CHECKPOINTS / assets/checkpoints)")
    ap.add_argument("--name", default=None, help="checkpoint file name (default context_i2w-<backbone>.safetensors)")
    ap.add_argument("--run-dir", default=None, help="resume state (default: <cache>/context_i2w/runs/<name>)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--checkpoint", default=None, help="start from the authors' IM2TEXT_OWM_Attn checkpoint (.pt)")
    ap.add_argument("--half", action="store_true", help="store the checkpoint as float16")
    ap.add_argument("--small", action="store_true", help=f"small mapper for offline backbones: {SMALL_CONFIG}")
    for name in ("depth", "heads", "dim_head", "num_latents", "middle_dim", "n_layer"):
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=None, help=f"default {getattr(d, name)}")
    ap.add_argument("--ff-mult", type=float, default=None, help=f"default {d.ff_mult}")
    ap.add_argument("--dropout", type=float, default=d.dropout)
    ap.add_argument("--template", default=d.template, help="inference prompt; '*' = placeholder, {text} = modification")
    ap.add_argument("--epochs", type=int, default=t.epochs)
    ap.add_argument("--batch-size", type=int, default=t.batch_size)
    ap.add_argument("--lr", type=float, default=t.lr)
    ap.add_argument("--weight-decay", type=float, default=t.weight_decay)
    ap.add_argument("--warmup-steps", type=int, default=t.warmup_steps)
    ap.add_argument("--seed", type=int, default=t.seed)
    ap.add_argument("--no-amp", action="store_true")
    ap.add_argument("--global-dropout", type=float, default=t.global_dropout,
                    help="share of training rows whose S* comes from the local branch alone "
                         "(with --gate-init and --local-zero-init: trains the local branch)")
    ap.add_argument("--cosine-weight", type=float, default=t.cosine_weight,
                    help="add this times mean(1 - cos) between prompt and image embeddings to the loss")
    ap.add_argument("--select-best", action="store_true",
                    help="end with the epoch whose held-out pseudo-word R@10 is best (evaluated every epoch)")
    ap.add_argument("--gate-init", type=float, default=t.gate_init, help="tanh(gate) at the start of training")
    ap.add_argument("--local-zero-init", action="store_true",
                    help="start the local branch's last layer at zero, so S* starts as the global branch's output "
                         "whatever the gate")
    ap.add_argument("--eval-cir", default="test", help="also evaluate on this split of the offline 'cir' set ('' = no)")
    ap.add_argument("--eval-only", action="store_true", help="evaluate the checkpoint at --out/--name, no training")
    ap.add_argument("--report", default=None, help="write history + held-out numbers to this JSON file")
    ap.add_argument("--no-anchor", action="store_true",
                    help="offline data: do not fit the prior anchor after training (engine.train.anchor_fit)")
    ap.add_argument("--quiet", action="store_true")
    return ap


def _mapper_config(args, backbone) -> ContextI2WConfig:
    over = dict(SMALL_CONFIG) if args.small else {}
    for name in ("depth", "heads", "dim_head", "num_latents", "middle_dim", "n_layer", "ff_mult"):
        v = getattr(args, name)
        if v is not None:
            over[name] = v
    return ContextI2WConfig.for_backbone(backbone, dropout=args.dropout, template=args.template, **over)


def _offline(spec: str) -> bool:
    return all(part in ("captions", "recoloured", "open-vocab") for part in spec.split("+"))



def _start_mapper(args, backbone, out: Path, record: dict) -> ContextI2WMapper:
    """The saved mapper (``--eval-only``), the authors' checkpoint (``--checkpoint``) or a new one (``--seed``)."""
    if args.eval_only:
        mapper, _ = load_context_i2w(out, backbone.fingerprint)
        args.epochs = 0
    elif args.checkpoint:
        mapper, info = load_authors_checkpoint(args.checkpoint, backbone, template=args.template)
        record["init"] = info["file"]
    else:
        torch.manual_seed(args.seed)
        mapper = ContextI2WMapper(_mapper_config(args, backbone))
    print(f"Context-I2W mapper: {count_parameters(mapper):,} parameters on {backbone.name}", file=sys.stderr)
    return mapper


def _offline_val(args) -> List[Pair]:
    """The offline held-out pairs: the captions' split, and with ``open-vocab`` in the data its val side
    (new colour names, new phrasings) too."""
    val = load_pairs("captions", args.val_split)
    if "open-vocab" in args.data.split("+"):
        val += load_pairs("open-vocab", args.val_split)
    return val


def _eval_only_pairs(args) -> List[Pair]:
    """The held-out pairs ``--eval-only`` evaluates on."""
    if _offline(args.data) and args.val_split:
        return _offline_val(args)
    if not _offline(args.data) and args.val_fraction > 0:
        return split_pairs(load_pairs(args.data, args.split, args.image_root), args.val_fraction, args.seed)[1]
    return []


def _train(args, backbone, mapper: ContextI2WMapper, out: Path, run_dir: Path, record: dict,
           progress: bool) -> List[Pair]:
    """Trains ``mapper`` on the training pairs (their figures go into ``record``); returns the held-out pairs."""
    train = load_pairs(args.data, args.split, args.image_root)
    val: List[Pair] = []
    if _offline(args.data):
        val = _offline_val(args) if args.val_split else []
    elif args.val_fraction > 0:
        train, val = split_pairs(train, args.val_fraction, args.seed)
    if args.max_pairs:
        random.Random(args.seed).shuffle(train)
        train = train[: args.max_pairs]
    feats = prepare_features(backbone, train, progress=progress)
    record.update(train_pairs=len(feats), skipped_no_subject=feats.skipped_no_subject,
                  train_images_sha256=hashlib.sha256("\n".join(sorted(feats.paths)).encode()).hexdigest())
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "train_images.txt").write_text("\n".join(feats.paths) + "\n", encoding="utf-8")
    print(f"training pairs: {len(feats)} (skipped, no subject: {feats.skipped_no_subject})", file=sys.stderr)
    if not 0.0 <= args.global_dropout < 1.0 or not -1.0 < args.gate_init < 1.0:
        raise InputError("--global-dropout must be in [0, 1) and --gate-init in (-1, 1)")
    cfg = TrainConfig(args.epochs, args.batch_size, args.lr, args.weight_decay, args.warmup_steps, args.seed,
                      amp=not args.no_amp, global_dropout=args.global_dropout, gate_init=args.gate_init,
                      cosine_weight=args.cosine_weight, local_zero_init=args.local_zero_init)
    record["train_config"] = asdict(cfg)
    vsel = prepare_features(backbone, val, progress=progress) if (args.select_best and val) else None
    record["history"] = train_mapper(backbone, mapper, feats, cfg, out=out, run_dir=run_dir, resume=args.resume,
                                     progress=progress, half=args.half, extra=record, val_feats=vsel)
    return val


def _held_out(args, backbone, mapper: ContextI2WMapper, val: List[Pair], progress: bool) -> Dict[str, object]:
    """Held-out pseudo-word retrieval on ``val`` and composed retrieval on the offline ``cir`` split."""
    results: Dict[str, object] = {}
    if val:
        vfeats = prepare_features(backbone, val, progress=progress)
        results["pairs"] = {"split": args.val_split or "held-out", "n": len(vfeats),
                            "recall": evaluate_pairs(backbone, mapper, vfeats),
                            "gate": mapper.gate_value(), "local_share": local_share(mapper, vfeats)}
    if args.eval_cir:
        try:
            results["cir"] = {"split": args.eval_cir, **evaluate_cir(backbone, mapper, args.eval_cir, progress)}
        except InputError as exc:
            results["cir"] = {"error": str(exc)}
    return results


def _save(args, backbone, mapper: ContextI2WMapper, out: Path, out_dir: Path, record: dict, progress: bool) -> None:
    """The final checkpoint; on the offline data, its prior anchor fitted (engine.train.anchor_fit)."""
    if _offline(args.data):
        record["held_out_sources"] = list(HELD_OUT_SOURCES)
    save_context_i2w(out, mapper, backbone, {"training": record}, half=args.half)
    if _offline(args.data) and not args.no_anchor:
        anchor_checkpoint(backbone, "context-i2w", out_dir, progress=progress)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    progress = not args.quiet
    settings = Settings()  # the entry point's settings: the decode budget and the offline sets' sources
    configure_process(settings)
    backbone = create_backbone(args.backbone, args.device)
    out_dir = Path(args.out or settings.checkpoints)
    name = args.name or file_name(PARTS["context-i2w"].stem, backbone.name)
    out = out_dir / name
    run_dir = Path(args.run_dir) if args.run_dir else _cache_root() / "runs" / Path(name).stem
    record: Dict[str, object] = {"command": "python -m engine train context-i2w " + " ".join(argv or sys.argv[1:]),
                                 "backbone": backbone.name, "data": args.data}
    mapper = _start_mapper(args, backbone, out, record)
    val: List[Pair] = _eval_only_pairs(args) if args.eval_only else []
    if not args.eval_only and (args.epochs > 0 or not args.checkpoint):
        val = _train(args, backbone, mapper, out, run_dir, record, progress)
    results = _held_out(args, backbone, mapper, val, progress)
    record["held_out"] = results
    if not args.eval_only:
        _save(args, backbone, mapper, out, out_dir, record, progress)
    print(json.dumps({"checkpoint": str(out), "held_out": results}, indent=2, default=str))
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(record, indent=2, default=str))
    return 0
