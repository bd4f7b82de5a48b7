"""The RTIC training loop: :func:`fit` trains one model (with the GCN stream in stage 2), keeping a resume
state after every epoch; :func:`train_rtic` runs stage 1 (plain RTIC) and, with ``cfg.gcn``, stage 2 (the
correlation graph, then RTIC + GCN stream, optionally a stage-1 control)."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from ...checkpoints import load_training_state, save_training_state
from ...compose.rtic import RTIC, RTICConfig
from ...data.cir_triplets import TripletSet
from ...errors import CheckpointError, InputError
from ..budget import another_epoch_fits
from ..gcn_graph import CorrelationGraph, GCNStream, build_graph, gcn_bce_loss
from .model import TrainConfig, compose_all, make_optimizer, negatives_mask, pair_loss


@dataclass
class _Stream:
    """The GCN stream of stage 2 with the inputs it reads at every batch (every training row is a node)."""

    module: GCNStream
    graph: CorrelationGraph
    node_img: torch.Tensor
    node_txt: torch.Tensor
    a_hat: torch.Tensor
    a_hat_t: torch.Tensor

    @classmethod
    def on(cls, stream: GCNStream, graph: Optional[CorrelationGraph], data: TripletSet, device) -> "_Stream":
        if graph is None or graph.n != len(data):
            raise ValueError("the GCN stream needs a graph with one node per training row")
        stream.to(device)
        a_hat = graph.propagation().to(device)
        a_hat_t = graph.propagation_transposed().to(device)
        node_img, node_txt, _ = (t.to(device) for t in data.rows(torch.arange(len(data))))
        return cls(stream, graph, node_img, node_txt, a_hat, a_hat_t)

    def loss(self, out: torch.Tensor, idx: torch.Tensor, device) -> torch.Tensor:
        w = self.module(self.node_img, self.node_txt, self.a_hat, self.a_hat_t)
        return gcn_bce_loss(out, w, self.graph.binary_rows(idx).to(device))


def grouped_permutation(group: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A permutation of the rows in which the rows of one group (a reference image, or a source photo) are
    adjacent (groups in random order, rows in random order within each), so a batch holds a photo's other edits
    as its hardest negatives."""
    rows = torch.randperm(len(group), generator=gen)
    uniq, inverse = torch.unique(group[rows], return_inverse=True)
    rank = torch.randperm(len(uniq), generator=gen)[inverse]
    order = torch.argsort(rank, stable=True)
    return rows[order]


def _permutation(data: TripletSet, cfg: TrainConfig, gen: torch.Generator) -> torch.Tensor:
    if cfg.group_by_photo:
        return grouped_permutation(data.photos, gen)
    if cfg.group_by_reference:
        return grouped_permutation(data.ref, gen)
    return torch.randperm(len(data), generator=gen)


