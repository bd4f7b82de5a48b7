"""Indexing as small stages (find -> read/decode -> embed -> write shards -> assemble), as in clip-retrieval.

Each stage is a plain function over plain data so a distributed runner can reuse them; ``build_index``
is the single-machine runner. Embeddings are cached by content hash in shards written atomically
while the run goes on, so a killed run resumes without re-embedding finished files and an unchanged
file is never embedded twice.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from ..errors import InputError
from ..expand import EXPANDERS, ExpanderUnavailable
from ..fileio import atomic_write_bytes, atomic_write_text
from ..images import DEFAULT_MAX_DECODE_BYTES, load_image, sha256_file
from .shards import cache_folder, read_shards, write_shard  # noqa: F401  (engine.data.features uses them too)
from .store import GalleryIndex
from .walk import find_images, load_captions

log = logging.getLogger(__name__)
THUMB_SIZE = 256
Progress = Optional[Callable[[int, int, str], None]]


# -- stage: read / decode -------------------------------------------------------------------
class DecodeDataset(Dataset):
    """Reads, decodes and preprocesses one image; writes its thumbnail. Runs in DataLoader workers."""

    def __init__(self, root: Path, rel_paths: List[str], hashes: List[str], preprocess, thumbs: Path, max_pixels,
                 max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES):
        self.root, self.rel, self.hashes = Path(root), rel_paths, hashes
        self.preprocess, self.thumbs, self.max_pixels = preprocess, thumbs, max_pixels
        self.max_decode_bytes = max_decode_bytes

    def __len__(self):
        return len(self.rel)

    def __getitem__(self, i):
        try:
            img = load_image(self.root / self.rel[i], max_pixels=self.max_pixels, max_decode_bytes=self.max_decode_bytes)
        except InputError as exc:
            return {"i": i, "ok": False, "error": str(exc)}
        thumb = self.thumbs / (self.hashes[i][:20] + ".jpg") if self.thumbs is not None else None
        if thumb is not None and not thumb.exists():
            try:
                atomic_write_bytes(thumb, thumbnail_bytes(img))
            except OSError:  # a full disk in a worker: the main process rebuilds missing thumbnails and reports it
                pass
        return {"i": i, "ok": True, "pixels": self.preprocess(img), "size": list(img.size)}


def _collate(batch):
    good = [b for b in batch if b["ok"]]
    return {
        "i": [b["i"] for b in good],
        "size": [b["size"] for b in good],
        "pixels": torch.stack([b["pixels"] for b in good]) if good else None,
        "failed": [(b["i"], b["error"]) for b in batch if not b["ok"]],
    }


# -- stage: embed ------------------------------------------------------------------------------------
@dataclass
class EmbeddedBatch:
    """One batch of the embedding stage: ``positions`` into the paths given, their float32 embeddings and
    decoded sizes, and the positions that failed to decode with one sentence each."""
    positions: List[int]
    embeddings: np.ndarray
    sizes: List[list]
    failed: List[Tuple[int, str]]


def embed_stage(backbone, root: Path, rel: List[str], hashes: List[str], thumbs: Optional[Path], max_pixels: int,
                max_decode_bytes: int, batch_size: int = 32, workers: int = 0) -> Iterator[EmbeddedBatch]:
    """The one embedding stage of both distributors: read, decode (within ``max_pixels`` and
    ``max_decode_bytes``), preprocess and thumbnail ``rel`` under ``root`` in ``workers`` DataLoader processes
    (0: this one), embed each batch with ``backbone``. The local runner (:func:`build_index`) feeds it the
    files to embed; the Ray runner (``ray_runner.ShardEmbedder``) one shard per call, inside its actor."""
    ds = DecodeDataset(root, rel, hashes, backbone.preprocess, thumbs, max_pixels, max_decode_bytes)
    loader = DataLoader(ds, batch_size=batch_size, num_workers=workers, collate_fn=_collate,
                        persistent_workers=False, prefetch_factor=4 if workers else None)
    for batch in loader:
        emb = np.zeros((0, int(backbone.embed_dim)), np.float32)
        if batch["pixels"] is not None:
            with torch.no_grad():
                emb = backbone.encode_images(batch["pixels"]).float().cpu().numpy()
        yield EmbeddedBatch(batch["i"], emb, batch["size"], batch["failed"])


# -- stage: embedding cache shards: engine/index/shards.py ----------------------------------------
# -- the single-machine runner ------------------------------------------------------------------
def build_index(
    source,
    out,
    backbone,
    index_type: str = "auto",
    batch_size: int = 32,
    workers: Optional[int] = None,
    shard_every: int = 4,
    progress: Progress = None,
    max_pixels: int = 40_000_000,
    max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES,
    vector_options: Optional[dict] = None,
    dba: Optional[str] = None,
    dba_k: int = 16,
) -> GalleryIndex:
    """Index every image under ``source`` into ``out``; reuses embeddings of unchanged files."""
    from tqdm.auto import tqdm

    source, out = Path(source).resolve(), Path(out)
    if not source.is_dir():
        raise InputError(f"gallery folder not found: {source}")
    out.mkdir(parents=True, exist_ok=True)
    thumbs = out / "thumbs"
    thumbs.mkdir(exist_ok=True)
    rel = find_images(source)
    if not rel:
        raise InputError(f"no images (jpg, png, webp, bmp, tiff, gif) found under {source.name}")
    hashes = [sha256_file(source / r) for r in rel]
    captions = load_captions(source, rel)
    cache = cache_folder(out, backbone.fingerprint)
    known = read_shards(cache)
    todo = [i for i, h in enumerate(hashes) if h not in known]
    # said when there is work; a run with nothing to embed (a restart, a prebuilt first start) is not news
    log.log(logging.INFO if todo else logging.DEBUG, "%d images, %d cached, %d to embed", len(rel),
            len(rel) - len(todo), len(todo))

    failed: Dict[int, str] = {}
    if todo:
        if workers is None:
            workers = min(2, os.cpu_count() or 1)
        pend_h: List[str] = []
        pend_e: List[np.ndarray] = []
        pend_s: List[list] = []
        bar = tqdm(total=len(todo), desc="indexing", unit="img", disable=progress is not None)
        done = 0
        stage = embed_stage(backbone, source, [rel[i] for i in todo], [hashes[i] for i in todo], thumbs, max_pixels,
                            max_decode_bytes, batch_size, workers)
        for b_no, batch in enumerate(stage):
            for j, err in batch.failed:
                failed[todo[j]] = err
            for j, e, s in zip(batch.positions, batch.embeddings, batch.sizes):
                h = hashes[todo[j]]
                known[h] = (e.astype(np.float16), s)
                pend_h.append(h)
                pend_e.append(e)
                pend_s.append(s)
            n = len(batch.positions) + len(batch.failed)
            done += n
            bar.update(n)
            if progress:
                progress(done, len(todo), "embedding images")
            if pend_h and (b_no + 1) % shard_every == 0:
                write_shard(cache, pend_h, np.stack(pend_e), pend_s)
                pend_h, pend_e, pend_s = [], [], []
        if pend_h:
            write_shard(cache, pend_h, np.stack(pend_e), pend_s)
        bar.close()

    index = assemble_index(source, out, backbone, rel, hashes, known, failed, captions, index_type=index_type,
                           vector_options=vector_options, dba=dba, dba_k=dba_k, progress=progress,
                           progress_total=len(todo))
    compact_cache(cache, {it["sha256"] for it in index.items})
    repair_thumbnails(source, thumbs, index.items, max_pixels, max_decode_bytes)
    return index


# -- stage: thumbnails, checksummed ---------------------------------------------------------------
THUMB_SUMS = "checksums.json"


def thumbnail_bytes(img) -> bytes:
    t = img.copy()
    t.thumbnail((THUMB_SIZE, THUMB_SIZE))
    buf = io.BytesIO()
    t.save(buf, "JPEG", quality=85)
    return buf.getvalue()


def repair_thumbnails(source: Path, thumbs: Path, items: List[dict], max_pixels: int = 40_000_000,
                      max_decode_bytes: int = DEFAULT_MAX_DECODE_BYTES) -> int:
    """Check every item's thumbnail against the SHA-256 recorded in ``thumbs/checksums.json`` and rebuild
    the damaged or missing ones from their source image (a thumbnail met for the first time is recorded when
    it decodes). Returns how many were rebuilt."""
    sums_path = thumbs / THUMB_SUMS
    try:
        sums = json.loads(sums_path.read_text(encoding="utf-8"))
        sums = sums if isinstance(sums, dict) else {}
    except (OSError, ValueError):
        sums = {}
    fresh: Dict[str, str] = {}
    rebuilt = damaged = 0
    for it in items:
        name = it["sha256"][:20] + ".jpg"
        path = thumbs / name
        ok = False
        if path.is_file():
            digest = sha256_file(path)
            if name in sums:
                ok = digest == sums[name]
            else:  # written by this run's decoders (or an index made before checksums): keep it if it decodes
                try:
                    with Image.open(path) as im:
                        im.load()
                    ok = True
                except Exception:
                    ok = False
        if not ok:
            try:
                data = thumbnail_bytes(load_image(source / it["path"], max_pixels=max_pixels,
                                                  max_decode_bytes=max_decode_bytes))
            except (InputError, OSError):
                continue  # its source is gone or unreadable: the page falls back to the source image
            try:  # not flushed one by one (399 files on a first start): each is checked against its checksum above
                atomic_write_bytes(path, data, durable=False)
            except OSError as exc:  # a full disk: the page shows source images for the missing thumbnails
                log.warning("thumbnails not written (%s); the source images are shown instead",
                            exc.strerror or exc.__class__.__name__)
                return rebuilt
            digest = hashlib.sha256(data).hexdigest()
            rebuilt += 1
            damaged += name in sums  # recorded before, now missing or changed: a repair, not a first make
        fresh[name] = digest
    if rebuilt or fresh != sums:
        try:
            atomic_write_text(sums_path, json.dumps(fresh, sort_keys=True))
        except OSError as exc:
            log.warning("thumbnail checksums not written (%s); they are checked again at the next start",
                        exc.strerror or exc.__class__.__name__)
    if damaged:
        log.warning("repaired %d damaged or missing thumbnails", damaged)
    if rebuilt - damaged:
        log.debug("made %d thumbnails", rebuilt - damaged)  # new images get thumbnails: routine, not a repair
    return rebuilt


# -- stage: assemble (shared by every runner) -------------------------------------------------------
def assemble_index(source: Path, out: Path, backbone, rel: List[str], hashes: List[Optional[str]],
                   known: Dict[str, Tuple[np.ndarray, list]], failed: Dict[int, str], captions: Dict[str, str],
                   index_type: str = "auto", vector_options: Optional[dict] = None, dba: Optional[str] = None,
                   dba_k: int = 16, progress: Progress = None, progress_total: int = 0,
                   sizes_on_disk: Optional[Dict[str, int]] = None) -> GalleryIndex:
    """Items in ``rel`` order (one per path, so a path embedded twice by a retried worker appears once),
    their float16 embeddings, the vector index; saved as a new version of ``out``."""
    items, embs = [], []
    for i, (r, h) in enumerate(zip(rel, hashes)):
        if h is None or h not in known:
            continue
        e, size = known[h]
        item = {"id": len(items), "path": r, "sha256": h, "width": size[0], "height": size[1],
                "bytes": (sizes_on_disk[r] if sizes_on_disk else (source / r).stat().st_size)}
        if r in captions:
            item["caption"] = captions[r]
        items.append(item)
        embs.append(e)
    if not items:
        raise InputError(f"none of the {len(rel)} files under {source.name} could be decoded")
    meta = {
        "fingerprint": backbone.fingerprint,
        "backbone": backbone.name,
        "dim": int(backbone.embed_dim),
        "source": str(source),
        "index_type": index_type,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "skipped": [{"path": rel[i], "reason": failed[i]} for i in sorted(failed)],
    }
    matrix = np.stack(embs).astype(np.float32)
    if dba:  # database-side augmentation: a separate index variant whose vectors are their own expansions
        matrix = _dba(matrix, dba, dba_k, backbone, vector_options or {})
        meta["dba"] = {"method": dba, "k": int(dba_k)}
    index = GalleryIndex(out, meta, items, matrix.astype(np.float16))
    if progress:
        progress(progress_total, progress_total, "building the vector index")
    index.attach_vectors(index_type, **(vector_options or {}))
    index.save()
    return index


def _dba(matrix: np.ndarray, method: str, k: int, backbone, options: dict) -> np.ndarray:
    from ..expand.dba import dba_vectors

    model = None
    if method == "lattqe":
        try:
            model = EXPANDERS.get("lattqe")(embed_dim=backbone.embed_dim, checkpoint_dir=options.get("checkpoint_dir"),
                                           fingerprint=backbone.fingerprint).model
        except ExpanderUnavailable as exc:
            raise InputError(f"LAttDBA needs a LAttQE checkpoint: {exc}") from None
    return dba_vectors(matrix, method, k=min(k, len(matrix)), model=model, progress=False)


def compact_cache(cache: Path, keep: Iterable[str]) -> None:
    """Merge shards into one holding only the hashes still in the gallery (removed files drop out)."""
    shards = sorted(cache.glob("shard-*.npz"))
    if len(shards) <= 1:
        return
    keep = set(keep)
    found = read_shards(cache)
    hs = [h for h in found if h in keep]
    if hs:
        write_shard(cache, hs, np.stack([found[h][0] for h in hs]), [found[h][1] for h in hs])
    newest = max(cache.glob("shard-*.npz"), key=lambda p: p.name)
    for s in shards:
        if s != newest:
            s.unlink(missing_ok=True)
