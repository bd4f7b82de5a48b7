"""Index a folder or a zip archive (the `python -m engine index` stage)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..config import Settings
from ..errors import InputError
from .pipeline import build_index
from .safezip import safe_extract_zip
from .store import GalleryIndex


def index_source(source, out, backbone, index_type: str = "auto", batch_size: int = 32,
                 workers: Optional[int] = None, settings: Optional[Settings] = None, progress=None,
                 dba: Optional[str] = None, dba_k: int = 16) -> GalleryIndex:
    settings = settings or Settings()
    source, out = Path(source), Path(out)
    if source.is_file() and source.suffix.lower() == ".zip":
        files = out / "files"
        import shutil

        shutil.rmtree(files, ignore_errors=True)
        safe_extract_zip(source, files, max_files=settings.max_zip_files,
                         max_total_bytes=int(settings.max_zip_mb * 1e6))
        source = files
    elif not source.is_dir():
        raise InputError(f"{source} is neither a folder nor a .zip archive")
    opts = {"checkpoint_dir": settings.checkpoints, "fingerprint": backbone.fingerprint}
    return build_index(source, out, backbone, index_type=index_type, batch_size=batch_size, workers=workers,
                       progress=progress, max_pixels=settings.max_pixels, vector_options=opts, dba=dba, dba_k=dba_k)
