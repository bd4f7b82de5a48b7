"""`python -m engine train ics`: train ICS hash heads (one per code length) on labelled embeddings.

Data sources (one of):

* ``--data multilabel`` (default): the offline multi-label set (Twemoji categories / sub-categories /
  skin tones / genders and Tux Paint category levels, ``engine.data.formats``); trains on ``train``,
  evaluates on ``query`` against ``db``;
* ``--coco instances.json --images DIR``: MS-COCO instance annotations (labels = object categories);
* ``--nuswide LIST --images DIR``: NUS-WIDE style list, one image per line followed by its 0/1 label
  vector (``--concepts`` names the columns), or the official ``ImageList`` file plus a folder of
  ``Labels_<concept>.txt`` files (``--nuswide-labels DIR``);
* ``--csv FILE --images DIR``: generic ``path,labels`` rows with labels separated by ``|``;
* ``--features FILE.npz``: precomputed ``embeddings`` (N, D), ``labels`` (N, M) multi-hot or (N,) ids,
  ``fingerprint`` (the backbone that made them).

Images are embedded with the backbone (``engine.data.features.embed_paths``, cached). For the file
formats a random ``--holdout`` share becomes the query/db evaluation split. Checkpoints go to
``--out`` (default ``CIS_CHECKPOINTS``) as ``ics-<K>-<backbone slug>.safetensors`` + ``.json`` with the held-out mAP of
ICS, LSH, ITQ and float ranking.
"""
from __future__ import annotations

import argparse
import csv
import json
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch.nn import functional as F

from ..config import Settings, resolve_device
from ..data.formats import image_path, load_split
from ..errors import InputError
from ..eval.metrics import approximate_recall, exact_top_ids, map_at_n
from ..index.ics import (
    SUPPORTED_BITS,
    HashHead,
    ICSConfig,
    ICSModel,
    checkpoint_path,
    hash_centres,
    labels_to_matrix,
    neighbour_loss,
    relaxed_losses,
    save_ics,
)
from ..index.ics_baselines import ITQHasher, LSHHasher
from ..index.ics_index import CompactBinaryIndex
from .budget import another_epoch_fits


# -- simplex projection and centre weights (the w-step of the alternating optimisation) -------------
def project_simplex(v: torch.Tensor, mask: Optional[torch.Tensor] = None, radius=1.0) -> torch.Tensor:
    """Euclidean projection of each row of ``v`` onto ``{w >= 0, sum w = radius}`` (sort-based).

    With ``mask`` (bool, same shape) only the masked coordinates are free; the others are 0. Sort the
    free coordinates descending (``u``), find the largest ``rho`` with
    ``u_rho - (sum_{r<=rho} u_r - radius) / rho > 0``, shift by ``theta = (sum_{r<=rho} u_r - radius)/rho``
    and clip at 0. Rows without any free coordinate come back as zeros. ``radius`` may be a (B, 1)
    tensor (one radius per row).
    """
    v = torch.as_tensor(v)
    squeeze = v.dim() == 1
    if squeeze:
        v = v[None]
        mask = None if mask is None else torch.as_tensor(mask)[None]
    if mask is None:
        mask = torch.ones_like(v, dtype=torch.bool)
    mask = mask.to(torch.bool)
    if isinstance(radius, torch.Tensor):
        radius = radius.to(v.dtype).reshape(-1, 1)
    big = torch.finfo(v.dtype).max / 4
    vm = torch.where(mask, v, torch.full_like(v, -big))
    u, _ = torch.sort(vm, dim=1, descending=True)
    free = mask.sum(1, keepdim=True)
    u = torch.where(torch.arange(v.shape[1], device=v.device)[None] < free, u, torch.zeros_like(u))
    css = torch.cumsum(u, dim=1) - radius
    ranks = torch.arange(1, v.shape[1] + 1, device=v.device, dtype=v.dtype)[None]
    cond = (u - css / ranks > 0) & (ranks <= free)
    rho = cond.to(v.dtype).cumsum(1).argmax(1, keepdim=True)  # last True (cond is a prefix)
    theta = css.gather(1, rho) / (rho + 1).to(v.dtype)
    w = torch.clamp(v - theta, min=0) * mask
    w = torch.where(free > 0, w, torch.zeros_like(w))
    return w[0] if squeeze else w


