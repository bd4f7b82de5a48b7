"""Training and evaluation of the RTIC composer (``python -m engine train rtic``).

Trains on precomputed (reference, text, target) embeddings of a frozen backbone
(:class:`engine.data.cir_triplets.TripletSet`).

* main-stream loss: DML loss -- softmax cross-entropy of the normalised composed vector against every
  target of the batch (K = B) with a learnable temperature; rows that share the target image or the
  query are masked out of each other's negatives. Option: batch-hard triplet loss.
* ``--gcn``: stage 1 trains plain RTIC; stage 2 builds the sparse correlation graph
  (:mod:`engine.train.gcn_graph`) and trains a freshly initialised RTIC (``--gcn-init stage1`` to start
  from stage 1 instead) together with the GCN stream; total loss = pair_weight * pair loss +
  gcn_weight * BCE. The GCN stream is dropped afterwards: the checkpoint holds only the main stream.
* optimiser: AdamW (default) or SGD (momentum 0.9) with a step decay x gamma every ``step_every``
  epochs (the paper's unified setting: SGD, lr 0.01, gamma 1/sqrt(2), every 10 epochs).
* ``--tone-edits`` (``--data cir``): the training split's photos also become tone-edit triplets
  (:func:`engine.data.tone.tone_triplets`: photo + "at night" / "in black and white" -> its own edited
  version), because the offline CIR set has colour edits but no light or tone edits. With ``--data cir`` the
  held-out report also ranks the held-out split's photos' tone edits among every version of those photos
  (``held_out_tone``), trained with them or not.
* a run folder (``runs/rtic/<name>`` by default) keeps ``state.pt`` after every epoch for ``--resume``
  and ``history.json``; the final model goes to ``<out>/rtic[-gcn]-<backbone>.safetensors``.

:func:`evaluate_rtic` gives R@1/R@10/R@50 of RTIC models and the training-free baselines (image,
text, sum) on a held-out split.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from ..compose.rtic import RTIC, RTICConfig, checkpoint_name, count_parameters, save_checkpoint
from ..config import Settings
from ..data.cir_triplets import TripletSet
from ..errors import CheckpointError, InputError
from ..eval.metrics import first_hit_ranks, recall_from_ranks
from .budget import another_epoch_fits
from .gcn_graph import CorrelationGraph, GCNStream, build_graph, gcn_bce_loss


@dataclass
class TrainConfig:
    epochs: int = 30
    batch_size: int = 64
    optimizer: str = "adamw"  # adamw | sgd
    lr: float = 1e-3
    weight_decay: float = 1e-4
    momentum: float = 0.9
    step_every: int = 10
    step_gamma: float = 1.0 / math.sqrt(2.0)
    loss: str = "dml"  # dml | triplet
    margin: float = 0.2
    cos_weight: float = 0.0  # + cos_weight * mean(1 - cos(composed, target)): keeps outputs near the images
    seed: int = 0
    # GCN stream
    gcn: bool = False
    gcn_layers: int = 2
    gcn_weight: float = 1.0
    pair_weight: float = 1.0
    density: float = 0.15
    p: float = 0.33
    correlation: str = "target"  # target (stage-1 target features) | composed (stage-1 outputs)
    gcn_init: str = "scratch"  # scratch | stage1
    gcn_epochs: int = 0  # stage-2 epochs (0: same as stage 1)
    gcn_batch_size: int = 0  # stage-2 batch size (0: same as stage 1)
    gcn_control: bool = False  # with gcn_init=stage1: also continue stage 1 without the stream (fair control)
    device: str = "cpu"

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# -- losses ----------------------------------------------------------------------------------------------


def negatives_mask(tgt: torch.Tensor, query: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(B, B) True where column j must not act as a negative of row i (same target or same query, j != i)."""
    same = tgt[:, None] == tgt[None, :]
    if query is not None:
        same = same | (query[:, None] == query[None, :])
    return same & ~torch.eye(len(tgt), dtype=torch.bool, device=tgt.device)


