"""Assemble the offline training / evaluation sets from packages that install offline.

``python -m engine.data.builders build [--only NAME] [--force] [--seed N]`` builds (once, cached under
``cache_dir()/datasets/<name>/``):

* ``cir``        composed-retrieval queries with known answers (Twemoji attribute variants, recoloured
                 object photos, category-change queries over real photos) + per-split galleries;
* ``captions``   image / caption pairs (Tux Paint, Twemoji, GCompris, Saleor, scikit samples);
* ``labelled``   single-label retrieval sets (Fashion-MNIST full and small, emoji, photos);
* ``multilabel`` multi-label set for hashing (Twemoji + Tux Paint category paths);
* ``open_vocab`` operations over open vocabularies (XKCD colours, light / tone edits, category changes,
                 compositional and undo triplets; words and templates split by word / template).

Everything is deterministic for a given seed: splits come from a hash of (seed, group key), so one
emoji family or one original photo (with its recoloured copies and near-duplicates) always lands in
one split, in every set. See ``docs/data.md`` for the record fields and counts.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional, Sequence

from ...config import Settings
from ...errors import EngineError, InputError
from ...process import configure_process
from ..formats import (
    DATASET_NAMES,
    FORMAT_VERSION,
    MANIFEST,
    build_command,
    dataset_dir,
    load_manifest,
    write_json,
)
from ..locations import DataSources, configured
from .captions import build_captions
from .cir import build_cir
from .common import (
    DEFAULT_SEED,
    SPLIT_FRACTIONS,
    SPLITS,
    Inputs,
    gather_inputs,
    recipe_hash,
)
from .labelled import build_labelled
from .multilabel import build_multilabel
from .open_vocab import build_open_vocab, open_vocab_recipe

BUILDERS: dict[str, Callable[[Path, Inputs, int], dict]] = {
    "cir": build_cir,
    "captions": build_captions,
    "labelled": build_labelled,
    "multilabel": build_multilabel,
    "open_vocab": build_open_vocab,
}
# sets with a recipe of their own beside the shared one (recipe_hash): a change rebuilds only that set
OWN_RECIPES: dict[str, Callable[[], str]] = {"open_vocab": open_vocab_recipe}


def build_into(name: str, final_dir: Path, inp: Inputs, seed: int = DEFAULT_SEED) -> dict:
    """Build one set into a temporary folder next to ``final_dir`` and swap it in atomically."""
    if name not in BUILDERS:
        raise InputError(f"unknown data set {name!r}; choose one of {', '.join(BUILDERS)}")
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final_dir.parent, prefix=f".tmp-{name}-"))
    os.chmod(tmp, 0o755)
    try:
        started = time.time()
        info = BUILDERS[name](tmp, inp, seed)
        manifest = {
            "name": name, "format_version": FORMAT_VERSION, "recipe": recipe_hash(), "seed": seed,
            "split_fractions": dict(zip(SPLITS, SPLIT_FRACTIONS)),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": round(time.time() - started, 1),
            **({"own_recipe": OWN_RECIPES[name]()} if name in OWN_RECIPES else {}),
            **info,
        }
        write_json(tmp / MANIFEST, manifest)
        old = None
        if final_dir.exists():
            old = final_dir.with_name(f".old-{name}-{os.getpid()}")
            os.replace(final_dir, old)
        os.replace(tmp, final_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return manifest
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def is_built(name: str) -> bool:
    """True when the set's manifest exists with the current format version and assembly recipe."""
    path = dataset_dir(name) / MANIFEST
    if not path.is_file():
        return False
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    own = OWN_RECIPES[name]() if name in OWN_RECIPES else None
    return (manifest.get("format_version") == FORMAT_VERSION and manifest.get("recipe") == recipe_hash()
            and manifest.get("own_recipe") == own)


def ensure_built(*names: str, seed: int = DEFAULT_SEED, sources: Optional[DataSources] = None) -> None:
    """The explicit build step of the CLIs that read offline sets: builds (with progress bars) the sets
    that are missing or were built with another recipe; quick when all are current. ``sources``: where the
    inputs are (default: what the entry point configured, :mod:`engine.data.locations`)."""
    todo = [n for n in names if not is_built(n)]
    if todo:
        sources = replace(sources or configured(), progress=True)
        for n in todo:
            print(f"building offline data set {n!r} (once; {build_command(n)})", file=sys.stderr)
            build(n, seed=seed, sources=sources)


def build(name: Optional[str] = None, force: bool = False, seed: int = DEFAULT_SEED,
          sources: Optional[DataSources] = None) -> dict[str, dict]:
    """Build one set (or all); already built sets are kept unless ``force``. Returns manifests. ``sources``:
    where the inputs are (default: what the entry point configured, :mod:`engine.data.locations`)."""
    names = [name] if name else list(DATASET_NAMES)
    for n in names:
        if n not in BUILDERS:
            raise InputError(f"unknown data set {n!r}; choose one of {', '.join(BUILDERS)}")
    todo = [n for n in names if force or not is_built(n)]
    out = {n: load_manifest(n) for n in names if n not in todo}
    if todo:
        inp = gather_inputs(todo, seed, sources)
        for n in todo:
            out[n] = build_into(n, dataset_dir(n), inp, seed)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.data.builders", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="assemble the sets (cached; --force rebuilds)")
    b.add_argument("--only", choices=DATASET_NAMES, help="build just this set")
    b.add_argument("--force", action="store_true", help="rebuild even if built")
    b.add_argument("--seed", type=int, default=DEFAULT_SEED)
    i = sub.add_parser("info", help="print the counts of the built sets")
    i.add_argument("--only", choices=DATASET_NAMES)
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build":
            settings = Settings()  # this command is an entry point: the sources' folders, the decode budget
            sources = replace(configure_process(settings), progress=True)
            manifests = build(args.only, force=args.force, seed=args.seed, sources=sources)
        else:
            names = [args.only] if args.only else list(DATASET_NAMES)
            manifests = {n: load_manifest(n) for n in names}
    except EngineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for n, m in manifests.items():
        print(f"{n}: {dataset_dir(n)}  (seed {m.get('seed')}, built {m.get('built_at')}, {m.get('build_seconds')} s)")
        print(json.dumps(m.get("counts", {}), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
