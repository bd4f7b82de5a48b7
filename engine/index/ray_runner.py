"""The indexing stages on a Ray cluster (``python -m engine index SRC --out DIR --runner ray``).

Same reader -> mapper -> writer -> assemble stages as the single-machine runner in ``pipeline.py``; only the
distributor changes (as clip-retrieval swaps pyspark/slurm around its stages):

* reader: the driver lists the inputs (a folder, a zip, a list file of paths, or a parquet/CSV table with a
  ``path`` column read with ``ray.data.read_parquet``/``read_csv``) and cuts them into shards of
  ``shard_size`` paths. A shard's id is its position plus a hash of the backbone fingerprint and its paths.
* mapper: ``ray.data.from_items(shards).map_batches(ShardEmbedder, concurrency=...)``: one actor per CPU
  (or per GPU when the cluster has GPUs), each loading the backbone once, hashing the images of a shard and
  running the local runner's own embedding stage on them (``pipeline.embed_stage``: decode within
  ``CIS_MAX_PIXELS`` / ``CIS_MAX_DECODE_MB``, preprocess, thumbnail, embed).
* writer: the actor writes ``ray-shards/<fp>/shard-<id>.npz`` atomically, keyed by the shard id, so a retried
  shard (Ray restarts a killed actor and re-runs its task) overwrites the same file with the same content.
* assemble: the driver reads the shard files in plan order, keeps one row per path, and saves the same
  index layout as the local runner (items, float16 embeddings, FAISS), so every other command works on it.

Resume: shards whose file exists and is intact are not sent to Ray again.
Ray is an optional dependency (``requirements-scale.txt``); it is imported only in this module.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..backbones import create_backbone
from ..config import Settings, child_environment
from ..errors import InputError
from .. import images
from ..images import sha256_file
from . import shards
from .pipeline import assemble_index, embed_stage
from .safezip import safe_extract_zip
from .shards import read_shard_file, write_shard_file
from .walk import find_images, load_captions

log = logging.getLogger(__name__)
LIST_SUFFIXES = (".txt", ".lst")
TABLE_SUFFIXES = (".parquet", ".csv")
WORKER_MARKERS = "workers"  # <shard folder>/workers/<pid>: which processes embed (tests kill one)


def _ray():
    try:
        import ray
    except ImportError:
        raise InputError("--runner ray needs Ray: pip install -r requirements-scale.txt") from None
    return ray


# -- reader ------------------------------------------------------------------------------------------
def _table_paths(source: Path) -> List[str]:
    ray = _ray()
    ds = ray.data.read_parquet(str(source)) if source.suffix.lower() == ".parquet" else ray.data.read_csv(str(source))
    cols = ds.columns()
    col = "path" if "path" in cols else ("url" if "url" in cols else None)
    if col is None:
        raise InputError(f"{source.name} has no 'path' column (columns: {', '.join(cols)})")
    return [str(r[col]) for r in ds.select_columns([col]).take_all()]


def resolve_inputs(source, out: Path, settings: Settings) -> Tuple[Path, List[str]]:
    """(root folder, sorted relative POSIX paths) for a folder, zip, list file or parquet/CSV of paths.
    Relative paths in a list or table are relative to the file's own folder."""
    source = Path(source)
    if source.is_dir():
        root = source.resolve()
        return root, find_images(root)
    if not source.is_file():
        raise InputError(f"{source} is neither a folder, a .zip, a list file (.txt) nor a .parquet/.csv of paths")
    suffix = source.suffix.lower()
    if suffix == ".zip":
        files = Path(out) / "files"
        shutil.rmtree(files, ignore_errors=True)
        safe_extract_zip(source, files, max_files=settings.max_zip_files,
                         max_total_bytes=int(settings.max_zip_mb * 1e6))
        root = files.resolve()
        return root, find_images(root)
    if suffix in LIST_SUFFIXES:
        raw = [ln.strip() for ln in source.read_text(encoding="utf-8", errors="replace").splitlines()]
        raw = [ln for ln in raw if ln and not ln.startswith("#")]
    elif suffix in TABLE_SUFFIXES:
        raw = _table_paths(source)
    else:
        raise InputError(f"{source.name}: expected a folder, .zip, .txt list, .parquet or .csv")
    if "://" in "".join(raw[:1]):
        raise InputError("URLs are not fetched: mount the shared storage and list its paths instead")
    base = source.resolve().parent
    absolute = sorted({str((base / p).resolve()) for p in raw})
    if not absolute:
        raise InputError(f"{source.name} lists no paths")
    root = Path(os.path.commonpath([os.path.dirname(p) for p in absolute]))
    return root, [Path(p).relative_to(root).as_posix() for p in absolute]


