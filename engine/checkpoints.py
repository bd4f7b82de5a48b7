"""Checks shared by every learned part's checkpoint loader."""
from __future__ import annotations

import math
from dataclasses import asdict, is_dataclass

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

from .config import ASSETS, Settings, cache_dir
from .errors import CheckpointError
from .fileio import atomic_path, atomic_write_text


def require_backbone(path: os.PathLike, stored: Optional[str], live: Optional[str], how_to_retrain: str = "") -> None:
    """Refuse a checkpoint trained for another backbone, naming the file (no check when ``live`` is None)."""
    if live is not None and stored != live:
        hint = f"; retrain it with `{how_to_retrain}`" if how_to_retrain else ""
        raise CheckpointError(f"{Path(path).name} was trained for backbone {stored!r}, "
                              f"not for the live backbone {live!r}{hint}")


# -- weights that can be used: whole and finite ------------------------------------------------------------
_VERIFIED: dict = {}  # (path, size, mtime_ns) -> None or why the file is refused
_REFUSALS = threading.local()
log = logging.getLogger(__name__)


def weights_problem(path: os.PathLike) -> Optional[str]:
    """None when the safetensors file reads whole and every floating-point tensor in it is finite, else why
    not, as the end of a sentence naming the file. Checked once per file version (size and mtime); a refused
    file is logged once, in one line."""
    path = Path(path)
    try:
        st = path.stat()
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc.__class__.__name__})"
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key in _VERIFIED:
        problem = _VERIFIED[key]
    else:
        problem = None
        try:
            problem = _nonfinite(path)
        except Exception as exc:  # truncated, not safetensors, unreadable
            problem = f"is damaged or truncated ({exc.__class__.__name__}); restore or retrain it"
        _VERIFIED[key] = problem
        if problem:
            log.warning("checkpoint %s %s; refused (the next one on the search path is used)", path.name, problem)
    if problem and getattr(_REFUSALS, "found", None) is not None:
        _REFUSALS.found.append(f"{path.name} {problem}")
    return problem


def _nonfinite(path: Path) -> Optional[str]:
    """Reads every tensor (numpy, fast; torch for dtypes numpy lacks, e.g. bfloat16); why the file is refused
    when a floating-point tensor holds NaN or infinity."""
    import numpy as np
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        names = list(f.keys())
    bad = None
    try:
        with safe_open(str(path), framework="np") as f:
            for name in names:
                a = f.get_tensor(name)
                if a.dtype.kind == "f" and not np.isfinite(a).all():
                    bad = name
                    break
    except TypeError:  # a dtype numpy cannot hold
        import torch

        with safe_open(str(path), framework="pt") as f:
            for name in names:
                t = f.get_tensor(name)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    bad = name
                    break
    return None if bad is None else f"holds NaN or infinite weights (tensor {bad!r}); retrain it or restore the file"


def _log_unreadable(path: Path, exc: Exception) -> None:
    try:
        st = path.stat()
        key = ("record", str(path), st.st_size, st.st_mtime_ns)
    except OSError:
        key = ("record", str(path))
    if key not in _VERIFIED:
        _VERIFIED[key] = str(exc)
        log.warning("checkpoint %s passed over: %s", path.name, exc)


@contextlib.contextmanager
def refusals():
    """Collects, in this thread, the sentences of the checkpoints :func:`resolve` refused inside the block
    (so a part left unavailable can say why, instead of only "no checkpoint")."""
    previous = getattr(_REFUSALS, "found", None)
    _REFUSALS.found = found = []
    try:
        yield found
    finally:
        _REFUSALS.found = previous


# -- a trainer's resume state (state.pt: weights, optimiser, schedule, history) ------------------------------


def save_training_state(path: os.PathLike, state: dict) -> None:
    """Writes a trainer's resume state atomically (``torch.save`` of tensors and plain values only)."""
    import torch

    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_training_state(path: os.PathLike, map_location="cpu") -> dict:
    """A resume state written by :func:`save_training_state`, read with ``weights_only=True``; CheckpointError
    naming the file when it cannot be read."""
    import torch

    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{Path(path).name}: cannot resume ({exc.__class__.__name__})") from None