def weight_objective(w: torch.Tensor, losses: torch.Tensor, mask: torch.Tensor, lam: float) -> torch.Tensor:
    """Per-row ``lam * sum_j w_j l_j + sum_j w_j log w_j`` over the masked (label) coordinates."""
    w = w * mask
    wlogw = torch.where(w > 0, w * torch.log(w.clamp_min(1e-30)), torch.zeros_like(w))
    return lam * (w * torch.where(mask, losses, torch.zeros_like(losses))).sum(1) + wlogw.sum(1)


def uniform_weights(mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(torch.float32)
    return mask / mask.sum(1, keepdim=True).clamp_min(1)


def pgd_weights(
    losses: torch.Tensor,
    mask: torch.Tensor,
    lam: float,
    w0: Optional[torch.Tensor] = None,
    steps: int = 10,
    lr: float = 0.1,
    max_halvings: int = 20,
    floor: float = 1e-6,
    history: Optional[List[torch.Tensor]] = None,
) -> torch.Tensor:
    """Minimise :func:`weight_objective` over the simplex on each row's labels by projected gradient descent.

    ``w <- P(w - lr * grad J(w))`` with ``grad J = lam * l + log w + 1``. The entropy gradient is
    unbounded at 0, so the iterates live on the slightly shrunk simplex ``{w_j >= floor, sum w = 1}``
    (the optimum ``softmax(-lam l)`` is strictly positive anyway); its Euclidean projection is
    ``floor + P_r(v - floor)`` with ``P_r`` the sort-based projection onto the simplex of radius
    ``r = 1 - c_i * floor``. A row whose step would raise its objective halves its own step until it
    does not (at most ``max_halvings`` times, else the row keeps its weights and stops): the
    objective never increases. ``history`` (if a list) receives the (B,) objective before the first
    and after every step.
    """
    mask = mask.to(torch.bool)
    losses = losses.detach().to(torch.float64)
    count = mask.sum(1, keepdim=True).to(torch.float64)
    floor = min(float(floor), 0.5 / max(float(count.max()), 1.0))
    radius = (1 - count * floor).clamp_min(0)

    def proj(v, rows):
        return (project_simplex(v - floor, mask[rows], radius[rows]) + floor) * mask[rows]

    all_rows = torch.ones(mask.shape[0], dtype=torch.bool)
    w = uniform_weights(mask).to(torch.float64) if w0 is None else proj(w0.to(torch.float64), all_rows)
    obj = weight_objective(w, losses, mask, lam)
    if history is not None:
        history.append(obj.clone())
    active = torch.ones(w.shape[0], dtype=torch.bool)  # rows still moving
    for _ in range(steps):
        grad = lam * losses + torch.log(w.clamp_min(floor)) + 1.0
        step = torch.full((w.shape[0], 1), float(lr), dtype=w.dtype)
        todo = active.clone()
        new_w, new_obj = w.clone(), obj.clone()
        for _ in range(max_halvings):
            cand = proj(w[todo] - step[todo] * grad[todo], todo)
            cobj = weight_objective(cand, losses[todo], mask[todo], lam)
            ok = cobj <= obj[todo] + 1e-12
            idx = torch.nonzero(todo).flatten()
            new_w[idx[ok]] = cand[ok]
            new_obj[idx[ok]] = cobj[ok]
            todo[idx[ok]] = False
            if not bool(todo.any()):
                break
            step[todo] = step[todo] / 2
        active &= ~todo  # no step lowered the objective: the row has converged
        w, obj = new_w, new_obj
        if history is not None:
            history.append(obj.clone())
    return w.to(torch.float32)



# -- training of the hash head -----------------------------------------------------------------
def _check_training_arrays(embeddings: np.ndarray, labels: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    x = np.asarray(embeddings, dtype=np.float32)
    y = np.asarray(labels)
    if y.ndim == 1:  # single-label ids -> one-hot (the c_i = 1 case)
        y = labels_to_matrix([[int(v)] for v in y])
    y = y.astype(bool)
    if x.ndim != 2 or y.ndim != 2 or len(x) != len(y):
        raise InputError(f"embeddings {x.shape} and labels {y.shape} do not line up")
    if len(x) < 2:
        raise InputError("ICS training needs at least two labelled embeddings")
    if not np.isfinite(x).all():
        raise InputError("the training embeddings hold non-finite values")
    keep = y.any(1)
    if not keep.any():
        raise InputError("no training item has a label")
    return x[keep], y[keep]


def train_ics(
    embeddings: np.ndarray,
    labels: np.ndarray,
    config: Optional[ICSConfig] = None,
    progress: bool = True,
    device: str = "cpu",
) -> ICSModel:
    """Alternating optimisation of the centre weights (PGD, head frozen) and the hash head (weights fixed).

    ``labels``: (N, M) multi-hot bool, or (N,) integer class ids (single-label). Items without any
    label are dropped. The returned model's ``record['history']`` holds per-epoch losses.
    """
    from tqdm.auto import tqdm

    x_np, y_np = _check_training_arrays(embeddings, labels)
    cfg = ICSConfig(**asdict(config)) if config is not None else ICSConfig()
    cfg.dim, cfg.num_labels = int(x_np.shape[1]), int(y_np.shape[1])
    cfg.validate()
    torch.manual_seed(cfg.seed)
    centres_np, cfg.centre_strategy = hash_centres(cfg.num_labels, cfg.bits, cfg.seed)
    head = HashHead(cfg.dim, cfg.bits, cfg.hidden, cfg.dropout).to(device)
    centres = torch.from_numpy(centres_np).to(device)
    x = torch.from_numpy(x_np).to(device)
    mask = torch.from_numpy(y_np).to(device)
    w = uniform_weights(mask).to(device)
    mean = x.mean(0)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    n = len(x)
    history = []
    bar = tqdm(range(cfg.epochs), desc=f"ICS-{cfg.bits}", disable=not progress)
    for epoch in bar:
        t_epoch = time.perf_counter()
        # (1) centre weights with f frozen
        head.eval()
        with torch.no_grad():
            ell = torch.cat([relaxed_losses(torch.tanh(head(x[i:i + 8192])), centres, cfg)[0]
                             for i in range(0, n, 8192)])
        before = weight_objective(w.double(), ell.double(), mask, cfg.lam).mean().item()
        w = pgd_weights(ell.cpu(), mask.cpu(), cfg.lam, w0=w.cpu(), steps=cfg.pgd_steps, lr=cfg.pgd_lr).to(device)
        after = weight_objective(w.double(), ell.double(), mask, cfg.lam).mean().item()
        # (2) the head with w fixed
        head.train()
        perm = torch.randperm(n, generator=gen).to(device)
        total, total_q, total_n, batches = 0.0, 0.0, 0.0, 0
        for i in range(0, n, cfg.batch_size):
            idx = perm[i:i + cfg.batch_size]
            h = torch.tanh(head(x[idx]))
            ell_b, quant = relaxed_losses(h, centres, cfg)
            central = (w[idx] * ell_b).sum(1).mean()
            loss = central + cfg.gamma * quant.mean()
            if cfg.neighbour_weight > 0:
                xc = F.normalize(x[idx] - mean, dim=1)
                neigh = neighbour_loss(xc @ xc.T, h, cfg.neighbour_tau)
                loss = loss + cfg.neighbour_weight * neigh
                total_n += neigh.item()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += central.item()
            total_q += quant.mean().item()
            batches += 1
        wm = w[mask.sum(1) > 1]
        max_w = float(wm.max(1).values.mean()) if len(wm) else 1.0
        history.append({"epoch": epoch + 1, "central": total / batches, "quant": total_q / batches,
                        "neighbour": total_n / batches,
                        "weight_objective_before": before, "weight_objective_after": after,
                        "mean_max_weight_multilabel": max_w})
        bar.set_postfix(central=f"{total / batches:.4f}", quant=f"{total_q / batches:.4f}",
                        neighbour=f"{total_n / batches:.4f}")
        if not another_epoch_fits(time.perf_counter() - t_epoch):
            break  # the time limit of `prepare`
    head.eval()
    record = {"history": history, "train_items": int(n)}
    return ICSModel(cfg, head.cpu(), centres_np, record=record)



Item = Tuple[str, List[str]]  # (image path, label names)


# -- label formats -------------------------------------------------------------------------------
def load_coco(instances_json, image_root) -> List[Item]:
    """MS-COCO ``instances_*.json``: images with their object categories (images without objects dropped)."""
    path = Path(instances_json)
    try:
        data = json.loads(path.read_text())
        cats = {c["id"]: c["name"] for c in data["categories"]}
        files = {im["id"]: im["file_name"] for im in data["images"]}
        labels: Dict[int, set] = {}
        for ann in data["annotations"]:
            labels.setdefault(ann["image_id"], set()).add(cats[ann["category_id"]])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"{path.name}: not a readable COCO instances file ({exc})") from None
    root = Path(image_root)
    return [(str(root / files[i]), sorted(ls)) for i, ls in sorted(labels.items()) if i in files]


def load_nuswide(list_file, image_root, concepts_file=None, labels_dir=None) -> List[Item]:
    """NUS-WIDE labels.

    Without ``labels_dir``: each line is ``<image path> b_1 ... b_M`` (0/1), the common hashing list
    format; ``concepts_file`` (one name per line) names the columns, else ``c0..c{M-1}``.
    With ``labels_dir``: ``list_file`` is the official image list (one path per line, ``\\`` allowed) and
    ``labels_dir`` holds ``Labels_<concept>.txt`` with one 0/1 per image line.
    """
    path, root = Path(list_file), Path(image_root)
    try:
        lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip()]
    except OSError as exc:
        raise InputError(f"{path.name}: cannot read the NUS-WIDE list ({exc})") from None
    if labels_dir is not None:
        paths = [ln.split()[0].replace("\\", "/") for ln in lines]
        found: List[List[str]] = [[] for _ in paths]
        files = sorted(Path(labels_dir).glob("Labels_*.txt"))
        if not files:
            raise InputError(f"no Labels_<concept>.txt files in {labels_dir}")
        for f in files:
            concept = f.stem[len("Labels_"):]
            flags = [ln.strip() for ln in f.read_text().splitlines() if ln.strip()]
            if len(flags) != len(paths):
                raise InputError(f"{f.name} has {len(flags)} lines, the image list {len(paths)}")
            for i, v in enumerate(flags):
                if v == "1":
                    found[i].append(concept)
        return [(str(root / p), ls) for p, ls in zip(paths, found)]
    names = None
    if concepts_file is not None:
        names = [ln.strip() for ln in Path(concepts_file).read_text().splitlines() if ln.strip()]
    items = []
    for n, ln in enumerate(lines, 1):
        parts = ln.split()
        try:
            flags = [int(v) for v in parts[1:]]
        except ValueError:
            raise InputError(f"{path.name} line {n}: labels must be 0/1 values") from None
        if names is not None and len(flags) != len(names):
            raise InputError(f"{path.name} line {n}: {len(flags)} labels, {len(names)} concepts")
        labels = [(names[j] if names else f"c{j}") for j, v in enumerate(flags) if v]
        items.append((str(root / parts[0]), labels))
    return items