def _batch_losses(model: RTIC, data: TripletSet, idx: torch.Tensor, cfg: TrainConfig, gcn: Optional[_Stream],
                  device) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, pair, GCN) losses of one batch of rows ``idx``."""
    ref, txt, tgt = (t.to(device) for t in data.rows(idx))
    mask = negatives_mask(data.tgt[idx], data.query[idx]).to(device)
    out = model(ref, txt)
    lp = pair_loss(model, out, tgt, mask, cfg)
    loss = cfg.pair_weight * lp if gcn is not None else lp
    lg = torch.zeros(())
    if gcn is not None:
        lg = gcn.loss(out, idx, device)
        loss = loss + cfg.gcn_weight * lg
    return loss, lp, lg


def _epoch(model: RTIC, data: TripletSet, cfg: TrainConfig, perm: torch.Tensor, bs: int, opt,
           gcn: Optional[_Stream], device, bar_desc: str, progress: bool) -> Dict[str, float]:
    """One pass over ``perm`` in batches of ``bs``; the mean losses."""
    from tqdm.auto import tqdm

    n_batches = len(data) // bs  # drop the last incomplete batch (BatchNorm, K = B)
    sums = {"loss": 0.0, "pair": 0.0, "gcn": 0.0}
    bar = tqdm(range(n_batches), desc=bar_desc, leave=False, disable=not progress)
    for b in bar:
        idx = perm[b * bs : (b + 1) * bs]
        loss, lp, lg = _batch_losses(model, data, idx, cfg, gcn, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sums["loss"] += loss.item()
        sums["pair"] += lp.item()
        sums["gcn"] += lg.item()
        bar.set_postfix(loss=f"{loss.item():.4f}")
    return {k: v / max(1, n_batches) for k, v in sums.items()}


def _resume(state_path: Path, fingerprint: str, desc: str, model: RTIC, stream: Optional[GCNStream], opt,
            sched) -> Tuple[List[dict], int]:
    """Restores a run's state; (history so far, epochs done)."""
    state = load_training_state(state_path)
    if state.get("fingerprint") != fingerprint or state.get("desc") != desc:
        raise CheckpointError(f"{state_path.name} belongs to another run or backbone; cannot resume")
    model.load_state_dict(state["model"])
    if stream is not None:
        stream.load_state_dict(state["stream"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    return json.loads(state["history"]), int(state["epoch"])


def _keep_state(state_path: Path, model: RTIC, stream: Optional[GCNStream], opt, sched, epoch: int,
                history: List[dict], fingerprint: str, desc: str) -> None:
    state = {
        "model": model.state_dict(),
        "opt": opt.state_dict(),
        "sched": sched.state_dict(),
        "epoch": epoch,
        "history": json.dumps(history),
        "fingerprint": fingerprint,
        "desc": desc,
    }
    if stream is not None:
        state["stream"] = stream.state_dict()
    save_training_state(state_path, state)


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
    if len(data) < 2:
        raise InputError("RTIC training needs at least 2 triplets")
    device = torch.device(cfg.device)
    model.to(device)
    params = list(model.parameters())
    gcn = None
    if stream is not None:
        gcn = _Stream.on(stream, graph, data, device)
        params += list(stream.parameters())
    opt, sched = make_optimizer(params, cfg)
    history: List[dict] = []
    start = 0
    if resume and state_path is not None and state_path.is_file():
        history, start = _resume(state_path, fingerprint, desc, model, stream, opt, sched)
    gen = torch.Generator().manual_seed(cfg.seed)
    for _ in range(start):  # keep the shuffling sequence identical after a resume
        _permutation(data, cfg, gen)
    bs = max(2, min(cfg.batch_size, len(data)))
    for epoch in range(start, cfg.epochs):
        model.train()
        if stream is not None:
            stream.train()
        perm = _permutation(data, cfg, gen)
        t0 = time.perf_counter()
        rec = _epoch(model, data, cfg, perm, bs, opt, gcn, device, f"{desc} {epoch + 1}/{cfg.epochs}", progress)
        sched.step()
        rec.update(epoch=epoch + 1, lr=opt.param_groups[0]["lr"], seconds=round(time.perf_counter() - t0, 2))
        history.append(rec)
        if state_path is not None:
            _keep_state(state_path, model, stream, opt, sched, epoch + 1, history, fingerprint, desc)
        if not another_epoch_fits(time.perf_counter() - t0):
            break  # the time limit of `prepare`
    model.eval()
    return history


def _graph(model: RTIC, data: TripletSet, cfg: TrainConfig, progress: bool) -> Tuple[CorrelationGraph, dict]:
    """Stage 2's correlation graph from stage-1 features, and its figures."""
    ref, txt, tgt = data.rows(torch.arange(len(data)))
    if cfg.correlation == "target":
        feats = tgt  # frozen backbone: the stage-1 target features are the backbone's target embeddings
    elif cfg.correlation == "composed":
        feats = compose_all(model, ref, txt)
    else:
        raise InputError(f"unknown correlation {cfg.correlation!r}; use target or composed")
    t0 = time.perf_counter()
    graph = build_graph(feats, density=cfg.density, p=cfg.p, progress=progress)
    return graph, {
        "nodes": graph.n,
        "edges": graph.nnz,
        "tau": graph.tau,
        "mean_degree_fraction": graph.mean_degree / graph.n,
        "MB": graph.nbytes() / 2**20,
        "build_s": round(time.perf_counter() - t0, 2),
    }


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

    graph, result["graph"] = _graph(model, data, cfg, progress)
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
