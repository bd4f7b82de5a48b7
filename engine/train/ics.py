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
from dataclasses import fields
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..errors import InputError
from ..index.ics import (ICSConfig, ITQHasher, LSHHasher, SUPPORTED_BITS, checkpoint_path, map_at_n, save_ics,
                         train_ics)

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
    from ..data.formats import image_path, load_split

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


def evaluate_codes(model, train_x, q_x, q_y, db_x, db_y, top: int, seed: int = 0) -> dict:
    """Held-out figures of the model's codes, LSH and ITQ of the same length, and float ranking:

    * ``map_*``: mAP@top of the query split against the db split (relevant = shares a label);
    * ``recall10_*``: recall@10 of the compact index (Hamming top-``rerank`` then exact re-rank) against
      exact float search, queries against every non-query item (train + db), ``rerank`` = 5% of them.
    """
    from ..index.ics_index import candidate_recall, exact_top

    bits = model.bits
    res = {"map_float": map_at_n(q_y, db_y, top, query_vectors=q_x, db_vectors=db_x), "top": top}
    hashers = {"ics": model, "lsh": LSHHasher(q_x.shape[1], bits, seed)}
    if bits <= train_x.shape[1] and len(train_x) >= bits:
        hashers["itq"] = ITQHasher(train_x, bits, seed=seed)
    gallery = np.concatenate([train_x, db_x]).astype(np.float32)
    exact = exact_top(gallery, q_x)
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
    from ..config import resolve_device

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
    if args.threads:
        import torch

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
        from ..config import Settings

        out_dir = Path(Settings().checkpoints)
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