# -- the one checkpoint layer: naming and discovery ---------------------------------------------------------
#
# Every learned part (Context-I2W, RTIC, RTIC+GCN, LAttQE, ICS heads) is stored as
# ``<part>-<backbone slug>[-<variant>].safetensors`` with a ``.json`` sidecar holding the same record, and is
# found by :func:`resolve`: the folders of the search path (:func:`search_dirs`) are read in order, each file
# matching the part's name pattern is kept when its record says it was trained for the live backbone's
# fingerprint, and several fitting files are ordered by the tie rule
#     1. search-path position (CIS_CHECKPOINTS entries in the order given, then the cache of prepared
#        checkpoints, then the bundled assets/checkpoints),
#     2. the part's variant priority (e.g. plain RTIC before RTIC+GCN),
#     3. the file name.
# File modification times and stored held-out (test-split) figures never take part in the choice.

def bundled_dir() -> Path:
    """The checkpoints shipped with the repository."""
    return ASSETS / "checkpoints"


def prepared_dir(create: bool = False, settings: Optional[Settings] = None) -> Path:
    """Where ``python -m engine prepare`` and the Space's background prepare put checkpoints by default
    (inside the cache dir, so a mounted persistent volume keeps them between starts; ``CIS_PREPARED_DIR``
    overrides it). ``settings``: the entry point's; without them, the default ``<cache>/checkpoints``."""
    given = settings.prepared_dir if settings is not None else ""
    path = Path(given) if given else cache_dir() / "checkpoints"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def slug(name: str) -> str:
    """File-name form of a backbone name or fingerprint (the ``@hash`` part of a fingerprint is dropped)."""
    base = str(name).split("@", 1)[0]
    return re.sub(r"[^A-Za-z0-9]+", "-", base).strip("-").lower() or "backbone"


def file_name(part: str, backbone: str, variant: Optional[str] = None) -> str:
    """``<part>-<backbone slug>[-<variant>].safetensors``; ``backbone`` is a backbone name or fingerprint."""
    tail = f"-{slug(variant)}" if variant else ""
    return f"{part}-{slug(backbone)}{tail}.safetensors"


def search_dirs(checkpoint_dir=None, settings: Optional[Settings] = None) -> list:
    """The folders searched, in order: ``checkpoint_dir`` (default: ``CIS_CHECKPOINTS`` of ``settings``; several
    folders may be given separated by ``os.pathsep``), then :func:`prepared_dir`, then :func:`bundled_dir`;
    duplicates are dropped, keeping their first position. ``settings``: the entry point's (nothing is read from
    the environment here); without them, only ``checkpoint_dir``, the default prepared folder and the bundled
    one. A loader that takes only a folder is handed :func:`search_path` by its caller."""
    if checkpoint_dir in (None, ""):
        checkpoint_dir = settings.checkpoints_given if settings is not None else ""
    raw = checkpoint_dir
    entries = [str(p) for p in raw] if isinstance(raw, (list, tuple)) else str(raw).split(os.pathsep)
    dirs = [Path(e) for e in entries if e.strip()]
    dirs += [prepared_dir(settings=settings), bundled_dir()]
    out, seen = [], set()
    for d in dirs:
        key = os.path.normcase(os.path.abspath(d))
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def search_path(settings: Settings) -> str:
    """The whole search path of an entry point's ``settings`` (``CIS_CHECKPOINTS``, else the bundled folder;
    the prepared folder, ``CIS_PREPARED_DIR``; the bundled folder) as one ``os.pathsep``-separated string: the
    ``checkpoint_dir`` the engine hands the composer, expander and index factories."""
    return os.pathsep.join(str(d) for d in search_dirs(settings.checkpoints, settings))


def resolve(patterns, read_record, fingerprint: Optional[str], checkpoint_dir=None,
            fingerprint_key: str = "backbone_fingerprint", variant_rank=None, accept=None,
            settings: Optional[Settings] = None) -> list:
    """[(path, record)] of the checkpoints fitting ``fingerprint`` (all readable ones when None), best first.

    ``patterns``: glob(s) of the part's ``.safetensors`` files; ``read_record(path)`` returns its record or
    raises CheckpointError (such files are passed over, as are files whose weights are damaged or not finite:
    :func:`weights_problem`); ``variant_rank(record)`` gives the variant priority
    (lower first); ``accept(record)`` may drop further misfits (e.g. another embedding size); ``settings``: the
    caller's, for the search path (:func:`search_dirs`)."""
    if isinstance(patterns, str):
        patterns = [patterns]
    found = []
    for position, directory in enumerate(search_dirs(checkpoint_dir, settings)):
        if not Path(directory).is_dir():
            continue
        names = sorted({p for pat in patterns for p in Path(directory).glob(pat) if p.is_file()})
        for path in names:
            try:
                record = read_record(path)
            except CheckpointError as exc:  # damaged record: passed over, in one log line per file version
                _log_unreadable(path, exc)
                continue
            if fingerprint is not None and record.get(fingerprint_key) != fingerprint:
                continue
            if accept is not None and not accept(record):
                continue
            if weights_problem(path):  # damaged or non-finite: passed over, so the next valid one is used
                continue
            rank = variant_rank(record) if variant_rank else 0
            found.append(((position, rank, path.name), path, record))
    found.sort(key=lambda t: t[0])
    return [(path, record) for _, path, record in found]


