"""Index a folder or a zip archive (the `python -m engine index` stage)."""
from __future__ import annotations

import logging
import shutil
import warnings
from pathlib import Path
from typing import Optional

from PIL import Image

from ..checkpoints import search_path
from ..config import Settings
from ..errors import InputError
from ..images import IMAGE_EXTENSIONS, check_header
from .pipeline import build_index
from .safezip import safe_extract_zip
from .store import GalleryIndex


def index_source(source, out, backbone, index_type: str = "auto", batch_size: int = 32,
                 workers: Optional[int] = None, *, settings: Settings, progress=None,
                 dba: Optional[str] = None, dba_k: int = 16) -> GalleryIndex:
    """The index of a folder or a .zip (extracted safely within ``settings``' limits) at ``out``; ``settings``:
    the entry point's."""
    source, out = Path(source), Path(out)
    if source.is_file() and source.suffix.lower() == ".zip":
        files = out / "files"

        shutil.rmtree(files, ignore_errors=True)
        safe_extract_zip(source, files, max_files=settings.max_zip_files,
                         max_total_bytes=int(settings.max_zip_mb * 1e6))
        precheck_images(files, settings)
        source = files
    elif not source.is_dir():
        raise InputError(f"{source} is neither a folder nor a .zip archive")
    opts = {"checkpoint_dir": search_path(settings), "fingerprint": backbone.fingerprint,
            "memory_budget": settings.index_memory_budget}
    return build_index(source, out, backbone, index_type=index_type, batch_size=batch_size, workers=workers,
                       progress=progress, max_pixels=settings.max_pixels,
                       max_decode_bytes=int(settings.max_decode_mb * 1e6), vector_options=opts, dba=dba, dba_k=dba_k)


def precheck_images(folder: Path, settings: Settings) -> None:
    """Header-only pass over extracted images before any is decoded: files over the per-image limits
    (pixels, aspect ratio, frames) are removed, and the upload is refused when the images left would
    decode to more than ``settings.max_zip_pixels`` pixels in all (one upload holds the indexing slot)."""
    total = 0
    for p in sorted(folder.rglob("*")):
        if not p.is_file() or p.suffix.lower() not in IMAGE_EXTENSIONS:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                with Image.open(p) as img:
                    check_header(img, p.name, settings.max_pixels, settings.max_aspect, settings.max_frames)
                    total += img.size[0] * img.size[1]
        except InputError as exc:
            logging.getLogger(__name__).info("skipping %s: %s", p.name, exc)
            p.unlink(missing_ok=True)
            continue
        except Exception:  # unreadable: the indexer skips it with its reason
            continue
        if total > settings.max_zip_pixels:
            raise InputError(f"the photos in this zip hold more than {settings.max_zip_pixels / 1e6:,.0f} million "
                             "pixels in all; split it into smaller zips")
