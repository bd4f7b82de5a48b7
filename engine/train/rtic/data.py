"""RTIC training data: synthetic attribute-change triplets with a known answer, a split by reference group,
and the triplets and galleries of the offline CIR set, JSONL, FashionIQ or CIRR (:func:`load_triplets`),
with the tone-edit queries of the offline CIR set's photos (:func:`tone_set`) and the open-vocabulary
operation set (:func:`open_vocab_triplets`, :func:`open_vocab_set`)."""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from ...data import cir_triplets as ct
from ...data.cir_triplets import TripletSet, embed_triplets
from ...data.open_vocab import load_open_vocab, open_vocab_gallery
from ...data.tone import offline_cir_photos, tone_triplets
from ...errors import InputError


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


def load_triplets(args, split: str):
    """Triplets of one split and the split's gallery as [(path, gallery kind)] (empty if the set has none)."""
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
        from ...data.builders import ensure_built

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
    triplets, gallery = tone_triplets(offline_cir_photos(split, hold_out=True))
    if not triplets:
        raise InputError(f"the {split} split of the offline CIR set has no photos to make tone edits of")
    data = embed_triplets(backbone, triplets, progress=progress, gallery=[p for p, _ in gallery])
    return data, triplets, gallery


def open_vocab_triplets(split: str, limit: int = 0):
    """Triplets of one split of the open-vocabulary set (``engine.data.open_vocab``; built on first use by the
    explicit build step), at most ``limit`` (a fixed sample; 0 = all)."""
    from ...data.builders import ensure_built

    ensure_built("open_vocab")
    return load_open_vocab(split, limit=limit)


def open_vocab_set(backbone, split: str, limit: int = 0, progress: bool = True):
    """One split of the open-vocabulary set embedded, against its gallery (every picture of the split in
    every version): (TripletSet, triplets, gallery [(path, "open")])."""
    triplets = open_vocab_triplets(split, limit)
    gallery = open_vocab_gallery(split)
    data = embed_triplets(backbone, triplets, progress=progress, gallery=[p for p, _ in gallery])
    return data, triplets, gallery