def describe_search_path(checkpoint_dir=None, settings: Optional[Settings] = None) -> str:
    """The searched folders for messages (names relative to nothing; just as configured)."""
    return os.pathsep.join(str(d) for d in search_dirs(checkpoint_dir, settings))


# -- the table of learned parts and the one record format ---------------------------------------------------
#
# Every learned part is one ``.safetensors`` file: its tensors, and in its metadata under ``RECORD_KEY`` one
# JSON record of the schema below (the same record is written beside it as ``.json`` for people and diffs):
#
#     format                 RECORD_FORMAT
#     part                   a name of PARTS ("rtic", "rtic+gcn", "context-i2w", "lattqe", "ics")
#     backbone_fingerprint   the backbone it was trained on (a checkpoint never loads for another one)
#     backbone_name          that backbone's name, for people
#     config                 what rebuilds the module (the part's config dataclass as a dict)
#     recipe                 how it was trained (training config, data), or {}
#     validation             figures on the validation split it was chosen on ({"split", "metric", "scores"}), or {}
#     ...                    any further trainer figures (history, held-out tables) as more keys
#
# Files of the retired format 1 (RTIC / Context-I2W records under their own metadata key, LAttQE's record in the
# JSON sidecar, ICS's kind/config metadata) are refused with one sentence naming the command that retrains them;
# every shipped file is of the record format.

RECORD_KEY = "cis_checkpoint"
RECORD_FORMAT = 2
RECORD_FIELDS = ("format", "part", "backbone_fingerprint", "backbone_name", "config", "recipe", "validation")
# what a loaded record holds besides a trainer's figures: the schema's fields, the file name (read_record) and
# the retired format 1's own keys (dropped should a caller's figures still carry them)
RECORD_KEYS = RECORD_FIELDS + ("file", "kind", "format_version", "variant")


def figures_of(record: dict, *also: str) -> dict:
    """A loaded record's trainer figures: every key but :data:`RECORD_KEYS` and ``also`` (the keys a part's
    saver makes itself). What a saver keeps when a loaded record is saved again."""
    return {k: v for k, v in record.items() if k not in RECORD_KEYS and k not in also}


@dataclass(frozen=True)
class Prepare:
    """How ``python -m engine prepare`` trains a part within a time budget (``engine.prepare``): its ``share``
    of the budget, the ``probe`` run's units (measured, then scaled to the share), the names of those units,
    the offline data sets it reads, and the trainer options that pick the checkpoint prepare makes (``config``).
    A part whose trainer takes ``--backbone --device --out --epochs --quiet`` needs nothing more; the shipped
    parts' own arguments and plans are in ``engine.prepare``."""
    share: float = 0.15
    probe: tuple = (1,)
    units: tuple = ("epochs",)
    data: tuple = ()
    config: tuple = ()  # (key, value) pairs, e.g. (("bits", 64),)


@dataclass(frozen=True)
class Part:
    """One learned part, its one spec: label, files, trainer, training command, how ``prepare`` trains it, and
    the module that registers its runtime factory (a composer, expander or vector index).

    Adding a learned part: its runtime module (``@COMPOSERS.register``, ``@EXPANDERS.register``, ...), its
    trainer module (``main(argv)``) and one entry here (docs/architecture.md, "Adding a learned part")."""
    name: str
    label: str
    stem: str  # file name prefix (file_name(stem, backbone)); ICS adds its code length: ics-64
    glob: str  # files searched for it on the search path
    train: str  # the command that makes one
    family: str  # what ``prepare`` calls it (rtic+gcn is prepared with rtic)
    trainer: str = ""  # module whose main(argv) trains it: `python -m engine train <family>` runs it
    runtime: str = ""  # module that registers its runtime factory (imported by its registry's package)
    prepare: Optional[Prepare] = None  # None: prepared with its family (rtic+gcn) or not by prepare
    rank: int = 0  # tie rule between parts sharing a glob (plain RTIC before RTIC+GCN)
    sized: bool = False  # its record says the embedding size it takes (find/load with ``dim`` check it)
    text_alone: bool = False  # a composer that answers a text without an image (falls back to its prior)
    what: str = ""  # one line for `python -m engine train`'s usage

    def command(self, **config) -> str:
        """The training command, filled from a config (``{bits}`` of ICS; its prepare config when not given)."""
        try:
            return self.train.format(**{**dict(self.prepare.config if self.prepare else ()), **config})
        except (KeyError, IndexError):
            return self.train

    def train_hint(self, **config) -> str:
        """The sentence a loader ends with when no checkpoint fits: how to make one."""
        return f"train one with `{self.command(**config)}` or let `python -m engine prepare --parts {self.family}` do it"


