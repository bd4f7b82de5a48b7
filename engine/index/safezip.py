"""Safe extraction of uploaded zip archives: no path traversal, absolute paths or links; entry, size and
compression-ratio limits so that a zip bomb is refused before anything is written."""
from __future__ import annotations

import logging
import shutil
import stat
import zipfile
from pathlib import Path, PurePosixPath

from ..errors import InputError
from ..images import IMAGE_EXTENSIONS

log = logging.getLogger(__name__)
MAX_RATIO = 200  # uncompressed / compressed size of one entry


def safe_extract_zip(archive, dest, max_files: int = 2000, max_total_bytes: int = 500_000_000,
                     images_only: bool = True) -> list:
    """Extract ``archive`` into ``dest`` (created); returns the relative paths written.

    Raises InputError (and writes nothing) on an unsafe or oversized archive.
    """
    dest = Path(dest)
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError):
        raise InputError("the upload is not a readable zip archive") from None
    with zf:
        plan = []
        total = 0
        infos = zf.infolist()
        if len(infos) > max_files * 4:
            raise InputError(f"the archive has {len(infos)} entries; the limit is {max_files}")
        for info in infos:
            name = info.filename
            mode = (info.external_attr >> 16) & 0xFFFF
            if info.is_dir():
                continue
            if stat.S_ISLNK(mode):
                raise InputError(f"the archive contains a symbolic link ({name}); refused")
            p = PurePosixPath(name.replace("\\", "/"))
            if p.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
                raise InputError(f"the archive contains an absolute path ({name}); refused")
            if any(part == ".." for part in p.parts):
                raise InputError(f"the archive contains a path leaving its folder ({name}); refused")
            if any(part.startswith(".") or part == "__MACOSX" for part in p.parts):
                continue
            if images_only and p.suffix.lower() not in IMAGE_EXTENSIONS:
                continue
            if info.compress_size and info.file_size / max(info.compress_size, 1) > MAX_RATIO:
                raise InputError(f"{name} expands {info.file_size // max(info.compress_size, 1)}x; "
                                 "refused as a possible zip bomb")
            total += info.file_size
            if total > max_total_bytes:
                raise InputError(f"the archive expands to more than {max_total_bytes / 1e6:.0f} MB; refused")
            plan.append((info, p))
        if len(plan) > max_files:
            raise InputError(f"the archive has {len(plan)} images; the limit is {max_files}")
        if not plan:
            raise InputError("the archive contains no images (jpg, png, webp, bmp, tiff, gif)")
        dest.mkdir(parents=True, exist_ok=True)
        root = dest.resolve()
        written = []
        try:
            for info, p in plan:
                _extract_one(zf, info, p, root, written)
        except InputError:
            shutil.rmtree(root, ignore_errors=True)
            raise
        except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError, EOFError) as exc:
            shutil.rmtree(root, ignore_errors=True)
            log.info("zip member unreadable: %s", exc)
            raise InputError("the zip archive is damaged or uses an unsupported compression; create it again") from None
        except OSError as exc:  # a name too long for the file system, disk full, ...
            shutil.rmtree(root, ignore_errors=True)
            log.info("zip member not written: %s", exc)
            raise InputError("a file in the zip could not be extracted (name too long or disk full)") from None
        return written


def _extract_one(zf, info, p, root, written):
    """Write one planned member under ``root``; appends its relative path to ``written``."""
    target = (root / Path(*p.parts)).resolve()
    if root not in target.parents:
        raise InputError(f"the archive contains a path leaving its folder ({info.filename}); refused")
    target.parent.mkdir(parents=True, exist_ok=True)
    budget = info.file_size
    with zf.open(info) as src, open(target, "wb") as out:
        copied = 0
        while True:
            chunk = src.read(1 << 20)
            if not chunk:
                break
            copied += len(chunk)
            if copied > budget:  # the header lied about the size
                out.close()
                shutil.rmtree(root, ignore_errors=True)
                raise InputError(f"{info.filename} is larger than its header says; refused")
            out.write(chunk)
    written.append(p.as_posix())