def plan_shards(rel: List[str], fingerprint: str, shard_size: int) -> List[dict]:
    shards = []
    for k, start in enumerate(range(0, len(rel), shard_size)):
        paths = rel[start:start + shard_size]
        digest = hashlib.sha256((fingerprint + "\n" + "\n".join(paths)).encode()).hexdigest()[:12]
        shards.append({"shard_id": f"{k:07d}-{digest}", "paths": "\n".join(paths)})
    return shards


def shard_folder(out: Path, fingerprint: str) -> Path:
    return shards.shard_folder(out, fingerprint, "ray-shards")


# -- mapper (one per Ray actor) ------------------------------------------------------------------------
class ShardEmbedder:
    """Loads the backbone once per actor; each call embeds whole shards and writes their files."""

    def __init__(self, backbone: str, fingerprint: str, device: str, root: str, folder: str, thumbs: str, max_pixels: int,
                 max_decode_bytes: int, batch_size: int, decode_budget_mb: float = 0.0):
        if decode_budget_mb:
            images.BUDGET.resize(decode_budget_mb)  # the actor's process decodes within the driver's budget
        self.backbone = create_backbone(backbone, device)
        if self.backbone.fingerprint != fingerprint:  # e.g. "auto" resolved differently on this node
            raise RuntimeError(f"worker backbone {self.backbone.fingerprint} differs from the driver's {fingerprint}")
        self.root, self.folder, self.thumbs = Path(root), Path(folder), Path(thumbs)
        self.max_pixels, self.max_decode_bytes, self.batch_size = max_pixels, max_decode_bytes, batch_size
        markers = self.folder / WORKER_MARKERS
        markers.mkdir(parents=True, exist_ok=True)
        self.marker = markers / str(os.getpid())
        self.marker.write_text("0")

    def embed_shard(self, shard_id: str, paths: List[str]) -> int:
        hashes, nbytes, keep, failed, reasons = [], [], [], [], []
        for p in paths:
            try:
                hashes.append(sha256_file(self.root / p))
                nbytes.append((self.root / p).stat().st_size)
                keep.append(p)
            except OSError as exc:
                failed.append(p)
                reasons.append(f"unreadable ({exc.__class__.__name__})")
        ok_idx, embs, sizes = [], [], []
        for batch in embed_stage(self.backbone, self.root, keep, hashes, self.thumbs, self.max_pixels,
                                 self.max_decode_bytes, self.batch_size, workers=0):  # the actor is the worker
            for j, err in batch.failed:
                failed.append(keep[j])
                reasons.append(err)
            embs.append(batch.embeddings)
            ok_idx += batch.positions
            sizes += batch.sizes
        dim = int(self.backbone.embed_dim)
        write_shard_file(self.folder / f"shard-{shard_id}.npz", [hashes[i] for i in ok_idx],
                         np.concatenate(embs) if embs else np.zeros((0, dim)), sizes,
                         paths=[keep[i] for i in ok_idx], nbytes=[nbytes[i] for i in ok_idx], failed=failed,
                         reasons=reasons)
        return len(paths)

    def __call__(self, batch: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
        counts = []
        for sid, joined in zip(batch["shard_id"], batch["paths"]):
            counts.append(self.embed_shard(str(sid), str(joined).split("\n")))
            self.marker.write_text(str(int(self.marker.read_text() or 0) + 1))
        return {"shard_id": np.asarray(batch["shard_id"]), "n": np.asarray(counts, dtype=np.int64)}


# -- driver --------------------------------------------------------------------------------------------
def _runtime_env() -> dict:
    """Workers import this package from the driver's copy, and see the same settings."""
    pkg = Path(__file__).resolve().parents[1]
    env = child_environment(only_prefixes=("CIS_", "HF_", "XDG_CACHE_HOME"))
    return {"py_modules": [str(pkg)], "excludes": ["__pycache__", "*.pyc"], "env_vars": env}


def build_index_ray(source, out, backbone, settings: Settings, address: Optional[str] = None, index_type: str = "auto",
                    batch_size: int = 32, workers: Optional[int] = None, shard_size: int = 256,
                    vector_options: Optional[dict] = None, dba: Optional[str] = None, dba_k: int = 16,
                    progress=None):
    """Index ``source`` on the Ray cluster at ``address`` (a new local one when None) into ``out``."""
    from tqdm.auto import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    root, rel = resolve_inputs(source, out, settings)
    if not rel:
        raise InputError(f"no images (jpg, png, webp, bmp, tiff, gif) found in {Path(source).name}")
    folder = shard_folder(out, backbone.fingerprint)
    folder.mkdir(parents=True, exist_ok=True)
    (out / "thumbs").mkdir(exist_ok=True)
    plan = plan_shards(rel, backbone.fingerprint, max(1, int(shard_size)))
    todo = [s for s in plan if read_shard_file(folder / f"shard-{s['shard_id']}.npz") is None]
    log.info("%d images in %d shards, %d shards to embed", len(rel), len(plan), len(todo))

    if todo:
        ray = _ray()
        ray.init(address=address, runtime_env=_runtime_env(), include_dashboard=False, log_to_driver=False,
                 ignore_reinit_error=True, logging_level=logging.WARNING)
        try:
            ray.data.DataContext.get_current().enable_progress_bars = False
            res = ray.cluster_resources()
            gpus = int(res.get("GPU", 0))
            n_actors = int(workers or gpus or max(1, int(res.get("CPU", 1))))
            n_actors = max(1, min(n_actors, len(todo)))
            device = "cuda" if gpus else "cpu"
            resources = {"num_gpus": 1} if gpus else {"num_cpus": 1}
            ds = ray.data.from_items(todo, override_num_blocks=len(todo)).map_batches(
                ShardEmbedder, batch_size=1, concurrency=n_actors, **resources,
                fn_constructor_kwargs={"backbone": settings.backbone, "fingerprint": backbone.fingerprint,
                                       "device": device, "root": str(root), "folder": str(folder),
                                       "thumbs": str(out / "thumbs"), "max_pixels": settings.max_pixels,
                                       "max_decode_bytes": int(settings.max_decode_mb * 1e6),
                                       "decode_budget_mb": settings.decode_budget_mb, "batch_size": batch_size})
            total = sum(len(s["paths"].split("\n")) for s in todo)
            bar = tqdm(total=total, desc=f"indexing on Ray ({n_actors} {'GPU' if gpus else 'CPU'} actors)",
                       unit="img", disable=progress is not None)
            done = 0
            for row in ds.iter_rows():
                done += int(row["n"])
                bar.update(int(row["n"]))
                if progress:
                    progress(done, total, "embedding images on Ray")
            bar.close()
        finally:
            ray.shutdown()

    # assemble: one row per path, in plan order, whatever retries happened
    known: Dict[str, Tuple[np.ndarray, list]] = {}
    by_path: Dict[str, str] = {}
    nbytes: Dict[str, int] = {}
    failed_paths: Dict[str, str] = {}
    for s in plan:
        got = read_shard_file(folder / f"shard-{s['shard_id']}.npz")
        if got is None:
            raise InputError(f"shard {s['shard_id']} was not written; rerun the same command to resume")
        for p, h, e, sz, b in zip(got.paths, got.hashes, got.embeddings, got.sizes, got.bytes):
            by_path[str(p)] = str(h)
            known[str(h)] = (e, [int(sz[0]), int(sz[1])])
            nbytes[str(p)] = int(b)
        for p, why in zip(got.failed, got.reasons):
            failed_paths[str(p)] = str(why)
    hashes = [by_path.get(r) for r in rel]
    failed = {i: failed_paths[r] for i, r in enumerate(rel) if r in failed_paths and r not in by_path}
    captions = load_captions(root, rel)
    t0 = time.perf_counter()
    index = assemble_index(root, out, backbone, rel, hashes, known, failed, captions, index_type=index_type,
                           vector_options=vector_options, dba=dba, dba_k=dba_k, progress=progress,
                           progress_total=len(rel), sizes_on_disk=nbytes)
    log.info("assembled %d items in %.1f s", len(index), time.perf_counter() - t0)
    return index