PARTS: Dict[str, Part] = {p.name: p for p in (
    Part("context-i2w", "Context-I2W", "context_i2w", "context_i2w*.safetensors",
         "python -m engine train context-i2w --data captions", "context-i2w", trainer="engine.train.context_i2w.cli",
         runtime="engine.compose.context_i2w", text_alone=True, what="Context-I2W pseudo-word mapper",
         prepare=Prepare(share=0.45, probe=(128, 1), units=("pairs", "epochs"), data=("captions", "cir"))),
    Part("rtic", "RTIC", "rtic", "rtic*.safetensors", "python -m engine train rtic --data cir", "rtic",
         trainer="engine.train.rtic", runtime="engine.compose.rtic", text_alone=True,
         what="RTIC composer (add --gcn for the GCN stream)",
         prepare=Prepare(share=0.20, probe=(1,), units=("epochs",), data=("cir", "captions", "open_vocab"))),
    Part("rtic+gcn", "RTIC+GCN", "rtic-gcn", "rtic*.safetensors", "python -m engine train rtic --data cir --gcn",
         "rtic", trainer="engine.train.rtic", runtime="engine.compose.rtic", rank=1, text_alone=True),
    Part("lattqe", "LAttQE", "lattqe", "lattqe*.safetensors", "python -m engine train lattqe", "lattqe",
         trainer="engine.train.lattqe", runtime="engine.expand.lattqe", sized=True, what="LAttQE query expansion",
         prepare=Prepare(share=0.20, probe=(1, 128), units=("epochs", "queries_per_epoch"), data=("labelled",))),
    Part("ics", "ICS", "ics", "ics-*.safetensors", "python -m engine train ics --bits {bits}", "ics",
         trainer="engine.train.ics", runtime="engine.index.ics_index", sized=True, what="ICS hashing head",
         prepare=Prepare(share=0.15, probe=(5,), units=("epochs",), data=("multilabel",), config=(("bits", 64),))),
)}


def runtime_modules(package: str) -> list:
    """The modules of ``package`` that register a learned part's runtime factory (its spec's ``runtime``), in
    table order, each once: what the registry's package imports so that every part is registered."""
    return list(dict.fromkeys(p.runtime for p in PARTS.values() if p.runtime.startswith(package + ".")))


def prepared_parts() -> list:
    """The parts ``prepare`` trains, in its order (one per family)."""
    return [p.name for p in PARTS.values() if p.prepare is not None]


def part(name: str) -> Part:
    try:
        return PARTS[name]
    except KeyError:
        raise CheckpointError(f"unknown learned part {name!r}; known: {', '.join(PARTS)}") from None


def make_record(part_name: str, fingerprint: str, config: dict, recipe: Optional[dict] = None,
                validation: Optional[dict] = None, backbone_name: str = "", **figures) -> dict:
    """A record of the one schema (see above); ``figures``: further trainer figures kept as more keys."""
    part(part_name)
    clash = sorted(set(RECORD_FIELDS) & set(figures))
    if clash:
        raise ValueError(f"{clash} are fields of the record itself")
    return {"format": RECORD_FORMAT, "part": part_name, "backbone_fingerprint": fingerprint,
            "backbone_name": backbone_name, "config": dict(config), "recipe": dict(recipe or {}),
            "validation": dict(validation or {}), **figures}


