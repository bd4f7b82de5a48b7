"""On-disk format and loader API of the offline data sets.

Every set lives in ``cache_dir()/datasets/<name>/``::

    manifest.json          sources, licences, versions, seed, counts, format version
    images/...             image files (PNG / JPEG); record paths are relative to this folder
    <split>.jsonl          one JSON object per line (a query, a caption pair, a labelled image ...)
    <part>/<split>.jsonl   for sets with several parts (``labelled``: fmnist, fmnist_small, objects)

The loader API is deliberately small:

* :func:`load_split` ``(name, split, part=None) -> list[dict]`` – records of one split of a built
  set (loading never builds; :mod:`engine.data.builders` is the explicit build step).
* :func:`image_root` ``(name) -> Path`` – folder that record image paths are relative to.
* :func:`image_path` ``(name, rel) -> Path`` – absolute path of one record image, checked to stay
  inside the set.
* :func:`load_manifest` ``(name) -> dict``.

Writers are atomic (temporary file, then ``os.replace``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator, Optional, Tuple

from ..config import cache_dir
from ..errors import InputError
from ..fileio import atomic_write_json, atomic_write_text

FORMAT_VERSION = 2
DATASET_NAMES = ("cir", "captions", "labelled", "multilabel", "open_vocab")
IMAGES_DIRNAME = "images"
MANIFEST = "manifest.json"


def datasets_root() -> Path:
    """Folder holding every assembled set (``cache_dir()/datasets``)."""
    path = cache_dir() / "datasets"
    path.mkdir(parents=True, exist_ok=True)
    return path


def dataset_dir(name: str) -> Path:
    """Folder of one set; the name must be one of :data:`DATASET_NAMES`."""
    if name not in DATASET_NAMES:
        raise InputError(f"unknown data set {name!r}; choose one of {', '.join(DATASET_NAMES)}")
    return datasets_root() / name


def image_root(name: str) -> Path:
    """Folder that the image paths in a set's records are relative to."""
    return dataset_dir(name) / IMAGES_DIRNAME


def image_path(name: str, rel: str) -> Path:
    """Absolute path of a record's image; refuses paths that leave the set's image folder."""
    root = image_root(name).resolve()
    path = (root / rel).resolve()
    if root != path and root not in path.parents:
        raise InputError(f"image path {rel!r} points outside data set {name!r}")
    return path


def write_json(path: Path, obj) -> None:
    """Atomically write ``obj`` as pretty JSON."""
    atomic_write_json(path, obj, indent=2, sort_keys=True, ensure_ascii=False)


def write_jsonl(path: Path, records: Iterable[dict]) -> int:
    """Atomically write records as JSON lines; returns how many were written."""
    lines = [json.dumps(rec, sort_keys=True, ensure_ascii=False) + "\n" for rec in records]
    atomic_write_text(path, "".join(lines))
    return len(lines)


def iter_jsonl(path: Path) -> Iterator[Tuple[int, dict]]:
    """(line number, record) per non-blank line of a JSON-lines file: the one JSONL reader of the engine.
    A malformed line raises InputError naming the file and the line."""
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path.name}, line {lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(rec, dict):
                raise InputError(f"{path.name}, line {lineno}: expected a JSON object")
            yield lineno, rec


def read_jsonl(path: Path) -> list[dict]:
    """Read JSON lines; a malformed line raises InputError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"annotation file not found: {path.name}")
    return [rec for _, rec in iter_jsonl(path)]


def split_file(name: str, split: str, part: Optional[str] = None) -> Path:
    """Path of the JSONL file of one split (and part, for sets that have parts)."""
    for piece in (split, part or ""):
        if "/" in piece or "\\" in piece or piece.startswith("."):
            raise InputError(f"bad split or part name {piece!r}")
    base = dataset_dir(name)
    return (base / part / f"{split}.jsonl") if part else (base / f"{split}.jsonl")


def build_command(name: str) -> str:
    """The command that builds one set (named in the error for a set that is not built)."""
    return f"python -m engine.data.builders build --only {name}"


def load_manifest(name: str) -> dict:
    """The set's manifest (sources, licences, versions, seed, counts). Never builds: building is the
    explicit step :func:`engine.data.builders.build` (``python -m engine.data.builders build``)."""
    path = dataset_dir(name) / MANIFEST
    if not path.is_file():
        raise InputError(f"data set {name!r} is not built; build it with: {build_command(name)}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path.name} of data set {name!r} is damaged ({exc.msg}); rebuild it with: "
                         f"{build_command(name)} --force") from None


def available_splits(name: str, part: Optional[str] = None) -> list[str]:
    """Split names present on disk for a built set (and part)."""
    base = dataset_dir(name) / part if part else dataset_dir(name)
    return sorted(p.stem for p in base.glob("*.jsonl"))


def load_split(name: str, split: str, part: Optional[str] = None) -> list[dict]:
    """Records of one split of a built offline set (never builds; the error names the build command).

    See ``docs/data.md`` for the record fields of each set. Image fields hold paths relative to
    :func:`image_root` ``(name)``.
    """
    load_manifest(name)  # refuses a set that is not built, naming the command that builds it
    path = split_file(name, split, part)
    if not path.is_file():
        where = f"{name}/{part}" if part else name
        have = ", ".join(available_splits(name, part)) or "none"
        raise InputError(f"data set {where!r} has no split {split!r} (available: {have})")
    return read_jsonl(path)
