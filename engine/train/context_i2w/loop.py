"""Context-I2W training loop: only the mapper trains (the backbone stays frozen), AdamW with warm-up and a
cosine schedule, AMP on CUDA, a checkpoint every epoch, a resumable state, and the best epoch by held-out
R@10 when validation pairs are given."""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, List, Optional

import numpy as np
import torch

from ...checkpoints import load_training_state, save_training_state
from ...compose.context_i2w import ContextI2WMapper, save_context_i2w
from ...errors import CheckpointError, InputError
from ..budget import another_epoch_fits
from .data import PairFeatures, _batch
from .model import TrainConfig, _param_groups, _schedule, contrastive_loss, pseudo_prompt_embeddings
from .report import evaluate_pairs


@dataclass
class _Run:
    """The optimiser side of one training run and where it stands."""

    opt: torch.optim.Optimizer
    sched: Any
    scaler: Any
    use_amp: bool
    amp_dtype: torch.dtype
    batch_size: int
    steps_per_epoch: int
    step: int = 0


def _start(mapper: ContextI2WMapper, n: int, cfg: TrainConfig, device, max_steps: Optional[int]) -> _Run:
    """Batch size, steps, optimiser, schedule and AMP for ``n`` pairs."""
    bs = min(cfg.batch_size, n)
    if bs < 2:
        raise InputError("contrastive training needs at least 2 pairs")
    steps_per_epoch = n // bs
    total = steps_per_epoch * cfg.epochs if max_steps is None else min(max_steps, steps_per_epoch * cfg.epochs)
    opt = torch.optim.AdamW(_param_groups(mapper, cfg.weight_decay), lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(max(total, 1), min(cfg.warmup_steps, total // 5)))
    use_amp = bool(cfg.amp and str(device).startswith("cuda"))
    amp_dtype = torch.bfloat16 if use_amp and torch.cuda.is_bf16_supported() else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp and amp_dtype == torch.float16)
    return _Run(opt, sched, scaler, use_amp, amp_dtype, bs, steps_per_epoch)


def _config_key(mapper: ContextI2WMapper) -> str:
    return json.dumps(asdict(mapper.config), sort_keys=True)


def _resume(state_path: Path, backbone, mapper: ContextI2WMapper, run: _Run) -> tuple:
    """(first epoch, history) from ``state.pt``; refuses another backbone's or another config's state."""
    st = load_training_state(state_path, map_location=backbone.device)
    if st.get("backbone_fingerprint") != backbone.fingerprint:
        raise CheckpointError(f"{state_path.name} belongs to backbone {st.get('backbone_fingerprint')!r}, "
                              f"not {backbone.fingerprint!r}")
    if st.get("config") != _config_key(mapper):
        raise CheckpointError(f"{state_path.name} was written for another mapper config")
    mapper.load_state_dict(st["mapper"])
    run.opt.load_state_dict(st["optimizer"])
    run.sched.load_state_dict(st["scheduler"])
    run.step = int(st["step"])
    return int(st["epoch"]), list(st["history"])


def _initialise(mapper: ContextI2WMapper, cfg: TrainConfig) -> None:
    """The gate opened to ``gate_init`` and the local branch's last layer zeroed (``local_zero_init``)."""
    with torch.no_grad():
        if cfg.gate_init:
            mapper.gate.fill_(math.atanh(cfg.gate_init))
        if cfg.local_zero_init:
            mapper.local_branch.out.weight.zero_()
            mapper.local_branch.out.bias.zero_()


def _train_epoch(backbone, mapper: ContextI2WMapper, feats: PairFeatures, cfg: TrainConfig, run: _Run,
                 order: np.ndarray, epoch: int, max_steps: Optional[int], progress: bool, t0: float) -> dict:
    """One pass over ``order`` (the epoch started at ``t0``); the epoch's record (loss, lr, seconds, gate)."""
    from tqdm.auto import tqdm

    device, bs, scale = backbone.device, run.batch_size, float(backbone.logit_scale)
    seen, losses = 0, []
    bar = tqdm(range(run.steps_per_epoch), desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=not progress)
    for b in bar:
        if max_steps is not None and run.step >= max_steps:
            break
        emb, tok, ctx = _batch(feats, order[b * bs:(b + 1) * bs], device)
        with torch.autocast("cuda", dtype=run.amp_dtype, enabled=run.use_amp):
            txt = pseudo_prompt_embeddings(backbone, mapper, tok, ctx, global_dropout=cfg.global_dropout)
            loss = contrastive_loss(emb, txt.float(), scale)
            if cfg.cosine_weight:
                loss = loss + cfg.cosine_weight * (1 - (emb * txt.float()).sum(-1)).mean()
        run.opt.zero_grad(set_to_none=True)
        run.scaler.scale(loss).backward()
        if cfg.grad_clip:
            run.scaler.unscale_(run.opt)
            torch.nn.utils.clip_grad_norm_(mapper.parameters(), cfg.grad_clip)
        run.scaler.step(run.opt)
        run.scaler.update()
        run.sched.step()
        run.step += 1
        seen += emb.shape[0]
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}", img_s=f"{seen / max(time.time() - t0, 1e-6):.0f}",
                        gate=f"{mapper.gate_value():+.3f}")
    bar.close()
    return {"epoch": epoch + 1, "step": run.step, "loss": float(np.mean(losses)) if losses else float("nan"),
            "lr": float(run.sched.get_last_lr()[0]), "seconds": round(time.time() - t0, 2),
            "gate": mapper.gate_value()}