def write(path: os.PathLike, tensors: Dict[str, Any], record: dict) -> Path:
    """Writes ``tensors`` + ``record`` as ``path`` (.safetensors) and the record as its ``.json`` sidecar, each
    atomically (temporary file, then rename)."""
    from safetensors.torch import save_file

    part(record.get("part", ""))
    if record.get("format") != RECORD_FORMAT or not record.get("backbone_fingerprint"):
        raise ValueError("write() takes a record made by make_record()")
    path = Path(path).with_suffix(".safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, default=str)
    meta = {RECORD_KEY: text}
    state = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
    with atomic_path(path, mode=0o644) as tmp:
        save_file(state, str(tmp), metadata=meta)
    atomic_write_text(path.with_suffix(".json"), json.dumps(record, indent=1, default=str) + "\n")
    return path


# the metadata of the retired format 1: RTIC / Context-I2W records under their own key, LAttQE / ICS by "kind"
_FORMAT_1 = {"rtic": "rtic", "context_i2w": "context-i2w"}


def _older_format(meta: dict) -> Optional[str]:
    """The command that retrains an older-format file (format 1), or None when its metadata is not one."""
    name, config = None, {}
    for key, part_name in _FORMAT_1.items():
        if key in meta:
            name = part_name
            with contextlib.suppress(ValueError, AttributeError, TypeError):
                old = json.loads(meta[key])
                name = old["variant"] if old.get("variant") in PARTS else name
                config = dict(old.get("config") or {})
            break
    else:
        if meta.get("kind") in ("lattqe", "ics"):
            name = meta["kind"]
            with contextlib.suppress(ValueError, TypeError):
                config = dict(json.loads(meta.get("config") or "{}"))
    return PARTS[name].command(**config) if name else None


def read_record(path: os.PathLike) -> dict:
    """The record of a checkpoint file without loading its tensors; ``record["file"]`` is the file name.
    CheckpointError names the file when it has none, and says to retrain a file of the older format 1."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path.name}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        if RECORD_KEY not in meta:
            retrain = _older_format(meta)
            if retrain:
                raise CheckpointError(f"{path.name} is an older checkpoint format; retrain it with `{retrain}`")
            raise ValueError("no checkpoint record in its metadata")
        record = json.loads(meta[RECORD_KEY])
        if not isinstance(record, dict) or record.get("part") not in PARTS or not isinstance(record.get("config"), dict):
            raise ValueError("its record has no known part or no config")
        bad = _nonfinite_value(record.get("config")) or _nonfinite_value(record.get("anchor"))
        if bad:
            raise ValueError(f"its record holds a value that is not a finite number ({bad})")
    except CheckpointError:
        raise
    except Exception as exc:  # damaged, truncated, not safetensors, foreign metadata
        raise CheckpointError(f"{path.name} is not a readable checkpoint ({exc.__class__.__name__}: {exc})") from None
    record["file"] = path.name
    return record


def _nonfinite_value(value, name: str = "") -> Optional[str]:
    """The name of the first NaN or infinite number in a record's value (walked through dicts and lists)."""

    if isinstance(value, float) and not math.isfinite(value):
        return name or "value"
    if isinstance(value, dict):
        for k, v in value.items():
            found = _nonfinite_value(v, f"{name}.{k}" if name else str(k))
            if found:
                return found
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value[:1000]):
            found = _nonfinite_value(v, f"{name}[{i}]")
            if found:
                return found
    return None


def load_first(found: list, load_one, label: str):
    """The first of ``found`` ([(path, record)], best first) that ``load_one(path)`` loads: a file whose weights
    do not fit its config (wrong tensor shapes), whose config holds a bad value, or whose prior anchor has a
    weight that is not a finite number is passed over in one log line, and the next one (in the end the
    bundled file) is used. CheckpointError with the last reason when none loads."""

    last = None
    for path, _ in found:
        try:
            out = load_one(path)
            anchor = getattr(out, "anchor", None)
            config = getattr(anchor, "config", None)
            if is_dataclass(config) and not all(math.isfinite(float(v)) for v in asdict(config).values()):
                raise CheckpointError(f"{Path(path).name}: its prior anchor holds a weight that is not a finite "
                                      "number")
            return out
        except (CheckpointError, TypeError, ValueError, KeyError, AttributeError, RuntimeError) as exc:
            last = exc if isinstance(exc, CheckpointError) else CheckpointError(
                f"{Path(path).name}: its record cannot build the {label} ({exc.__class__.__name__}: {exc})")
            key = ("load", str(path))
            if key not in _VERIFIED:
                _VERIFIED[key] = str(last)
                log.warning("checkpoint %s refused (%s); the next one on the search path is used", Path(path).name,
                            last)
            if getattr(_REFUSALS, "found", None) is not None:
                _REFUSALS.found.append(str(last))
    raise last if last is not None else CheckpointError(f"no {label} checkpoint")