def dml_loss(
    composed: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor, mask: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """mean_i -log softmax_j(scale * cos(composed_i, target_j))[i]; masked columns are excluded."""
    logits = scale * F.normalize(composed, dim=1) @ F.normalize(targets, dim=1).T
    if mask is not None:
        logits = logits.masked_fill(mask, float("-inf"))
    return F.cross_entropy(logits, torch.arange(len(logits), device=logits.device))


def batch_hard_triplet_loss(
    composed: torch.Tensor, targets: torch.Tensor, margin: float = 0.2, mask: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """mean_i max(0, margin + d(i, i) - min_{j != i} d(i, j)) with cosine distance d = 1 - cos."""
    d = 1.0 - F.normalize(composed, dim=1) @ F.normalize(targets, dim=1).T
    excluded = torch.eye(len(d), dtype=torch.bool, device=d.device)
    if mask is not None:
        excluded = excluded | mask
    hardest = d.masked_fill(excluded, float("inf")).min(1).values
    return F.relu(margin + d.diagonal() - hardest).mean()


def pair_loss(model: RTIC, out: torch.Tensor, tgt_emb: torch.Tensor, mask: torch.Tensor, cfg: TrainConfig):
    if cfg.loss == "dml":
        loss = dml_loss(out, tgt_emb, model.logit_scale, mask)
    elif cfg.loss == "triplet":
        loss = batch_hard_triplet_loss(out, tgt_emb, cfg.margin, mask)
    else:
        raise InputError(f"unknown loss {cfg.loss!r}; use dml or triplet")
    if cfg.cos_weight:
        loss = loss + cfg.cos_weight * (1.0 - F.cosine_similarity(out, tgt_emb, dim=1)).mean()
    return loss


# -- training ----------------------------------------------------------------------------------------------


def make_optimizer(params, cfg: TrainConfig):
    if cfg.optimizer == "adamw":
        opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)
    elif cfg.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, foreach=True)
    else:
        raise InputError(f"unknown optimizer {cfg.optimizer!r}; use adamw or sgd")
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=max(1, cfg.step_every), gamma=cfg.step_gamma)
    return opt, sched


def _save_state(path: Path, state: dict) -> None:
    from ..fileio import atomic_path

    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def _load_state(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"cannot resume from {path.name}: {exc.__class__.__name__}") from None