def _save_state(state_path: Path, backbone, mapper: ContextI2WMapper, run: _Run, epoch: int,
                history: List[dict]) -> None:
    save_training_state(state_path, {"mapper": mapper.state_dict(), "optimizer": run.opt.state_dict(),
                                     "scheduler": run.sched.state_dict(), "epoch": epoch + 1, "step": run.step,
                                     "history": history, "backbone_fingerprint": backbone.fingerprint,
                                     "config": _config_key(mapper)})


def train_mapper(backbone, mapper: ContextI2WMapper, feats: PairFeatures, cfg: TrainConfig,
                 out: Optional[Path] = None, run_dir: Optional[Path] = None, resume: bool = False,
                 progress: bool = True, half: bool = False, extra: Optional[dict] = None,
                 max_steps: Optional[int] = None, val_feats: Optional[PairFeatures] = None) -> List[dict]:
    """Trains ``mapper`` in place; returns the history (one dict per epoch: loss, lr, seconds).

    ``val_feats``: held-out pairs; after every epoch their pseudo-word R@10 is recorded, and the mapper
    ends with the weights of the best epoch by it (ties: the later epoch).

    ``out``: checkpoint file written every epoch. ``run_dir``: ``state.pt`` (mapper, optimiser,
    scheduler, epoch, history) for ``resume``. The backbone stays frozen: only the mapper's
    parameters are given to the optimiser, and gradients reach them through the pseudo-token only.
    """
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    mapper.to(backbone.device).train()
    n = len(feats)
    run = _start(mapper, n, cfg, backbone.device, max_steps)
    history: List[dict] = []
    start_epoch = 0
    state_path = Path(run_dir) / "state.pt" if run_dir else None
    if resume and state_path is not None and state_path.is_file():
        start_epoch, history = _resume(state_path, backbone, mapper, run)
        rng = np.random.default_rng(cfg.seed + start_epoch)
    else:
        _initialise(mapper, cfg)
    best = None
    for epoch in range(start_epoch, cfg.epochs):
        if max_steps is not None and run.step >= max_steps:
            break
        order = rng.permutation(n)
        t0 = time.time()
        rec = _train_epoch(backbone, mapper, feats, cfg, run, order, epoch, max_steps, progress, t0)
        if val_feats is not None and len(val_feats):
            rec["val_R@10"] = evaluate_pairs(backbone, mapper, val_feats)["context-i2w"]["R@10"]
            if best is None or rec["val_R@10"] >= best[0]:
                best = (rec["val_R@10"], epoch + 1, {k: v.detach().clone() for k, v in mapper.state_dict().items()})
            mapper.train()
        history.append(rec)
        if out is not None:
            save_context_i2w(out, mapper.eval(), backbone, {"training": {"history": history, **(extra or {})}},
                             half=half)
            mapper.train()
        if state_path is not None:
            _save_state(state_path, backbone, mapper, run, epoch, history)
        if not another_epoch_fits(time.time() - t0):
            break  # the time limit of `prepare`: the checkpoint holds the epochs done
    if best is not None:
        mapper.load_state_dict(best[2])
        history[-1]["best_epoch"] = best[1]  # the weights kept
    mapper.eval()
    return history