def _dim(record: dict) -> Optional[int]:
    """The embedding size a sized part's checkpoint takes (None for the others)."""
    if not PARTS[record["part"]].sized:
        return None
    value = record.get("embed_dim") or record["config"].get("dim") or record["config"].get("embed_dim")
    return int(value) if value else None


def find(part_name: str, fingerprint: Optional[str], checkpoint_dir=None, dim: Optional[int] = None,
         settings: Optional[Settings] = None, **config) -> list:
    """[(path, record)] of ``part_name``'s checkpoints on the search path made for ``fingerprint`` (every
    readable one when None), best first by the tie rule; ``dim``: only those for that embedding size;
    ``config``: only those whose config has these values (e.g. ``bits=64``). A family name (``prepare``'s
    names) finds all its parts: "rtic" finds RTIC and RTIC+GCN, plain first; "rtic+gcn" only RTIC+GCN."""
    names = {p.name for p in PARTS.values() if p.family == part_name} or {part(part_name).name}
    globs = sorted({PARTS[n].glob for n in names})

    def accept(record: dict) -> bool:
        return (record["part"] in names and (dim is None or _dim(record) in (None, int(dim)))
                and all(record["config"].get(k) == v for k, v in config.items()))

    return resolve(globs, read_record, fingerprint, checkpoint_dir, variant_rank=lambda r: PARTS[r["part"]].rank,
                   accept=accept, settings=settings)


@dataclass
class Checkpoint:
    path: Path
    record: dict
    tensors: Dict[str, Any]


def load(part_name: str, path: Optional[os.PathLike] = None, fingerprint: Optional[str] = None,
         checkpoint_dir=None, dim: Optional[int] = None, settings: Optional[Settings] = None, **config) -> Checkpoint:
    """The tensors and record of ``path``, or of the best checkpoint :func:`find` names; refuses (with
    CheckpointError naming the file and the command that makes a fitting one) another part's file, one
    trained for another backbone or embedding size, and an unreadable one."""
    from safetensors.torch import load_file

    info = part(part_name) if part_name in PARTS else None
    if path is None:
        hits = find(part_name, fingerprint, checkpoint_dir, dim, settings, **config)
        if not hits:
            label = info.label if info else part_name
            train = info.command(**config) if info else f"python -m engine prepare --parts {part_name}"
            raise CheckpointError(f"no {label} checkpoint for backbone {fingerprint or '?'} in "
                                  f"{describe_search_path(checkpoint_dir, settings)}; make one with `{train}`")
        path = hits[0][0]
    path = Path(path)
    record = read_record(path)
    if info is not None and record["part"] != part_name and PARTS[record["part"]].family != part_name:
        raise CheckpointError(f"{path.name} holds a {record['part']} checkpoint, not {part_name}")
    info = PARTS[record["part"]]
    train = info.command(**record["config"])
    require_backbone(path, record.get("backbone_fingerprint"), fingerprint, train)
    if dim is not None and _dim(record) not in (None, int(dim)):
        raise CheckpointError(f"{path.name} expects {_dim(record)}-d embeddings, not {dim}-d; "
                              f"make a fitting one with `{train}`")
    try:
        tensors = load_file(str(path))
    except Exception as exc:
        raise CheckpointError(f"{path.name}: cannot read its tensors ({exc.__class__.__name__})") from None
    return Checkpoint(path, record, tensors)


def inventory(checkpoint_dir=None, settings: Optional[Settings] = None) -> Dict[str, list]:
    """{part: [file name, ...]} of every readable checkpoint on the search path, any backbone (``info``)."""
    out: Dict[str, list] = {name: [] for name in PARTS}
    for name in PARTS:
        out[name] = [f"{p.parent.name}/{p.name} ({r.get('backbone_name') or r.get('backbone_fingerprint')})"
                     for p, r in find(name, None, checkpoint_dir, settings=settings) if r["part"] == name]  # a family finds its kin
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.checkpoints",
                                 description="Inspect learned-part checkpoints.")
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("show", help="print a checkpoint's record")
    s.add_argument("file")
    args = ap.parse_args(argv)

    try:
        print(json.dumps(read_record(args.file), indent=1, default=str))
    except CheckpointError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
