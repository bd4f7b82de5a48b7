"""Context-I2W training data: image-caption pairs (offline sets, pair files, CC3M-style folders), the
deterministic held-out split, and the frozen backbone's features cached on disk (image embeddings and visual
tokens by image content, context embeddings by text)."""
from __future__ import annotations

import csv
import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ...config import cache_dir
from ...data import formats
from ...data.cir_triplets import load_offline_cir
from ...data.formats import image_path, load_split, read_jsonl
from ...data.heldout import is_held_out
from ...data.subjects import replace_subjects
from ...errors import InputError
from ...fileio import atomic_save_npy, atomic_write_bytes

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
PATH_KEYS = ("image", "path", "file", "filepath", "filename", "img")
CAPTION_KEYS = ("caption", "text", "title", "name", "title_text")



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
    from ...data.builders import ensure_built

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


def open_vocab_pairs(split: str = "train") -> List[Pair]:
    """The open-vocabulary set's edited pictures (``engine.data.open_vocab``, one side) with a caption that
    names the edit in that side's words: "teal hammer, a tool" (an XKCD colour), "hammer, a tool, after dark"
    (a light edit in one of the side's phrasings). Context-I2W learns from captions, so the open vocabulary
    reaches it as captions of edited pictures, not as triplets."""
    from ...data.builders import ensure_built

    ensure_built("open_vocab")  # the explicit build step (quick when built)
    out, seen = [], set()
    for rec in load_split("open_vocab", split):
        cap = rec.get("reference_caption")
        if not cap or rec["kind"] not in ("colour", "light") or rec["targets"][0] in seen:
            continue
        seen.add(rec["targets"][0])
        text = f"{rec['attribute']} {cap}" if rec["kind"] == "colour" else f"{cap.rstrip('. ')}, {rec['phrase']}"
        out.append(Pair(image_path("open_vocab", rec["targets"][0]), text))
    return out


def load_pairs(spec: str, split: str = "train", image_root: Optional[str] = None) -> List[Pair]:
    """``captions`` (offline set, one split), ``recoloured`` (the offline CIR set's colour edits),
    ``open-vocab`` (the open-vocabulary set's colour and light edits, :func:`open_vocab_pairs`), several
    of these joined by ``+``, a pair file, or a CC3M-style folder."""
    if "+" in spec and not Path(spec).exists():
        return [p for part in spec.split("+") for p in load_pairs(part, split, image_root)]
    if spec == "recoloured":
        return recoloured_pairs(split)
    if spec == "open-vocab":
        return open_vocab_pairs(split)
    if spec == "captions":
        from ...data.builders import ensure_built

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
    return cache_dir() / "context_i2w"


def _save_npy(path: Path, arr: np.ndarray) -> None:
    atomic_save_npy(path, arr)


def image_features(backbone, paths: Sequence[Path], batch_size: int = 32, cache: bool = True,
                   progress: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """(embeddings float32 (N, D), visual tokens float16 (N, 1+P, W)) in the order of ``paths``.

    Cached per image in ``<cache>/context_i2w/features/<backbone key>/<sha[:2]>/<sha>.npz`` (image content
    hash), so data sets that are rebuilt, re-split or share images reuse earlier work.
    """
    from tqdm.auto import tqdm

    from ...images import load_image, sha256_file

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


def _batch(feats: PairFeatures, idx: np.ndarray, device: str):
    idx = np.sort(idx)
    emb = torch.from_numpy(np.asarray(feats.emb[idx])).to(device).float()
    tok = torch.from_numpy(np.asarray(feats.tokens[idx])).to(device).float()
    ctx = torch.from_numpy(np.asarray(feats.context[idx])).to(device).float()
    return emb, tok, ctx

