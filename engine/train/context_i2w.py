"""Train the Context-I2W mapper on image-caption pairs (``python -m engine train context-i2w``).

Pipeline:

1. pairs (image path, caption) from the offline ``captions`` set, a CSV/TSV/JSONL file of path +
   caption, or a CC3M-style folder (``xxx.jpg`` next to ``xxx.txt`` or ``xxx.json`` with ``caption``);
2. spaCy replaces each caption's subject with the placeholder (``engine.data.subjects``, cached);
   pairs without a subject are skipped and counted;
3. the frozen backbone encodes every image once: embedding (float32) and visual tokens (float16),
   cached on disk by backbone fingerprint and image content; the context embeddings (the text
   encoder's embeddings of the subject-replaced captions) are cached the same way;
4. only the mapper trains: S* = mapper(context, tokens); the prompt ``"a photo of *"`` with S* is encoded
   by the frozen text encoder and matched to the image embedding with a symmetric InfoNCE loss at the
   backbone's logit scale. AdamW, linear warm-up + cosine schedule, AMP on CUDA, a checkpoint every
   epoch (``--out``) and a resumable state (``--run-dir``, ``--resume``).

``--checkpoint FILE`` starts from the authors' released ``IM2TEXT_OWM_Attn`` checkpoint (mapped onto
our module); with ``--epochs 0`` it only converts it to our checkpoint format for the live backbone.

Evaluation helpers used by ``python -m engine eval`` / ``bench``: :func:`evaluate_pairs` (held-out
"a photo of S*" -> image retrieval), :func:`evaluate_context_i2w` (composed retrieval R@K against the
image-only, text-only and sum baselines on triplets); its latency is `engine/bench/context_i2w.py`.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from ..compose.context_i2w import (ContextI2WComposer, ContextI2WConfig, ContextI2WMapper, build_prompt,
                                   checkpoint_name, count_parameters, load_authors_checkpoint, save_checkpoint)
from ..config import Settings
from ..errors import CheckpointError, InputError
from ..fileio import atomic_write_bytes
from .budget import another_epoch_fits

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
PATH_KEYS = ("image", "path", "file", "filepath", "filename", "img")
CAPTION_KEYS = ("caption", "text", "title", "name", "title_text")

# Small configuration for the packaged offline backbone (checkpoint <= 25 MB as float16).
SMALL_CONFIG = dict(depth=1, heads=4, dim_head=32, num_latents=4, ff_mult=0.5, middle_dim=384, n_layer=2)


# -- data ------------------------------------------------------------------------------------------------


@dataclass
class Pair:
    path: Path
    caption: str


def _pick(rec: dict, keys: Sequence[str], what: str, source: str):
    for k in keys:
        if k in rec and rec[k] not in (None, ""):
            return rec[k]
    raise InputError(f"{source}: a record has no {what} field (tried {', '.join(keys)})")


def _pairs_from_records(records: List[dict], root: Path, source: str) -> List[Pair]:
    out = []
    for rec in records:
        p = Path(str(_pick(rec, PATH_KEYS, "image path", source)))
        cap = _pick(rec, CAPTION_KEYS, "caption", source)
        if isinstance(cap, list):
            cap = cap[0] if cap else ""
        out.append(Pair(p if p.is_absolute() else root / p, str(cap)))
    return out


def read_pair_file(path: Path, image_root: Optional[Path] = None) -> List[Pair]:
    """CSV/TSV (header with an image-path and a caption column) or JSONL of path + caption."""
    from ..data.formats import read_jsonl

    path = Path(path)
    root = Path(image_root) if image_root else path.parent
    if path.suffix.lower() in (".jsonl", ".json"):
        return _pairs_from_records(read_jsonl(path), root, path.name)
    if path.suffix.lower() in (".csv", ".tsv", ".txt"):
        with open(path, newline="", encoding="utf-8") as f:
            head = f.readline()
            f.seek(0)
            delim = "\t" if (path.suffix.lower() == ".tsv" or "\t" in head) else ","
            rows = list(csv.DictReader(f, delimiter=delim))
        if not rows:
            raise InputError(f"{path.name} has no rows")
        return _pairs_from_records([{k.strip().lower(): v for k, v in r.items() if k} for r in rows], root, path.name)
    raise InputError(f"{path.name}: expected a .csv, .tsv or .jsonl file of image path + caption")


def read_pair_folder(folder: Path) -> List[Pair]:
    """CC3M-style folders (img2dataset layout): ``<key>.jpg`` with ``<key>.txt`` or ``<key>.json``."""
    out = []
    for img in sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES):
        txt, js = img.with_suffix(".txt"), img.with_suffix(".json")
        cap = None
        if txt.is_file():
            cap = txt.read_text(encoding="utf-8", errors="replace").strip()
        elif js.is_file():
            try:
                cap = json.loads(js.read_text(encoding="utf-8")).get("caption")
            except (json.JSONDecodeError, AttributeError):
                cap = None
        if cap:
            out.append(Pair(img, str(cap)))
    if not out:
        raise InputError(f"no image + caption pairs (x.jpg next to x.txt / x.json) under {Path(folder).name}")
    return out


def recoloured_pairs(split: str = "train") -> List[Pair]:
    """The offline CIR set's recoloured images with a caption that names the new colour
    ("blue hammer, a tool"): the colour edits are images the captions set does not hold."""
    from ..data.builders import ensure_built
    from ..data.cir_triplets import load_offline_cir

    ensure_built("cir")  # the explicit build step (quick when built)
    out, seen = [], set()
    for t in load_offline_cir(split, hold_out=True):  # held-out sources: engine.data.heldout
        cap = t.meta.get("reference_caption")
        if t.meta.get("kind") != "recolour" or not cap:
            continue
        for target in t.targets:
            if target not in seen:
                seen.add(target)
                out.append(Pair(Path(target), f"{t.meta['attribute']} {cap}"))
    return out


def load_pairs(spec: str, split: str = "train", image_root: Optional[str] = None) -> List[Pair]:
    """``captions`` (offline set, one split), ``recoloured`` (the offline CIR set's colour edits), several
    of these joined by ``+``, a pair file, or a CC3M-style folder."""
    if "+" in spec and not Path(spec).exists():
        return [p for part in spec.split("+") for p in load_pairs(part, split, image_root)]
    if spec == "recoloured":
        return recoloured_pairs(split)
    if spec == "captions":
        from ..data import formats
        from ..data.builders import ensure_built

        from ..data.heldout import is_held_out

        ensure_built("captions")  # the explicit build step (quick when built)
        records = [r for r in formats.load_split("captions", split) if not is_held_out(r.get("source", ""))]
        return _pairs_from_records(records, formats.image_root("captions"), f"captions/{split}")
    path = Path(spec)
    if path.is_dir():
        return read_pair_folder(path)
    if path.is_file():
        return read_pair_file(path, Path(image_root) if image_root else None)
    raise InputError(f"training data {spec!r} is neither 'captions' nor an existing file or folder")


def split_pairs(pairs: List[Pair], val_fraction: float, seed: int = 0) -> Tuple[List[Pair], List[Pair]]:
    """Deterministic split disjoint by image path."""
    def bucket(p: Pair) -> float:
        h = hashlib.sha1(f"{seed}:{p.path}".encode()).hexdigest()
        return int(h[:8], 16) / 0xFFFFFFFF

    val = [p for p in pairs if bucket(p) < val_fraction]
    train = [p for p in pairs if bucket(p) >= val_fraction]
    return train, val


# -- cached features ---------------------------------------------------------------------------------------


def _cache_root() -> Path:
    from ..config import cache_dir

    return cache_dir() / "context_i2w"


def _save_npy(path: Path, arr: np.ndarray) -> None:
    from ..fileio import atomic_save_npy

    atomic_save_npy(path, arr)


def image_features(backbone, paths: Sequence[Path], batch_size: int = 32, cache: bool = True,
                   progress: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """(embeddings float32 (N, D), visual tokens float16 (N, 1+P, W)) in the order of ``paths``.

    Cached per image in ``<cache>/context_i2w/features/<backbone key>/<sha[:2]>/<sha>.npz`` (image content
    hash), so data sets that are rebuilt, re-split or share images reuse earlier work.
    """
    from tqdm.auto import tqdm

    from ..images import load_image, sha256_file

    hashes = [sha256_file(p) for p in paths]
    bkey = hashlib.sha256(backbone.fingerprint.encode()).hexdigest()[:16]
    folder = _cache_root() / "features" / bkey
    found: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
    if cache:
        for h in dict.fromkeys(hashes):
            f = folder / h[:2] / f"{h}.npz"
            if f.is_file():
                try:
                    with np.load(f, allow_pickle=False) as z:
                        found[h] = (z["emb"], z["tokens"])
                except (OSError, ValueError, KeyError):
                    pass  # damaged: recompute
    todo = [i for i, h in enumerate(hashes) if h not in found]
    todo = list({hashes[i]: i for i in todo}.values())
    with tqdm(total=len(todo), desc="image features", unit="img", disable=not progress or not todo) as bar:
        for i in range(0, len(todo), batch_size):
            chunk = todo[i:i + batch_size]
            pixels = torch.stack([backbone.preprocess(load_image(paths[j])) for j in chunk])
            with torch.no_grad():
                e, t = backbone.encode_images_with_tokens(pixels)
            e = e.float().cpu().numpy()
            t = t.cpu().to(torch.float16).numpy()
            for k, j in enumerate(chunk):
                found[hashes[j]] = (e[k], t[k])
                if cache:
                    f = folder / hashes[j][:2] / f"{hashes[j]}.npz"
                    buf = io.BytesIO()
                    np.savez(buf, emb=e[k], tokens=t[k])
                    atomic_write_bytes(f, buf.getvalue())
            bar.update(len(chunk))
    if not paths:
        return np.zeros((0, backbone.embed_dim), np.float32), np.zeros((0, 1, backbone.vision_width), np.float16)
    emb = np.stack([found[h][0] for h in hashes]).astype(np.float32)
    tok = np.stack([found[h][1] for h in hashes]).astype(np.float16)
    return emb, tok


def text_embeddings(backbone, texts: Sequence[str], batch_size: int = 128, cache: bool = True,
                    progress: bool = False) -> np.ndarray:
    """Frozen text-encoder embeddings (N, D) float32, cached by fingerprint + texts."""
    from tqdm.auto import tqdm

    key = hashlib.sha256("\n".join([backbone.fingerprint] + list(texts)).encode()).hexdigest()[:24]
    path = _cache_root() / "texts" / f"{key}.npy"
    if cache and path.is_file():
        try:
            return np.load(path)
        except (OSError, ValueError):
            pass
    out = []
    for i in tqdm(range(0, len(texts), batch_size), desc="context embeddings", disable=not progress):
        out.append(backbone.encode_texts(list(texts[i:i + batch_size])).embeddings.float().cpu().numpy())
    arr = np.concatenate(out) if out else np.zeros((0, backbone.embed_dim), np.float32)
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        _save_npy(path, arr)
    return arr


@dataclass
class PairFeatures:
    """Everything training needs, aligned by row."""

    emb: np.ndarray  # (N, D) float32, L2-normalised image embeddings
    tokens: np.ndarray  # (N, 1+P, W) float16 visual tokens
    context: np.ndarray  # (N, D) float32 context embeddings of the subject-replaced captions
    captions: List[str]
    replaced: List[str]
    paths: List[str]
    skipped_no_subject: int = 0

    def __len__(self) -> int:
        return len(self.captions)


def prepare_features(backbone, pairs: Sequence[Pair], batch_size: int = 32, cache: bool = True,
                     progress: bool = True) -> PairFeatures:
    """Subject replacement, image features and context embeddings for ``pairs`` (no-subject pairs dropped)."""
    from ..data.subjects import replace_subjects

    if not pairs:
        raise InputError("no image-caption pairs to use")
    replaced, stats = replace_subjects([p.caption for p in pairs], backbone.placeholder, cache=cache,
                                       progress=progress)
    keep = [i for i, r in enumerate(replaced) if r is not None and r.count(backbone.placeholder) == 1]
    if not keep:
        raise InputError("spaCy found no subject in any caption; nothing to train on")
    kept = [pairs[i] for i in keep]
    emb, tok = image_features(backbone, [p.path for p in kept], batch_size, cache, progress)
    ctx = text_embeddings(backbone, [replaced[i] for i in keep], cache=cache, progress=progress)
    return PairFeatures(emb, tok, ctx, [p.caption for p in kept], [replaced[i] for i in keep],
                        [str(p.path) for p in kept], skipped_no_subject=len(pairs) - len(keep))


# -- training ---------------------------------------------------------------------------------------------


@dataclass
class TrainConfig:
    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-4
    weight_decay: float = 0.1
    warmup_steps: int = 50
    seed: int = 0
    grad_clip: float = 1.0
    amp: bool = True  # only used on CUDA
    global_dropout: float = 0.0  # see pseudo_prompt_embeddings
    cosine_weight: float = 0.0  # + this * mean(1 - cos(prompt embedding, image embedding)) (a direct fit)
    gate_init: float = 0.0  # tanh(gate) at the start (the paper's code starts at 0)
    local_zero_init: bool = False  # the local branch's last layer starts at zero (its output starts at 0)


def contrastive_loss(image: torch.Tensor, text: torch.Tensor, scale: float) -> torch.Tensor:
    """Symmetric InfoNCE between matching rows of two L2-normalised batches."""
    logits = scale * image @ text.t()
    target = torch.arange(image.shape[0], device=image.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target))


def _batch(feats: PairFeatures, idx: np.ndarray, device: str):
    idx = np.sort(idx)
    emb = torch.from_numpy(np.asarray(feats.emb[idx])).to(device).float()
    tok = torch.from_numpy(np.asarray(feats.tokens[idx])).to(device).float()
    ctx = torch.from_numpy(np.asarray(feats.context[idx])).to(device).float()
    return emb, tok, ctx


def pseudo_prompt_embeddings(backbone, mapper: ContextI2WMapper, tokens: torch.Tensor, context: torch.Tensor,
                             prompt: Optional[str] = None, global_dropout: float = 0.0) -> torch.Tensor:
    """L2-normalised text embeddings of ``prompt`` (default: the training prompt) with each row's S*.

    ``global_dropout`` (training only): the share of rows whose global branch is dropped, so S* comes
    from the local branch alone for them, so the local branch has to carry the image. With the gate at 0 that
    does nothing (those rows get S* = 0 and the local branch no gradient); it is meant for a gate started open
    (``gate_init``) with the local branch's output started at zero (``local_zero_init``): docs/context_i2w.md."""
    s = mapper(context, tokens, global_dropout)
    prompt = prompt or build_prompt(mapper.config, None)
    return backbone.encode_texts_with_pseudo([prompt] * s.shape[0], s.float())


def _param_groups(mapper: ContextI2WMapper, weight_decay: float):
    decay, no_decay = [], []
    for name, p in mapper.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if (p.dim() < 2 or "norm" in name or name.endswith(".g")) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _schedule(total: int, warmup: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(1, warmup)
        t = (step - warmup) / max(1, total - warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    return f


def _atomic_torch_save(obj, path: Path) -> None:
    from ..fileio import atomic_path

    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def train_mapper(backbone, mapper: ContextI2WMapper, feats: PairFeatures, cfg: TrainConfig,
                 out: Optional[Path] = None, run_dir: Optional[Path] = None, resume: bool = False,
                 progress: bool = True, half: bool = False, extra: Optional[dict] = None,
                 max_steps: Optional[int] = None, val_feats: Optional["PairFeatures"] = None) -> List[dict]:
    """Trains ``mapper`` in place; returns the history (one dict per epoch: loss, lr, seconds).

    ``val_feats``: held-out pairs; after every epoch their pseudo-word R@10 is recorded, and the mapper
    ends with the weights of the best epoch by it (ties: the later epoch).

    ``out``: checkpoint file written every epoch. ``run_dir``: ``state.pt`` (mapper, optimiser,
    scheduler, epoch, history) for ``resume``. The backbone stays frozen: only the mapper's
    parameters are given to the optimiser, and gradients reach them through the pseudo-token only.
    """
    from tqdm.auto import tqdm

    device = backbone.device
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    mapper.to(device).train()
    n = len(feats)
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
    history: List[dict] = []
    start_epoch, step = 0, 0
    state_path = Path(run_dir) / "state.pt" if run_dir else None
    if resume and state_path is not None and state_path.is_file():
        try:
            st = torch.load(state_path, map_location=device, weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"{state_path.name}: cannot resume ({exc.__class__.__name__})") from None
        if st.get("backbone_fingerprint") != backbone.fingerprint:
            raise CheckpointError(f"{state_path.name} belongs to backbone {st.get('backbone_fingerprint')!r}, "
                                  f"not {backbone.fingerprint!r}")
        if st.get("config") != json.dumps(asdict(mapper.config), sort_keys=True):
            raise CheckpointError(f"{state_path.name} was written for another mapper config")
        mapper.load_state_dict(st["mapper"])
        opt.load_state_dict(st["optimizer"])
        sched.load_state_dict(st["scheduler"])
        start_epoch, step, history = int(st["epoch"]), int(st["step"]), list(st["history"])
        rng = np.random.default_rng(cfg.seed + start_epoch)
    else:
        with torch.no_grad():
            if cfg.gate_init:
                mapper.gate.fill_(math.atanh(cfg.gate_init))
            if cfg.local_zero_init:
                mapper.local_branch.out.weight.zero_()
                mapper.local_branch.out.bias.zero_()
    scale = float(backbone.logit_scale)
    best = None
    for epoch in range(start_epoch, cfg.epochs):
        if max_steps is not None and step >= max_steps:
            break
        order = rng.permutation(n)
        t0, seen, losses = time.time(), 0, []
        bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=not progress)
        for b in bar:
            if max_steps is not None and step >= max_steps:
                break
            emb, tok, ctx = _batch(feats, order[b * bs:(b + 1) * bs], device)
            with torch.autocast("cuda", dtype=amp_dtype, enabled=use_amp):
                txt = pseudo_prompt_embeddings(backbone, mapper, tok, ctx, global_dropout=cfg.global_dropout)
                loss = contrastive_loss(emb, txt.float(), scale)
                if cfg.cosine_weight:
                    loss = loss + cfg.cosine_weight * (1 - (emb * txt.float()).sum(-1)).mean()
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            if cfg.grad_clip:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(mapper.parameters(), cfg.grad_clip)
            scaler.step(opt)
            scaler.update()
            sched.step()
            step += 1
            seen += emb.shape[0]
            losses.append(float(loss.detach()))
            bar.set_postfix(loss=f"{losses[-1]:.3f}", img_s=f"{seen / max(time.time() - t0, 1e-6):.0f}",
                            gate=f"{mapper.gate_value():+.3f}")
        bar.close()
        rec = {"epoch": epoch + 1, "step": step, "loss": float(np.mean(losses)) if losses else float("nan"),
               "lr": float(sched.get_last_lr()[0]), "seconds": round(time.time() - t0, 2),
               "gate": mapper.gate_value()}
        if val_feats is not None and len(val_feats):
            rec["val_R@10"] = evaluate_pairs(backbone, mapper, val_feats)["context-i2w"]["R@10"]
            if best is None or rec["val_R@10"] >= best[0]:
                best = (rec["val_R@10"], epoch + 1, {k: v.detach().clone() for k, v in mapper.state_dict().items()})
            mapper.train()
        history.append(rec)
        if out is not None:
            save_checkpoint(out, mapper.eval(), backbone, {"training": {"history": history, **(extra or {})}},
                            half=half)
            mapper.train()
        if state_path is not None:
            _atomic_torch_save({"mapper": mapper.state_dict(), "optimizer": opt.state_dict(),
                                "scheduler": sched.state_dict(), "epoch": epoch + 1, "step": step,
                                "history": history, "backbone_fingerprint": backbone.fingerprint,
                                "config": json.dumps(asdict(mapper.config), sort_keys=True)}, state_path)
        if not another_epoch_fits(time.time() - t0):
            break  # the time limit of `prepare`: the checkpoint holds the epochs done
    if best is not None:
        mapper.load_state_dict(best[2])
        history[-1]["best_epoch"] = best[1]  # the weights kept
    mapper.eval()
    return history


# -- evaluation --------------------------------------------------------------------------------------------


def _recall(scores: np.ndarray, targets: Sequence[Sequence[int]], ks: Sequence[int],
            exclude: Optional[Sequence[int]] = None) -> Dict[str, float]:
    """R@K (percent): a query counts when any of its targets ranks in the top K (``exclude`` removed)."""
    from ..eval.metrics import first_hit_ranks, recall_from_ranks

    scores = np.asarray(scores, dtype=np.float64)
    positive = np.zeros(scores.shape, dtype=bool)
    for i, ts in enumerate(targets):
        positive[i, list(ts)] = True
    excluded = None
    if exclude is not None:
        excluded = np.zeros(scores.shape, dtype=bool)
        for i, e in enumerate(exclude):
            if e is not None and e >= 0:
                excluded[i, e] = True
    return recall_from_ranks(first_hit_ranks(scores, positive, excluded), ks)


@torch.no_grad()
def evaluate_pairs(backbone, mapper: ContextI2WMapper, feats: PairFeatures, ks: Sequence[int] = (1, 5, 10),
                   batch_size: int = 64) -> Dict[str, Dict[str, float]]:
    """Held-out pseudo-word retrieval: "a photo of S*" (S* from image i and its caption's context) must find
    image i among the held-out images. The caption's text-only retrieval is reported alongside; the
    image-only baseline is trivially perfect on this task and is therefore not reported."""
    mapper.eval()
    device = backbone.device
    q = []
    for i in range(0, len(feats), batch_size):
        idx = np.arange(i, min(i + batch_size, len(feats)))
        _, tok, ctx = _batch(feats, idx, device)
        q.append(pseudo_prompt_embeddings(backbone, mapper, tok, ctx).float().cpu())
    q = torch.cat(q).numpy()
    gallery = np.asarray(feats.emb, dtype=np.float32)
    targets = [[i] for i in range(len(feats))]
    caps = text_embeddings(backbone, feats.captions)
    return {"context-i2w": _recall(q @ gallery.T, targets, ks), "text (caption)": _recall(caps @ gallery.T, targets, ks)}


def local_share(mapper: ContextI2WMapper, feats: PairFeatures, batch_size: int = 256) -> float:
    """Median over ``feats`` of ||tanh(gate) · local|| / ||global||: how much of S* the local branch carries
    (0 when the gate is closed or the local branch outputs nothing)."""
    mapper.eval()
    ratios = []
    with torch.no_grad():
        for i in range(0, len(feats), batch_size):
            _, tok, ctx = _batch(feats, np.arange(i, min(i + batch_size, len(feats))), mapper.gate.device)
            g, loc = mapper.parts(ctx, tok)
            ratios.append((torch.tanh(mapper.gate) * loc).norm(dim=-1) / g.norm(dim=-1).clamp_min(1e-12))
    return float(torch.cat(ratios).median()) if ratios else float("nan")


def evaluate_context_i2w(backbone, mapper: ContextI2WMapper, triplets: Sequence[dict],
                         gallery: Optional[Sequence[str]] = None, ks: Sequence[int] = (1, 5, 10),
                         alpha: float = 0.5, progress: bool = True,
                         ablations: bool = True) -> Dict[str, Dict[str, float]]:
    """Composed retrieval R@K of Context-I2W and the image-only, text-only and sum baselines; with
    ``ablations`` also Context-I2W with its local branch off and with the image removed.

    ``triplets``: dicts with ``reference`` (image path), ``text`` and ``targets`` (list of image paths)
    or ``target``. ``gallery``: image paths searched (default: every reference and target). The
    reference image itself is removed from each query's ranking (as in CIRR).
    """
    from tqdm.auto import tqdm

    from ..compose.base import COMPOSERS, Query

    def targets_of(t):
        ts = t.get("targets", t.get("target"))
        return [str(x) for x in (ts if isinstance(ts, (list, tuple)) else [ts])]

    if not triplets:
        raise InputError("no triplets to evaluate")
    if gallery is None:
        seen = {}
        for t in triplets:
            for p in [str(t["reference"])] + targets_of(t):
                seen.setdefault(p, None)
        gallery = list(seen)
    gallery = list(dict.fromkeys(str(g) for g in gallery))
    gallery += [p for p in dict.fromkeys(x for t in triplets for x in targets_of(t)) if p not in set(gallery)]
    pos = {p: i for i, p in enumerate(gallery)}
    refs = sorted({str(t["reference"]) for t in triplets})
    g_emb, _ = image_features(backbone, [Path(p) for p in gallery], progress=progress)
    r_emb, r_tok = image_features(backbone, [Path(p) for p in refs], progress=progress)
    rpos = {p: i for i, p in enumerate(refs)}
    import copy

    composers = {"context-i2w": ContextI2WComposer(backbone, mapper.eval())}
    if ablations:
        # the local branch switched off (gate 0), and the image removed (every query gets the mean visual
        # tokens of the references, so S* carries nothing of its own image)
        no_local = copy.deepcopy(mapper).eval()
        with torch.no_grad():
            no_local.gate.zero_()
        composers["context-i2w (local branch off)"] = ContextI2WComposer(backbone, no_local)
        composers["context-i2w (image removed)"] = ContextI2WComposer(backbone, mapper.eval())
        mean_tok = torch.from_numpy(np.asarray(r_tok, dtype=np.float32).mean(0))
    for name in ("image", "text", "sum"):
        composers[name] = COMPOSERS.get(name)(backbone)
    vecs = {name: [] for name in composers}
    for t in tqdm(triplets, desc="composed queries", disable=not progress):
        r = rpos[str(t["reference"])]
        query = Query(text=str(t["text"]), image_embedding=torch.from_numpy(np.array(r_emb[r])),
                      image_tokens=torch.from_numpy(np.array(r_tok[r])).float(), has_image=True, alpha=alpha)
        for name, comp in composers.items():
            q = query
            if name == "context-i2w (image removed)":
                q = Query(text=query.text, image_embedding=query.image_embedding, image_tokens=mean_tok,
                          has_image=True, alpha=alpha)
            vecs[name].append(comp.compose(q).vector)
    targets = [[pos[p] for p in targets_of(t) if p in pos] for t in triplets]
    exclude = [pos.get(str(t["reference"]), -1) for t in triplets]
    return {name: _recall(np.stack(v) @ np.asarray(g_emb).T, targets, ks, exclude) for name, v in vecs.items()}


# -- command line ------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    d, t = ContextI2WConfig(vision_width=1, token_dim=1, context_dim=1), TrainConfig()
    ap = argparse.ArgumentParser(prog="python -m engine train context-i2w", description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="captions", help="'captions' (offline set), 'recoloured' (the offline CIR set's colour edits), "
                    "'captions+recoloured', a CSV/TSV/JSONL file or a CC3M-style folder")
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


def cir_queries(split: str) -> Dict[str, Tuple[List[dict], List[str]]]:
    """The offline ``cir`` set's split as {gallery name: (triplets, gallery image paths)}."""
    from ..data import formats
    from ..data.builders import ensure_built

    from ..data.heldout import held_out_cir_images, keep_row

    ensure_built("cir")  # the explicit build step (quick when built)
    held = held_out_cir_images()  # the held-out sources (engine.data.heldout) are left out
    groups: Dict[str, Tuple[List[dict], List[str]]] = {}
    for r in formats.load_split("cir", split):
        ts = r.get("targets", r.get("target"))
        ts = ts if isinstance(ts, list) else [ts]
        if not keep_row([r["reference"], *ts], held):
            continue
        trip = {"reference": str(formats.image_path("cir", r["reference"])), "text": r.get("text", ""),
                "targets": [str(formats.image_path("cir", x)) for x in ts]}
        groups.setdefault(r.get("gallery", "all"), ([], []))[0].append(trip)
    try:
        gallery = formats.load_split("cir", f"{split}_gallery")
    except InputError:
        gallery = []
    for g in gallery:
        name = g.get("gallery", "all")
        if name in groups and g["image"] not in held:
            groups[name][1].append(str(formats.image_path("cir", g["image"])))
    return groups


def evaluate_cir(backbone, mapper: ContextI2WMapper, split: str = "test", progress: bool = True) -> Dict[str, dict]:
    """Composed retrieval on the offline ``cir`` split, per gallery and pooled (query-weighted)."""
    out: Dict[str, dict] = {}
    total = 0
    pooled: Dict[str, Dict[str, float]] = {}
    for name, (trip, gallery) in sorted(cir_queries(split).items()):
        res = evaluate_context_i2w(backbone, mapper, trip, gallery or None, progress=progress)
        out[name] = {"n": len(trip), "gallery": len(gallery), "recall": res}
        total += len(trip)
        for method, rec in res.items():
            for k, v in rec.items():
                pooled.setdefault(method, {}).setdefault(k, 0.0)
                pooled[method][k] += v * len(trip)
    out["all"] = {"n": total, "recall": {m: {k: v / max(total, 1) for k, v in r.items()} for m, r in pooled.items()}}
    return out


def _offline(spec: str) -> bool:
    return all(part in ("captions", "recoloured") for part in spec.split("+"))


def main(argv: Optional[Sequence[str]] = None) -> int:
    from ..backbones.factory import create_backbone
    from ..config import Settings

    args = _parser().parse_args(argv)
    progress = not args.quiet
    backbone = create_backbone(args.backbone, args.device)
    out_dir = Path(args.out or Settings().checkpoints)
    name = args.name or checkpoint_name(backbone.name)
    out = out_dir / name
    run_dir = Path(args.run_dir) if args.run_dir else _cache_root() / "runs" / Path(name).stem
    record: Dict[str, object] = {"command": "python -m engine train context-i2w " + " ".join(argv or sys.argv[1:]),
                                 "backbone": backbone.name, "data": args.data}

    if args.eval_only:
        from ..compose.context_i2w import load_checkpoint

        mapper, _ = load_checkpoint(out, backbone.fingerprint)
        args.epochs = 0
    elif args.checkpoint:
        mapper, info = load_authors_checkpoint(args.checkpoint, backbone, template=args.template)
        record["init"] = info["file"]
    else:
        torch.manual_seed(args.seed)
        mapper = ContextI2WMapper(_mapper_config(args, backbone))
    print(f"Context-I2W mapper: {count_parameters(mapper):,} parameters on {backbone.name}", file=sys.stderr)

    val: List[Pair] = []
    if args.eval_only:
        if _offline(args.data) and args.val_split:
            val = load_pairs("captions", args.val_split)
        elif not _offline(args.data) and args.val_fraction > 0:
            val = split_pairs(load_pairs(args.data, args.split, args.image_root), args.val_fraction, args.seed)[1]
    elif args.epochs > 0 or not args.checkpoint:
        train = load_pairs(args.data, args.split, args.image_root)
        if _offline(args.data):
            val = load_pairs("captions", args.val_split) if args.val_split else []
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
        history = train_mapper(backbone, mapper, feats, cfg, out=out, run_dir=run_dir, resume=args.resume,
                               progress=progress, half=args.half, extra=record, val_feats=vsel)
        record["history"] = history
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
    record["held_out"] = results
    if not args.eval_only:
        if _offline(args.data):
            from ..data.heldout import HELD_OUT_SOURCES

            record["held_out_sources"] = list(HELD_OUT_SOURCES)
        save_checkpoint(out, mapper, backbone, {"training": record}, half=args.half)
        if _offline(args.data) and not args.no_anchor:
            from .anchor_fit import anchor_checkpoint

            anchor_checkpoint(backbone, "context-i2w", out_dir, progress=progress)
    print(json.dumps({"checkpoint": str(out), "held_out": results}, indent=2, default=str))
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(json.dumps(record, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
