"""`python -m engine eval concepts`: choose the packaged backbone's colour / light concept weighting.

For each weighting on a grid, the validation split of the offline CIR set is embedded with the packaged
backbone (the CNN runs once; concept scores are recomputed from 64-pixel thumbnails per colour-naming
width) and ranked with the training-free composers (image only, weighted sum at alpha 0.5), reference
excluded, per gallery, exactly as `eval offline` ranks. The offline set has colour edits but no light or
tone edits, so the validation photos are also edited to black-and-white and night (``engine.data.tone``):
from each original, "at night" / "in black and white" must find its own edited version among every
version of every photo; R@1 there (each photo has three versions, so R@10 mostly says whether any
version of the photo was found). The weighting with the best mean of the weighted sum's CIR R@10 and tone
R@1 is the one to ship (``DEFAULT_CONCEPTS`` in engine/backbones/packaged.py). The test split is
never read.
"""
from __future__ import annotations

import argparse
import itertools
import time
from typing import Dict, List

import numpy as np
import torch
import torch.nn.functional as F

from ..config import Settings
from ..data.cir_triplets import embed_texts
from ..data.formats import image_path, load_split
from ..data.tone import TONE_GALLERY, tone_edit, tone_queries
from ..expand.base import l2n
from ..sysinfo import load_average


def _parts(backbone, paths: List, batch: int = 32, edits=("",)):
    """Class mixtures (E, N, D) and 64-px RGB thumbnails (E, N, 3, 64, 64) of image files, for each tone
    edit in ``edits`` ("" = the image as it is)."""
    from tqdm.auto import tqdm

    from ..images import load_image

    cls = {e: [] for e in edits}
    thumbs = {e: [] for e in edits}
    for i in tqdm(range(0, len(paths), batch), desc="val images", unit="batch"):
        x = torch.stack([backbone.preprocess(load_image(p)) for p in paths[i : i + batch]])
        rgb0 = backbone.to_rgb(x)
        for e in edits:
            rgb = tone_edit(rgb0, e) if e else rgb0
            with torch.no_grad():
                probs, _ = backbone.class_probabilities(backbone.from_rgb(rgb))
            cls[e].append(F.normalize(probs @ backbone.class_text, dim=-1).cpu())
            thumbs[e].append(F.interpolate(rgb, size=(64, 64), mode="area"))
    return (torch.stack([torch.cat(cls[e]) for e in edits]), torch.stack([torch.cat(thumbs[e]) for e in edits]))


def _training_free(img: np.ndarray, txt: np.ndarray) -> Dict[str, np.ndarray]:
    """Query vectors of the training-free composers for rows of reference-image and text embeddings: image
    only, text only and the weighted sum at alpha 0.5 (``engine.compose.baselines.WeightedSum``, batched)."""
    return {"image": img, "text": txt, "sum": l2n(img * 0.5 + txt * 0.5)}


def _tone_queries(n_photos: int, edits) -> tuple:
    """Queries over a gallery of every photo in every version (row e * n + i = photo i, version e):
    ``engine.data.tone.tone_queries`` (from the original to each edit); every other version of the same
    photo is a hard negative."""
    gallery = [{"image": f"{e or 'orig'}/{i}", "gallery": TONE_GALLERY} for e in edits for i in range(n_photos)]
    queries = [{"reference": f"orig/{i}", "targets": [f"{e}/{i}"], "gallery": TONE_GALLERY, "kind": e, "text": text}
               for i, e, text in tone_queries(n_photos, edits)]
    return queries, gallery