def load_label_csv(csv_file, image_root) -> List[Item]:
    """Generic CSV: ``path,labels`` with labels separated by ``|`` (a header row ``path,labels`` is skipped)."""
    path, root = Path(csv_file), Path(image_root)
    items = []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            for n, row in enumerate(csv.reader(f), 1):
                if not row or (n == 1 and row[0].strip().lower() == "path"):
                    continue
                if len(row) < 2:
                    raise InputError(f"{path.name} line {n}: expected 'path,labels'")
                labels = [s.strip() for s in row[1].split("|") if s.strip()]
                items.append((str(root / row[0].strip()), labels))
    except OSError as exc:
        raise InputError(f"{path.name}: cannot read ({exc})") from None
    return items


def label_matrix(items_labels: Sequence[Sequence[str]], vocabulary: Optional[List[str]] = None
                 ) -> Tuple[np.ndarray, List[str]]:
    """Label names -> (N, M) multi-hot bool and the vocabulary (sorted, or the given one; unknown names drop)."""
    vocab = vocabulary if vocabulary is not None else sorted({l for ls in items_labels for l in ls})
    pos = {l: j for j, l in enumerate(vocab)}
    y = np.zeros((len(items_labels), max(len(vocab), 1)), dtype=bool)
    for i, ls in enumerate(items_labels):
        for l in ls:
            if l in pos:
                y[i, pos[l]] = True
    return y, vocab


