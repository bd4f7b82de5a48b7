"""On-disk gallery index: items, float16 embeddings, vector index, thumbnails; atomic versioned saves.

Layout of an index folder::

    CURRENT                 name of the live version (replaced atomically)
    v-<stamp>/meta.json     backbone fingerprint, dim, index type, counts, source folder
    v-<stamp>/items.jsonl   one record per image: id, path (relative), sha256, size, caption
    v-<stamp>/embeddings.npy  float16 (N, D), row i belongs to item i
    v-<stamp>/density.npy   float32 (N,), each item's hub density (engine.index.hubs), computed when the version
                            is saved (not above hubs.MAX_ITEMS items; an index without it computes it on first use)
    v-<stamp>/vectors.*     the vector index's own files where it keeps any
    thumbs/<sha[:20]>.jpg   thumbnails shared across versions
    cache/<fp-hash>/shard-*.npz  embeddings by content hash (incremental updates, resume)
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import numpy as np

from ..errors import IndexLoadError
from . import hubs
from .vectors import VectorIndex, create_vector_index
from ..fileio import atomic_write_text

FORMAT_VERSION = 1
log = logging.getLogger(__name__)
CHECKSUMS = "checksums.json"
REBUILD = "rebuild it with `python -m engine index <images> --out <index folder>` (the app rebuilds its own)"


def file_checksum(path, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file, read into one reused 1 MB buffer (memory stays flat whatever the index size)."""
    h = hashlib.sha256()
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def verify_checksums(version: Path) -> None:
    """Check every file of an index version against the checksums recorded when it was saved.

    Raises IndexLoadError naming the first file that is missing, extra or changed (a bit flip, shuffled
    rows, an edited metadata line, truncation)."""
    try:
        recorded = json.loads((version / CHECKSUMS).read_text())["files"]
    except FileNotFoundError:
        raise IndexLoadError(f"the index version {version.name} has no {CHECKSUMS} (saved by an older version or "
                             f"damaged), so it cannot be verified; {REBUILD}") from None
    except (OSError, ValueError, KeyError, TypeError):
        raise IndexLoadError(f"the index file {CHECKSUMS} is damaged; {REBUILD}") from None
    present = {p.name for p in version.iterdir() if p.is_file() and p.name != CHECKSUMS}
    for name in sorted(present - set(recorded)):
        raise IndexLoadError(f"the index holds a file its checksums do not list ({name}); {REBUILD}")
    for name, digest in sorted(recorded.items()):
        path = version / name
        if name not in present:
            raise IndexLoadError(f"the index file {name} is missing; {REBUILD}")
        if file_checksum(path) != digest:
            raise IndexLoadError(f"the index file {name} does not match the checksum recorded when it was saved "
                                 f"(damaged or edited); {REBUILD}")


DENSITY = "density.npy"


def _load_density(path: Path, n: int) -> Optional[np.ndarray]:
    """The saved hub density of an index version, None when the version has none (saved before it existed, or
    above hubs.MAX_ITEMS items); IndexLoadError when it is there but not N finite numbers."""
    if not path.is_file():
        return None
    try:
        dens = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise IndexLoadError(f"index file {path} is damaged ({exc}); rebuild the index") from None
    if dens.shape != (n,) or not np.issubdtype(dens.dtype, np.floating) or not np.isfinite(dens).all():
        raise IndexLoadError(f"index file {path} does not hold one finite density per item; rebuild the index")
    return dens.astype(np.float32)