def grid_search(backbone, split: str = "val", objects=(0.0, 0.25, 0.5, 0.75, 1.0), scenes=(0.0, 0.25, 0.5),
                lights=(0.0, 0.25, 0.5, 1.0), sigmas=(8.0, 12.0, 20.0)) -> List[Dict]:
    from ..backbones.concepts import ConceptWeights, concept_scores, mix
    from ..data.builders import ensure_built
    from .cir import rank_queries, recall

    if split == "test":
        raise ValueError("the concept weighting is chosen on validation data, never on the test split")
    ensure_built("cir")
    queries = load_split("cir", split)
    gallery = load_split("cir", f"{split}_gallery")
    pos = {g["image"]: i for i, g in enumerate(gallery)}
    edits = ("", "bw", "night")
    photos = [i for i, g in enumerate(gallery) if g.get("gallery") == "photos"]
    paths = [image_path("cir", g["image"]) for g in gallery]
    cls, thumbs = (t[0] for t in _parts(backbone, paths))
    # tone set: the photos gallery in every version (the emoji are drawings: night and black-and-white
    # versions of them are not photographs)
    edited = _parts(backbone, [paths[i] for i in photos], edits=edits[1:])
    t_cls = torch.cat([cls[photos], *edited[0]])
    t_thumbs = torch.cat([thumbs[photos], *edited[1]])
    t_queries, t_gallery = _tone_queries(len(photos), edits)
    t_pos = {g["image"]: i for i, g in enumerate(t_gallery)}
    texts = sorted({q["text"] for q in queries + t_queries})
    temb = embed_texts(backbone, texts, progress=False).numpy()
    tpos = {t: i for i, t in enumerate(texts)}

    def measure(qs, gal, gpos, g, row, prefix, metric="R@10"):
        vecs = _training_free(g[np.array([gpos[q["reference"]] for q in qs])], temb[[tpos[q["text"]] for q in qs]])
        kind = np.array([q["kind"] for q in qs])
        for name in ("image", "sum"):
            r = rank_queries(vecs[name], qs, gal, g, gpos)["none"]
            row[prefix + name] = recall(r)[metric]
            if prefix == "":
                row[f"{name}:recolour"] = recall(r[kind == "recolour"])["R@10"] if (kind == "recolour").any() else 0.0

    rows = []
    text_table = backbone.concept_text.cpu()
    for sigma in sigmas:
        scores = concept_scores(thumbs, sigma=sigma)
        t_scores = concept_scores(t_thumbs, sigma=sigma)
        for o, s, li in itertools.product(objects, scenes, lights):
            w = ConceptWeights(1.0, o, s, li, sigma)
            if not w.any and sigma != sigmas[0]:
                continue  # the class-only row does not depend on sigma
            row = {"weights": w}
            g = mix(cls, scores, text_table, w).numpy() if w.any else cls.numpy()
            measure(queries, gallery, pos, g, row, "")
            tg = mix(t_cls, t_scores, text_table, w).numpy() if w.any else t_cls.numpy()
            measure(t_queries, t_gallery, t_pos, tg, row, "tone:", "R@1")
            row["objective"] = (row["sum"] + row["tone:sum"]) / 2
            rows.append(row)
    return rows


def cost_per_image(backbone, n: int = 64, repeats: int = 3) -> Dict[str, float]:
    """ms per image of the CNN + class bridge and of the concept detectors, on the same random batch,
    best of ``repeats`` (this process's torch threads)."""
    x = torch.randn(n, 3, backbone.size, backbone.size)
    out = {}
    from ..backbones.concepts import concept_scores

    rgb = backbone.to_rgb(x).clamp(0, 1)
    for name, fn in (("cnn", lambda: backbone.class_probabilities(x)),
                     ("concepts", lambda: concept_scores(rgb, sigma=backbone.concepts.sigma))):
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            with torch.no_grad():
                fn()
            best = min(best, time.perf_counter() - t)
        out[name] = best / n * 1e3
    return out