def fit(
    model: RTIC,
    data: TripletSet,
    cfg: TrainConfig,
    graph: Optional[CorrelationGraph] = None,
    stream: Optional[GCNStream] = None,
    state_path: Optional[Path] = None,
    resume: bool = False,
    fingerprint: str = "",
    progress: bool = True,
    desc: str = "rtic",
) -> List[dict]:
    """Trains ``model`` (and ``stream`` when given) in place; returns the per-epoch history."""
    from tqdm.auto import tqdm

    if len(data) < 2:
        raise InputError("RTIC training needs at least 2 triplets")
    device = torch.device(cfg.device)
    model.to(device)
    params = list(model.parameters())
    a_hat = None
    if stream is not None:
        if graph is None or graph.n != len(data):
            raise ValueError("the GCN stream needs a graph with one node per training row")
        stream.to(device)
        params += list(stream.parameters())
        a_hat = graph.propagation().to(device)
        a_hat_t = graph.propagation_transposed().to(device)
        node_img, node_txt, _ = (t.to(device) for t in data.rows(torch.arange(len(data))))
    opt, sched = make_optimizer(params, cfg)
    history: List[dict] = []
    start = 0
    if resume and state_path is not None and state_path.is_file():
        state = _load_state(state_path)
        if state.get("fingerprint") != fingerprint or state.get("desc") != desc:
            raise CheckpointError(f"{state_path.name} belongs to another run or backbone; cannot resume")
        model.load_state_dict(state["model"])
        if stream is not None:
            stream.load_state_dict(state["stream"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        history = json.loads(state["history"])
        start = int(state["epoch"])
    gen = torch.Generator().manual_seed(cfg.seed)
    for _ in range(start):  # keep the shuffling sequence identical after a resume
        torch.randperm(len(data), generator=gen)
    bs = max(2, min(cfg.batch_size, len(data)))
    for epoch in range(start, cfg.epochs):
        model.train()
        if stream is not None:
            stream.train()
        perm = torch.randperm(len(data), generator=gen)
        n_batches = len(data) // bs  # drop the last incomplete batch (BatchNorm, K = B)
        sums = {"loss": 0.0, "pair": 0.0, "gcn": 0.0}
        t0 = time.perf_counter()
        bar = tqdm(range(n_batches), desc=f"{desc} {epoch + 1}/{cfg.epochs}", leave=False, disable=not progress)
        for b in bar:
            idx = perm[b * bs : (b + 1) * bs]
            ref, txt, tgt = (t.to(device) for t in data.rows(idx))
            mask = negatives_mask(data.tgt[idx], data.query[idx]).to(device)
            out = model(ref, txt)
            lp = pair_loss(model, out, tgt, mask, cfg)
            loss = cfg.pair_weight * lp if stream is not None else lp
            lg = torch.zeros(())
            if stream is not None:
                w = stream(node_img, node_txt, a_hat, a_hat_t)
                lg = gcn_bce_loss(out, w, graph.binary_rows(idx).to(device))
                loss = loss + cfg.gcn_weight * lg
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sums["loss"] += loss.item()
            sums["pair"] += lp.item()
            sums["gcn"] += lg.item()
            bar.set_postfix(loss=f"{loss.item():.4f}")
        sched.step()
        rec = {k: v / max(1, n_batches) for k, v in sums.items()}
        rec.update(epoch=epoch + 1, lr=opt.param_groups[0]["lr"], seconds=round(time.perf_counter() - t0, 2))
        history.append(rec)
        if state_path is not None:
            state = {
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "sched": sched.state_dict(),
                "epoch": epoch + 1,
                "history": json.dumps(history),
                "fingerprint": fingerprint,
                "desc": desc,
            }
            if stream is not None:
                state["stream"] = stream.state_dict()
            _save_state(state_path, state)
        if not another_epoch_fits(time.perf_counter() - t0):
            break  # the time limit of `prepare`
    model.eval()
    return history


@torch.no_grad()
def compose_all(model: RTIC, image: torch.Tensor, text: torch.Tensor, batch: int = 1024) -> torch.Tensor:
    """Eval-mode composed vectors (N, D), L2-normalised."""
    model.eval()
    outs = [model(image[i : i + batch], text[i : i + batch]) for i in range(0, len(image), batch)]
    return F.normalize(torch.cat(outs), dim=1)


def train_rtic(
    data: TripletSet,
    model_cfg: RTICConfig,
    cfg: TrainConfig,
    run_dir: Optional[Path] = None,
    resume: bool = False,
    fingerprint: str = "",
    progress: bool = True,
) -> Dict[str, object]:
    """Stage 1 (plain RTIC) and, with ``cfg.gcn``, stage 2 (RTIC + GCN stream).

    Returns ``{"models": {"rtic": ..., "rtic+gcn": ...}, "history": {...}, "graph": {...}}``.
    """
    torch.manual_seed(cfg.seed)
    result: Dict[str, object] = {"models": {}, "history": {}, "graph": None}
    model = RTIC(model_cfg)
    state1 = run_dir / "state-rtic.pt" if run_dir else None
    result["history"]["rtic"] = fit(model, data, cfg, state_path=state1, resume=resume,
                                    fingerprint=fingerprint, progress=progress, desc="rtic")
    result["models"]["rtic"] = model
    if not cfg.gcn:
        return result

    # stage 2: graph from stage-1 features
    ref, txt, tgt = data.rows(torch.arange(len(data)))
    if cfg.correlation == "target":
        feats = tgt  # frozen backbone: the stage-1 target features are the backbone's target embeddings
    elif cfg.correlation == "composed":
        feats = compose_all(model, ref, txt)
    else:
        raise InputError(f"unknown correlation {cfg.correlation!r}; use target or composed")
    t0 = time.perf_counter()
    graph = build_graph(feats, density=cfg.density, p=cfg.p, progress=progress)
    result["graph"] = {
        "nodes": graph.n,
        "edges": graph.nnz,
        "tau": graph.tau,
        "mean_degree_fraction": graph.mean_degree / graph.n,
        "MB": graph.nbytes() / 2**20,
        "build_s": round(time.perf_counter() - t0, 2),
    }
    torch.manual_seed(cfg.seed + 1)
    main = RTIC(model_cfg)
    if cfg.gcn_init == "stage1":
        main.load_state_dict(model.state_dict())
    elif cfg.gcn_init != "scratch":
        raise InputError(f"unknown gcn_init {cfg.gcn_init!r}; use scratch or stage1")
    stream = GCNStream(RTIC(model_cfg), model_cfg.dim, cfg.gcn_layers)  # independently initialised
    state2 = run_dir / "state-rtic-gcn.pt" if run_dir else None
    cfg2 = replace(cfg, epochs=cfg.gcn_epochs or cfg.epochs, batch_size=cfg.gcn_batch_size or cfg.batch_size)
    result["history"]["rtic+gcn"] = fit(main, data, cfg2, graph=graph, stream=stream, state_path=state2,
                                        resume=resume, fingerprint=fingerprint, progress=progress, desc="rtic+gcn")
    result["models"]["rtic+gcn"] = main  # the stream is dropped here
    if cfg.gcn_control and cfg.gcn_init == "stage1":
        control = RTIC(model_cfg)
        control.load_state_dict(model.state_dict())
        state3 = run_dir / "state-rtic-control.pt" if run_dir else None
        result["history"]["rtic-continued"] = fit(control, data, cfg2, state_path=state3, resume=resume,
                                                  fingerprint=fingerprint, progress=progress, desc="rtic-continued")
        result["models"]["rtic-continued"] = control  # evaluated, never saved
    return result


# -- evaluation --------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate_rtic(
    data: TripletSet,
    models: Optional[Dict[str, RTIC]] = None,
    ks: Sequence[int] = (1, 10, 50),
    alpha: float = 0.5,
    exclude_reference: bool = True,
    gallery_ids: Optional[torch.Tensor] = None,
) -> Dict[str, Dict[str, float]]:
    """Recall@K (in %) of the baselines (image, text, sum) and each RTIC model on a held-out split.

    Gallery = ``gallery_ids`` if given, else ``data.gallery`` (the split's gallery), else every
    reference and target image of the split; targets and references are always added to it. One
    query per (reference, text) with all its targets as positives; the reference itself is removed
    from its ranking (``exclude_reference``) unless it is also a target.
    """
    ref_ids, text_ids, targets = data.queries()
    base = gallery_ids if gallery_ids is not None else data.gallery
    parts = [data.ref, data.tgt] + ([base] if base is not None else [])
    gallery_ids = torch.unique(torch.cat(parts))
    position = {int(g): i for i, g in enumerate(gallery_ids)}
    gallery = F.normalize(data.images[gallery_ids].float(), dim=1)
    img = data.images[ref_ids].float()
    txt = data.texts[text_ids].float()
    queries = {
        "image": img,
        "text": txt,
        "sum": (1 - alpha) * F.normalize(img, dim=1) + alpha * F.normalize(txt, dim=1),
    }
    for name, model in (models or {}).items():
        queries[name] = compose_all(model, img, txt)
    positive = torch.zeros(len(ref_ids), len(gallery_ids), dtype=torch.bool)
    for q, tg in enumerate(targets):
        positive[q, [position[t] for t in tg]] = True
    ref_col = torch.tensor([position[int(r)] for r in ref_ids])
    excluded = None
    if exclude_reference:
        rows = torch.arange(len(ref_col))
        excluded = torch.zeros_like(positive)
        excluded[rows, ref_col] = ~positive[rows, ref_col]  # a reference that is also a target stays
        excluded = excluded.numpy()
    out = {}
    for name, q in queries.items():
        scores = (F.normalize(q, dim=1) @ gallery.T).numpy()
        ranks = first_hit_ranks(scores, positive.numpy(), excluded)
        out[name] = {k_: round(v, 2) for k_, v in recall_from_ranks(ranks, ks).items()}
    return out


# -- synthetic data ----------------------------------------------------------------------------------------


def synthetic_triplets(
    n_objects: int = 60, n_attributes: int = 6, dim: int = 32, noise: float = 0.05, seed: int = 0
) -> TripletSet:
    """Attribute-change triplets with a known ground truth.

    Image (o, a) = normalise(object_o + attribute_a + noise); text "make it a2" = normalise(word_a2 +
    noise) with word_a a fixed random rotation of attribute_a; the target of (image (o, a1), text a2)
    is image (o, a2). The right composition must remove a1 and add a2.
    """
    g = torch.Generator().manual_seed(seed)
    obj = F.normalize(torch.randn(n_objects, dim, generator=g), dim=1)
    att = F.normalize(torch.randn(n_attributes, dim, generator=g), dim=1)
    rot, _ = torch.linalg.qr(torch.randn(dim, dim, generator=g))
    images = F.normalize(
        obj[:, None, :] + 0.8 * att[None, :, :] + noise * torch.randn(n_objects, n_attributes, dim, generator=g), dim=2
    ).reshape(n_objects * n_attributes, dim)
    words = att @ rot
    n_texts = n_attributes
    texts = F.normalize(words + noise * torch.randn(n_texts, dim, generator=g), dim=1)
    ref, text, tgt = [], [], []
    for o in range(n_objects):
        for a1 in range(n_attributes):
            for a2 in range(n_attributes):
                if a1 != a2:
                    ref.append(o * n_attributes + a1)
                    text.append(a2)
                    tgt.append(o * n_attributes + a2)
    ref_t, text_t, tgt_t = (torch.tensor(x) for x in (ref, text, tgt))
    return TripletSet(images, texts, ref_t, text_t, tgt_t, torch.arange(len(ref)),
                      [f"obj{o}-att{a}" for o in range(n_objects) for a in range(n_attributes)],
                      [f"make it attribute {a}" for a in range(n_attributes)])


def split_by_reference_group(data: TripletSet, groups: torch.Tensor, held_out: float = 0.2, seed: int = 0):
    """Splits rows so that no image group (e.g. synthetic object) is in both parts: (train, test)."""
    g = torch.Generator().manual_seed(seed)
    uniq = torch.unique(groups)
    perm = uniq[torch.randperm(len(uniq), generator=g)]
    test_groups = perm[: max(1, int(round(held_out * len(uniq))))]
    is_test = torch.isin(groups, test_groups)
    return data.subset(torch.nonzero(~is_test).flatten()), data.subset(torch.nonzero(is_test).flatten())


# -- command line ------------------------------------------------------------------------------------------


def _load_triplets(args, split: str):
    """Triplets of one split and the split's gallery as [(path, gallery kind)] (empty if the set has none)."""
    from ..data import cir_triplets as ct

    report = ct.LoadReport()
    if args.data == "fashioniq":
        trips = ct.load_fashioniq(args.root, split, args.categories.split(","), both_orders=(split == args.train_split),
                                  report=report)
    elif args.data == "cirr":
        trips = ct.load_cirr(args.root, split, report=report)
    elif args.data == "jsonl":
        path = Path(args.root) / f"{split}.jsonl" if Path(args.root).is_dir() else Path(args.root)
        trips = ct.load_jsonl(path, args.image_root, report=report)
    elif args.data == "cir":
        from ..data.builders import ensure_built

        ensure_built("cir")  # the explicit build step (quick when built)
        trips = ct.load_offline_cir(split, report=report, hold_out=True)  # held-out sources: engine.data.heldout
    else:
        raise InputError(f"unknown data {args.data!r}")
    if report.missing_images:
        print(f"[{split}] skipped {report.missing_images} missing images (e.g. {', '.join(report.missing_examples)})")
    gallery = ct.load_offline_gallery(split, hold_out=True) if args.data == "cir" else []
    return trips, gallery


def tone_set(backbone, split: str, progress: bool = True):
    """The tone-edit queries of one split's photos of the offline CIR set, embedded: (TripletSet with the
    gallery of every photo in every version, triplets, gallery [(path, "tone")])."""
    from ..data.cir_triplets import embed_triplets
    from ..data.tone import offline_cir_photos, tone_triplets

    triplets, gallery = tone_triplets(offline_cir_photos(split, hold_out=True))
    if not triplets:
        raise InputError(f"the {split} split of the offline CIR set has no photos to make tone edits of")
    data = embed_triplets(backbone, triplets, progress=progress, gallery=[p for p, _ in gallery])
    return data, triplets, gallery


def evaluate_by_kind(data: TripletSet, triplets, gallery, models, ks=(1, 10, 50)) -> Dict[str, Dict]:
    """Held-out recalls per query kind (``meta['kind']``), each ranked against the gallery of its kind
    (``meta['gallery']``, e.g. twemoji vs photos) when the set defines one."""
    out: Dict[str, Dict] = {}
    kinds = sorted({str(t.meta.get("kind", "")) for t in triplets} - {""})
    key_to_id = {k: i for i, k in enumerate(data.image_keys)}
    for kind in kinds:
        qs = torch.tensor([i for i, t in enumerate(triplets) if t.meta.get("kind") == kind])
        rows = torch.nonzero(torch.isin(data.query, qs)).flatten()
        galleries = {str(triplets[i].meta.get("gallery", "")) for i in qs.tolist()}
        ids = [key_to_id[p] for p, g in gallery if g in galleries and p in key_to_id]
        sub = data.subset(rows)
        sub.gallery = torch.tensor(ids, dtype=torch.int64) if ids else None
        out[kind] = {"queries": int(len(qs)), **evaluate_rtic(sub, models, ks)}
    return out


def _held_out(data, triplets, gallery, models, label: str = ""):
    """(recalls per model, recalls per query kind) of ``data`` (None: both empty; no ``triplets``: no kinds),
    printed one line per model and per kind, each line starting with ``label``."""
    metrics = evaluate_rtic(data, models) if data is not None else {}
    by_kind = evaluate_by_kind(data, triplets, gallery, models) if data is not None and triplets is not None else {}
    for name, m in metrics.items():
        print(f"{label}{name:10s} " + "  ".join(f"{k}={v:6.2f}" for k, v in m.items()))
    for kind, ms in by_kind.items():
        print(f"[{label}{kind}: {ms['queries']} queries] " + "  ".join(
            f"{name} R@1/10={m['R@1']:.1f}/{m['R@10']:.1f}" for name, m in ms.items() if name != "queries"))
    return metrics, by_kind


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


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    from ..config import ROOT, Settings, resolve_device

    if args.memory:
        from .gcn_graph import measure_gcn_memory

        def show(r):
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}), flush=True)

        rows = measure_gcn_memory([int(x) for x in args.memory.split(",")], dim=args.synthetic_dim,
                                  progress=not args.quiet, on_row=show)
        if args.report:
            Path(args.report).write_text(json.dumps(rows, indent=2))
        return 0

    if args.tone_edits and args.data != "cir":
        raise InputError("--tone-edits needs --data cir: the tone edits are made from the offline CIR set's photos")
    device = resolve_device(args.device)
    cfg = TrainConfig.from_dict({**vars(args), "device": device})
    n_tone, tone = 0, None  # tone-edit training triplets; the held-out split's tone-edit set (cir only)
    test_trips = test_gallery = tone_trips_eval = tone_gallery = None  # held-out queries, where there are
    if args.data == "synthetic":
        full = synthetic_triplets(n_objects=args.synthetic_objects, dim=args.synthetic_dim, seed=args.seed)
        n_att = len(full.texts)
        train, test = split_by_reference_group(full, full.ref // n_att, seed=args.seed)
        fingerprint, backbone_name = f"synthetic@{args.synthetic_dim}-{args.seed}", "synthetic"
    else:
        from ..backbones import create_backbone
        from ..data.cir_triplets import embed_triplets

        backbone = create_backbone(args.backbone, device=device)
        fingerprint, backbone_name = backbone.fingerprint, backbone.name
        progress = not args.quiet
        train_trips, _ = _load_triplets(args, args.train_split)
        if args.tone_edits:
            from ..data.tone import offline_cir_photos, tone_triplets

            tone_trips = tone_triplets(offline_cir_photos(args.train_split, hold_out=True))[0]
            n_tone = len(tone_trips)
            train_trips = train_trips + tone_trips
        train = embed_triplets(backbone, train_trips, progress=progress, max_targets=args.max_targets)
        test = None
        if args.eval_split:
            test_trips, test_gallery = _load_triplets(args, args.eval_split)
            test = embed_triplets(backbone, test_trips, progress=progress, gallery=[p for p, _ in test_gallery])
            if args.data == "cir":
                tone, tone_trips_eval, tone_gallery = tone_set(backbone, args.eval_split, progress=progress)
    model_cfg = RTICConfig(
        dim=train.dim, n_blocks=args.n_blocks, inner_skip=not args.no_inner_skip, gating=not args.no_gate,
        text_proj=args.text_proj, image_proj=args.image_proj, negative_slope=args.leaky_slope,
    )
    slug = checkpoint_name(backbone_name).removeprefix("rtic-").removesuffix(".safetensors")
    run_dir = Path(args.run_dir) if args.run_dir else ROOT / "runs" / "rtic" / f"{args.data}-{slug}"
    run_dir.mkdir(parents=True, exist_ok=True)
    if n_tone:
        print(f"tone edits: {n_tone} of the training triplets (the {args.train_split} split's photos)")
    print(f"RTIC: {len(train)} training triplets, D={train.dim}, "
          f"{count_parameters(RTIC(model_cfg)):,} parameters, backbone {fingerprint}")
    result = train_rtic(train, model_cfg, cfg, run_dir=run_dir, resume=args.resume, fingerprint=fingerprint,
                        progress=not args.quiet)
    metrics, by_kind = _held_out(test, test_trips if args.data == "cir" else None, test_gallery, result["models"])
    tone_metrics, tone_by_kind = _held_out(tone, tone_trips_eval, tone_gallery, result["models"], "tone ")
    if result["graph"]:
        print("graph:", json.dumps(result["graph"]))
    report = {"train_config": asdict(cfg), "model_config": asdict(model_cfg), "train_triplets": len(train),
              "test_triplets": len(test) if test is not None else 0, "history": result["history"],
              "graph": result["graph"], "held_out": metrics, "held_out_by_kind": by_kind,
              "held_out_tone": tone_metrics, "held_out_tone_by_kind": tone_by_kind,
              "tone_edits": bool(args.tone_edits), "tone_triplets": n_tone,
              "eval_split": args.eval_split, "backbone_fingerprint": fingerprint,
              "data": args.data}
    (run_dir / "history.json").write_text(json.dumps(report, indent=2))
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=2))
    out_dir = Path(args.out) if args.out else (run_dir if args.data == "synthetic" else Path(Settings().checkpoints))
    for variant, model in result["models"].items():
        if variant not in ("rtic", "rtic+gcn"):
            continue
        path = out_dir / checkpoint_name(backbone_name, variant)
        extra = {"variant": variant, "train_config": asdict(cfg), "data": args.data,
                 "held_out": metrics.get(variant, {}), "history": result["history"][variant],
                 # every method on the same split
                 "held_out_all": metrics, "eval_split": args.eval_split,
                 # the same split's photos' tone edits (R@1 decides there: each photo has three versions)
                 "held_out_tone": tone_metrics, "tone_edits": bool(args.tone_edits),
                 "graph": result["graph"] if variant == "rtic+gcn" else None}
        if args.data == "cir":
            from ..data.heldout import HELD_OUT_SOURCES

            extra["held_out_sources"] = list(HELD_OUT_SOURCES)
        save_checkpoint(path, model, fingerprint, backbone_name, extra)
        print(f"saved {variant} -> {path}")
        if args.data == "cir" and not args.no_anchor:
            from .anchor_fit import anchor_checkpoint

            anchor_checkpoint(backbone, variant, out_dir, progress=not args.quiet)
            print(f"anchored {variant} to the weighted sum (engine.train.anchor_fit)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