@dataclass
class GalleryIndex:
    folder: Path
    meta: dict
    items: List[dict]
    embeddings: np.ndarray  # float16 (N, D)
    vectors: Optional[VectorIndex] = None
    _density: Optional[np.ndarray] = field(default=None, repr=False, compare=False)

    # -- properties -------------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        return self.meta["fingerprint"]

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    def __len__(self) -> int:
        return len(self.items)

    @property
    def source(self) -> Path:
        return Path(self.meta["source"])

    def image_path(self, i: int) -> Path:
        return self.source / self.items[i]["path"]

    def thumb_path(self, i: int) -> Path:
        return self.folder / "thumbs" / (self.items[i]["sha256"][:20] + ".jpg")

    def display_path(self, i: int) -> Path:
        """The item's thumbnail when it matches the checksum recorded when it was made (each file checked once
        per version of it), else the source image: a thumbnail overwritten on disk is never served."""
        thumb = self.thumb_path(i)
        return thumb if self._thumb_ok(thumb) else self.image_path(i)

    def _thumb_ok(self, thumb: Path) -> bool:
        try:
            st = thumb.stat()
        except OSError:
            return False
        checked = self.__dict__.setdefault("_thumbs_checked", {})
        key = (thumb.name, st.st_size, st.st_mtime_ns)
        if key not in checked:
            sums = self.__dict__.get("_thumb_sums")
            if sums is None:
                try:
                    sums = json.loads((thumb.parent / "checksums.json").read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    sums = {}
                sums = self.__dict__["_thumb_sums"] = sums if isinstance(sums, dict) else {}
            want = sums.get(thumb.name)
            try:
                checked[key] = want is None or file_checksum(thumb) == want
            except OSError:
                checked[key] = False
            if not checked[key]:
                log.warning("thumbnail %s does not match its checksum; the source image is shown instead", thumb.name)
        return checked[key]

    def vectors_f32(self) -> np.ndarray:
        return self.embeddings.astype(np.float32)

    def stats(self) -> dict:
        d = {
            "items": len(self),
            "dim": self.dim,
            "fingerprint": self.fingerprint,
            "index_type": self.meta.get("index_type", "flat"),
            "embedding_bytes_per_item": 2 * self.dim,
            "skipped": len(self.meta.get("skipped", [])),
        }
        if self.vectors is not None:
            d["vector_index"] = self.vectors.describe()
        return d

    # -- search -----------------------------------------------------------------------
    def search(self, queries: np.ndarray, k: int, hub_weight: float = 0.0):
        """(scores, ids) of the ``k`` best items per query; with ``hub_weight`` the first ``max(k, hubs.POOL)``
        are re-ranked by the hub correction (``engine.index.hubs``; not above ``hubs.MAX_ITEMS`` items)."""
        if self.vectors is None:
            raise IndexLoadError("the index has no vector index loaded")
        dens = self.hub_density() if hub_weight else None
        if dens is None:
            return self.vectors.search(queries, k)
        s, i = self.vectors.search(queries, min(len(self), max(k, hubs.POOL)))
        s, i = hubs.corrected(s, i, dens, hub_weight)
        return s[:, :k], i[:, :k]

    def hub_density(self) -> Optional[np.ndarray]:
        """(N,) each item's density (``engine.index.hubs.density``): the one saved with the index version, else
        computed on first use; None for a gallery above ``hubs.MAX_ITEMS`` items."""
        if self._density is None and 0 < len(self) <= hubs.MAX_ITEMS:
            self._density = hubs.density(self.vectors_f32())
        return self._density

    # -- persistence ------------------------------------------------------------------
    def save(self) -> Path:
        """Write a new version and switch CURRENT to it atomically; older versions are removed."""
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "thumbs").mkdir(exist_ok=True)
        name = f"v-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
        tmp = self.folder / f".{name}.tmp"
        tmp.mkdir()
        try:
            return self._save_version(tmp, name)
        except BaseException:  # a full disk, a kill: the half-written version goes, CURRENT still names the old
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _save_version(self, tmp: Path, name: str) -> Path:
        self.meta.update(format=FORMAT_VERSION, count=len(self.items), dim=int(self.embeddings.shape[1]))
        with open(tmp / "embeddings.npy", "wb") as f:
            np.save(f, np.ascontiguousarray(self.embeddings, dtype=np.float16), allow_pickle=False)
        if 0 < len(self) <= hubs.MAX_ITEMS:  # computed here, once per version, not on the first search
            self._density = hubs.density(self.vectors_f32())
            with open(tmp / DENSITY, "wb") as f:
                np.save(f, self._density, allow_pickle=False)  # float32 (hubs.density)
        (tmp / "items.jsonl").write_text("".join(json.dumps(it, ensure_ascii=False) + "\n" for it in self.items))
        if self.vectors is not None:
            self.vectors.save(tmp)
        (tmp / "meta.json").write_text(json.dumps(self.meta, indent=2, ensure_ascii=False))
        sums = {}
        for p in sorted(tmp.iterdir()):  # checksum each file and make it durable before it becomes visible
            sums[p.name] = file_checksum(p)
            with open(p, "rb") as f:
                os.fsync(f.fileno())
        (tmp / CHECKSUMS).write_text(json.dumps({"algorithm": "sha256", "files": sums}, indent=1))
        with open(tmp / CHECKSUMS, "rb") as f:
            os.fsync(f.fileno())
        final = self.folder / name
        os.replace(tmp, final)
        atomic_write_text(self.folder / "CURRENT", name + "\n")
        for old in self.folder.glob("v-*"):
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)
        for stale in self.folder.glob(".v-*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        return final

    @classmethod
    def load(
        cls,
        folder,
        expected_fingerprint: Optional[str] = None,
        build_vectors: bool = True,
        vector_options: Optional[dict] = None,
        verify: bool = True,
    ) -> "GalleryIndex":
        """``verify=False`` skips the checksum pass; only `engine bench integrity` uses it, to measure it."""
        folder = Path(folder)
        current = folder / "CURRENT"
        if not current.exists():
            raise IndexLoadError(f"no index at {folder} (CURRENT is missing); build it with `python -m engine index`")
        try:
            name = current.read_bytes().decode("utf-8").strip()
        except (OSError, UnicodeDecodeError):
            raise IndexLoadError(f"the index's CURRENT file at {folder} is unreadable or not UTF-8 text; "
                                 "rebuild the index") from None
        version = folder / name
        try:  # a name over the file system's limit (255 bytes) or holding a NUL byte is no version either
            is_version = bool(name) and len(name.encode("utf-8")) <= 255 and "\0" not in name \
                and Path(name).name == name and name not in (".", "..") and version.is_dir()
        except (OSError, ValueError):
            is_version = False
        if not is_version:
            raise IndexLoadError(f"the index's CURRENT file at {folder} names no version of it; rebuild the index")
        if verify:
            verify_checksums(version)
        meta_path = version / "meta.json"
        try:
            meta = json.loads(meta_path.read_text())
            items = [json.loads(line) for line in (version / "items.jsonl").read_text().splitlines() if line.strip()]
        except (OSError, ValueError) as exc:
            raise IndexLoadError(f"index file {meta_path.parent} is damaged ({exc}); rebuild the index") from None
        emb_path = version / "embeddings.npy"
        try:
            embeddings = np.load(emb_path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise IndexLoadError(f"index file {emb_path} is damaged ({exc}); rebuild the index") from None
        if embeddings.ndim != 2 or embeddings.shape[0] != len(items) or embeddings.shape[1] != meta.get("dim"):
            raise IndexLoadError(
                f"index file {emb_path} has shape {embeddings.shape}, expected ({len(items)}, {meta.get('dim')}); "
                "rebuild the index"
            )
        if not np.isfinite(embeddings).all():
            raise IndexLoadError(f"index file {emb_path} holds non-finite values; rebuild the index")
        if expected_fingerprint and meta.get("fingerprint") != expected_fingerprint:
            raise IndexLoadError(
                f"the index at {folder} was built with backbone {meta.get('fingerprint')!r}, but the live backbone "
                f"is {expected_fingerprint!r}; rebuild it: python -m engine index <images> --out {folder} "
                f"--backbone <name>"
            )
        index = cls(folder, meta, items, embeddings, _density=_load_density(version / DENSITY, len(items)))
        if build_vectors:
            index.attach_vectors(meta.get("index_type", "auto"), **(vector_options or {}), _version=version)
        return index

    def attach_vectors(self, kind: str = "auto", _version: Optional[Path] = None, **options) -> VectorIndex:
        vi = create_vector_index(kind, self.dim, len(self), **options)
        # an index that reads float16 itself (IVF-PQ) gets the stored matrix: no float32 copy of the gallery
        vecs = self.embeddings if getattr(vi, "takes_float16", False) else self.vectors_f32()
        if len(vecs) == 0:
            raise IndexLoadError(f"the index at {self.folder} is empty; add images and rebuild it")
        if _version is not None:
            vi.load(_version, vecs)
        else:
            vi.build(vecs)
        self.vectors = vi
        self.meta["index_type"] = vi.kind
        return vi