def main(argv=None) -> int:
    from ..backbones.packaged import PackagedBackbone
    from ..process import configure_process  # Pillow, which the module does not load at its top

    ap = argparse.ArgumentParser(prog="python -m engine eval concepts", description=__doc__.split("\n")[0])
    ap.add_argument("--split", default="val", choices=["val", "train"])
    ap.add_argument("--variant", default="lite0")
    args = ap.parse_args(argv)
    settings = Settings()  # the entry point's settings: the decode budget and the offline sets' sources
    configure_process(settings)
    t0 = time.perf_counter()
    backbone = PackagedBackbone(args.variant, visual=0.0)  # the concepts weigh the bridge (the visual channel: train/visual.py)
    rows = grid_search(backbone, args.split)
    rows.sort(key=lambda r: (-r["objective"], -r["sum"]))
    print(f"Concept weighting on the {args.split} split of the offline CIR set and its photos' tone edits "
          "(percent; R@10 on CIR, R@1 on the tone edits; classes weight 1; objective = mean of the two "
          "weighted-sum columns):\n")
    print("| object colour | scene colour | light | sigma | image | sum | image (recolour) | sum (recolour) "
          "| image (tone) | sum (tone) | objective |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows[:12] + [r for r in rows[12:] if not r["weights"].any]:
        w = r["weights"]
        print(f"| {w.object_colour:g} | {w.scene_colour:g} | {w.light:g} | {w.sigma:g} | {r['image']:.1f} | "
              f"{r['sum']:.1f} | {r['image:recolour']:.1f} | {r['sum:recolour']:.1f} | {r['tone:image']:.1f} | "
              f"{r['tone:sum']:.1f} | {r['objective']:.1f} |")
    best = rows[0]["weights"]
    print(f"\nbest by the objective: ConceptWeights({best.tag()})  ({time.perf_counter() - t0:.0f} s)")
    cost = cost_per_image(backbone)
    print(f"cost per image ({torch.get_num_threads()} torch threads, load average {load_average()}): CNN + class bridge "
          f"{cost['cnn']:.1f} ms, colour / light concepts {cost['concepts']:.1f} ms "
          f"(+{cost['concepts'] / cost['cnn'] * 100:.0f} %)")
    return 0


def _baseline_recalls(backbone, split: str = "test") -> Dict[str, Dict[str, float]]:
    """R@10 of the training-free composers on the offline CIR split, overall and per query kind."""
    from .cir import cir_tensors, rank_queries, recall

    queries, gallery, gemb, pos = cir_tensors(backbone, split)
    vecs = _training_free(gemb[[pos[q["reference"]] for q in queries]].astype(np.float32),
                          embed_texts(backbone, [q["text"] for q in queries], progress=False).numpy())
    kind = np.array([q["kind"] for q in queries])
    out = {}
    for name, q in vecs.items():
        r = rank_queries(q, queries, gallery, gemb, pos)["none"]
        out[name] = {"all": recall(r)["R@10"], **{k: recall(r[kind == k])["R@10"] for k in sorted(set(kind))}}
    return out


def offline_section(args=None, ctx=None):
    """`eval offline` section: the training-free composers on the test split with each packaged backbone
    version side by side: the classes-only bridge, + colour / light concepts, + the visual channel."""
    from ..backbones.concepts import ConceptWeights
    from ..backbones.packaged import PackagedBackbone

    live = (ctx or {}).get("backbone")
    if not isinstance(live, PackagedBackbone):
        return "Only measured for the packaged backbone.", {}
    versions = {"classes only": PackagedBackbone(live.variant, live.device, concepts=ConceptWeights(), visual=0.0),
                "concepts": PackagedBackbone(live.variant, live.device, concepts=live.concepts, visual=0.0)}
    if live.visual is not None:
        versions["concepts + visual"] = live
    res = {name: _baseline_recalls(b) for name, b in versions.items()}
    kinds = [k for k in res["concepts"]["image"] if k != "all"]
    lines = ["Training-free composers on the offline CIR test split (R@10, percent), one row per packaged backbone "
             "version (docs/backbones.md): " + "; ".join(f"{n} `{b.fingerprint}`" for n, b in versions.items())
             + ". The learned methods' rows for the shipped version are in the composed-retrieval section above; "
             "the earlier versions' learned checkpoints are no longer shipped. Every row here ranks without the hub "
             "correction (`engine.index.hubs`; the earlier versions have no chosen weight), so the same version's "
             "rows in the composed-retrieval section, ranked with it, can differ.", "",
             "| composer | version | all | " + " | ".join(kinds) + " |",
             "|---|---|---|" + "---|" * len(kinds)]
    for name in ("image", "text", "sum"):
        for version, r in res.items():
            row = r[name]
            lines.append(f"| {name} | {version} | {row['all']:.1f} | " + " | ".join(f"{row[k]:.1f}" for k in kinds) + " |")
    gain = {v: r["sum"]["recolour"] - r["image"]["recolour"] for v, r in res.items()}
    lines += ["", "On recolour queries the weighted sum beats image-only by "
              + ", ".join(f"{g:.1f} points R@10 with {v}" for v, g in gain.items()) + "."]
    return "\n".join(lines), res