# -- data assembly -------------------------------------------------------------------------------
def _embed(items: List[Item], backbone) -> np.ndarray:
    from ..data.features import embed_paths

    missing = [p for p, _ in items if not Path(p).is_file()]
    if missing:
        raise InputError(f"{len(missing)} listed images do not exist, e.g. {missing[0]}")
    return embed_paths(backbone, [p for p, _ in items], desc="embedding")


def offline_multilabel(backbone) -> Dict[str, Tuple[np.ndarray, List[List[str]]]]:
    """{split: (embeddings, label lists)} for the offline ``multilabel`` set's train / query / db."""
    from ..data.builders import ensure_built

    ensure_built("multilabel")  # the explicit build step (quick when built)
    out = {}
    for split in ("train", "query", "db"):
        records = load_split("multilabel", split)
        items = [(str(image_path("multilabel", r["image"])), list(r["labels"])) for r in records]
        out[split] = (_embed(items, backbone), [ls for _, ls in items])
    return out


def split_holdout(n: int, holdout: float, seed: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random train / query / db index split: ``holdout`` share is evaluation, 1/5 of it queries."""
    perm = np.random.default_rng(seed).permutation(n)
    n_eval = int(round(n * holdout))
    n_q = max(1, n_eval // 5) if n_eval else 0
    return perm[n_eval:], perm[:n_q], perm[n_q:n_eval]


def candidate_recall(hasher, vectors: np.ndarray, queries: np.ndarray, rerank: int, k: int = 10,
                     exact: Optional[np.ndarray] = None) -> float:
    """recall@k of the compact index (Hamming top-``rerank``, then float re-rank) over ``vectors`` against
    exact search (``exact``: precomputed :func:`engine.eval.metrics.exact_top_ids` ids, to share them between hashers)."""
    exact = exact_top_ids(vectors, queries, k) if exact is None else exact
    idx = CompactBinaryIndex(vectors.shape[1], hasher, kind=getattr(hasher, "name", "codes"), rerank=rerank)
    idx.build(vectors)
    ids = idx.search(queries, k)[1]
    return approximate_recall(ids, exact)


def evaluate_codes(model, train_x, q_x, q_y, db_x, db_y, top: int, seed: int = 0) -> dict:
    """Held-out figures of the model's codes, LSH and ITQ of the same length, and float ranking:

    * ``map_*``: mAP@top of the query split against the db split (relevant = shares a label);
    * ``recall10_*``: recall@10 of the compact index (Hamming top-``rerank`` then exact re-rank) against
      exact float search, queries against every non-query item (train + db), ``rerank`` = 5% of them.
    """
    bits = model.bits
    res = {"map_float": map_at_n(q_y, db_y, top, query_vectors=q_x, db_vectors=db_x), "top": top}
    hashers = {"ics": model, "lsh": LSHHasher(q_x.shape[1], bits, seed)}
    if bits <= train_x.shape[1] and len(train_x) >= bits:
        hashers["itq"] = ITQHasher(train_x, bits, seed=seed)
    gallery = np.concatenate([train_x, db_x]).astype(np.float32)
    exact = exact_top_ids(gallery, q_x)
    res["rerank"] = max(10, int(np.ceil(0.05 * len(gallery))))
    for name, h in hashers.items():
        res[f"map_{name}"] = map_at_n(q_y, db_y, top, query_codes=h.encode(q_x), db_codes=h.encode(db_x), bits=bits)
        res[f"recall10_{name}"] = candidate_recall(h, gallery, q_x, res["rerank"], exact=exact)
    return res


# -- CLI -----------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine train ics", description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--data", choices=["multilabel"], default=None, help="offline set (default: multilabel)")
    src.add_argument("--coco", type=Path, help="COCO instances JSON")
    src.add_argument("--nuswide", type=Path, help="NUS-WIDE list (path + 0/1 labels) or ImageList file")
    src.add_argument("--csv", type=Path, help="CSV with path,labels (labels separated by |)")
    src.add_argument("--features", type=Path, help=".npz with embeddings, labels, fingerprint")
    p.add_argument("--images", type=Path, default=Path("."), help="image folder for --coco/--nuswide/--csv")
    p.add_argument("--concepts", type=Path, help="NUS-WIDE concept names (one per line)")
    p.add_argument("--nuswide-labels", type=Path, help="NUS-WIDE folder with Labels_<concept>.txt files")
    p.add_argument("--holdout", type=float, default=0.2, help="evaluation share for file sources")
    p.add_argument("--backbone", default="packaged", help="backbone name (create_backbone)")
    p.add_argument("--device", default="auto")
    p.add_argument("--bits", default="16,32,64,128", help="comma-separated code lengths")
    p.add_argument("--out", type=Path, default=None, help="checkpoint folder (default: CIS_CHECKPOINTS)")
    p.add_argument("--top", type=int, default=0, help="N of mAP@N (default: all of the db, at most 1000)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave as is)")
    p.add_argument("--quiet", action="store_true")
    skip = {"dim", "bits", "num_labels", "centre_strategy"}
    for f in fields(ICSConfig):
        if f.name not in skip:
            p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    return p


def _load_sources(args) -> Tuple[np.ndarray, List[List[str]], np.ndarray, List[List[str]], np.ndarray,
                                 List[List[str]], str, str]:
    """(train x, train labels, query x, query labels, db x, db labels, fingerprint, source description)."""
    if args.features is not None:
        try:
            with np.load(args.features, allow_pickle=False) as z:
                x = np.asarray(z["embeddings"], np.float32)
                y = np.asarray(z["labels"])
                fingerprint = str(z["fingerprint"]) if "fingerprint" in z.files else ""
        except (OSError, ValueError, KeyError) as exc:
            raise InputError(f"{args.features.name}: needs arrays embeddings, labels, fingerprint ({exc})") from None
        if y.ndim == 1:
            labels = [[str(v)] for v in y]
        else:
            labels = [[str(j) for j in np.flatnonzero(row)] for row in y.astype(bool)]
        tr, q, db = split_holdout(len(x), args.holdout, args.seed)
        pick = lambda idx: (x[idx], [labels[i] for i in idx])  # noqa: E731
        return (*pick(tr), *pick(q), *pick(db), fingerprint, f"features {args.features.name}")
    from ..backbones import create_backbone

    backbone = create_backbone(args.backbone, resolve_device(args.device))
    if args.coco or args.nuswide or args.csv:
        if args.coco:
            items, what = load_coco(args.coco, args.images), f"COCO {args.coco.name}"
        elif args.nuswide:
            items = load_nuswide(args.nuswide, args.images, args.concepts, args.nuswide_labels)
            what = f"NUS-WIDE {args.nuswide.name}"
        else:
            items, what = load_label_csv(args.csv, args.images), f"CSV {args.csv.name}"
        items = [it for it in items if it[1]]
        if len(items) < 10:
            raise InputError(f"{what}: only {len(items)} labelled images; need at least 10")
        x = _embed(items, backbone)
        labels = [ls for _, ls in items]
        tr, q, db = split_holdout(len(x), args.holdout, args.seed)
        pick = lambda idx: (x[idx], [labels[i] for i in idx])  # noqa: E731
        return (*pick(tr), *pick(q), *pick(db), backbone.fingerprint, what)
    sets = offline_multilabel(backbone)
    return (*sets["train"], *sets["query"], *sets["db"], backbone.fingerprint, "offline multilabel set")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(list(argv) if argv is not None else None)
    from ..process import configure_process  # Pillow, which the module does not load at its top

    settings = Settings()  # the entry point's settings: the decode budget and the offline sets' sources
    configure_process(settings)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        bits_list = [int(b) for b in str(args.bits).split(",") if b.strip()]
    except ValueError:
        raise InputError(f"--bits must be comma-separated integers, got {args.bits!r}") from None
    bad = [b for b in bits_list if b not in SUPPORTED_BITS]
    if bad or not bits_list:
        raise InputError(f"--bits must be among {SUPPORTED_BITS}, got {args.bits!r}")
    tr_x, tr_l, q_x, q_l, db_x, db_l, fingerprint, what = _load_sources(args)
    tr_y, vocab = label_matrix(tr_l)
    q_y, _ = label_matrix(q_l, vocab)
    db_y, _ = label_matrix(db_l, vocab)
    top = args.top or min(1000, len(db_x))
    out_dir = args.out
    if out_dir is None:
        out_dir = Path(settings.checkpoints)
    base = {f.name: getattr(args, f.name) for f in fields(ICSConfig)
            if f.name not in ("dim", "bits", "num_labels", "centre_strategy")}
    summary = []
    for bits in bits_list:
        cfg = ICSConfig(bits=bits, **base)
        t0 = time.time()
        model = train_ics(tr_x, tr_y, cfg, progress=not args.quiet)
        seconds = time.time() - t0
        ev = evaluate_codes(model, tr_x, q_x, q_y, db_x, db_y, top, seed=args.seed) if len(q_x) and len(db_x) else {}
        extra = {"labels": vocab, "source": what, "train_seconds": round(seconds, 1),
                 "splits": {"train": len(tr_x), "query": len(q_x), "db": len(db_x)}, "eval": ev}
        path = save_ics(model, checkpoint_path(out_dir, bits, fingerprint), fingerprint, extra)
        summary.append({"bits": bits, "checkpoint": str(path), **ev})
        if not args.quiet:
            print(json.dumps(summary[-1]), flush=True)
    if args.quiet:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
