"""Checks shared by every learned part's checkpoint loader."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from .errors import CheckpointError


def require_backbone(path: os.PathLike, stored: Optional[str], live: Optional[str], how_to_retrain: str = "") -> None:
    """Refuse a checkpoint trained for another backbone, naming the file (no check when ``live`` is None)."""
    if live is not None and stored != live:
        hint = f"; retrain it with `{how_to_retrain}`" if how_to_retrain else ""
        raise CheckpointError(f"{Path(path).name} was trained for backbone {stored!r}, "
                              f"not for the live backbone {live!r}{hint}")


def read_safetensors_record(path: os.PathLike, key: str, label: str) -> dict:
    """The JSON record stored under ``key`` in a safetensors file's metadata, without loading tensors.

    The record must say ``"kind": key`` and hold a ``config``; anything else raises CheckpointError
    naming the file (``label`` is the part's name for messages, e.g. "RTIC")."""
    import json

    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{label} checkpoint not found: {path.name}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        record = json.loads(meta[key])
    except Exception as exc:  # damaged file, not safetensors, no metadata
        raise CheckpointError(f"{path.name} is not a valid {label} checkpoint ({exc.__class__.__name__})") from None
    if not isinstance(record, dict) or record.get("kind") != key or "config" not in record:
        raise CheckpointError(f"{path.name} is not a {label} checkpoint")
    return record


def find_checkpoints(checkpoint_dir: os.PathLike, pattern: str, read_record, fingerprint: str):
    """[(path, record)] for the readable checkpoints matching ``pattern`` on the search path (see
    :func:`resolve`) whose record says they were trained for backbone ``fingerprint``, best first."""
    return resolve(pattern, read_record, fingerprint, checkpoint_dir)


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

ENV_VAR = "CIS_CHECKPOINTS"  # read by engine.config.Settings (checkpoints_given)


def bundled_dir() -> Path:
    """The checkpoints shipped with the repository."""
    from .config import ASSETS

    return ASSETS / "checkpoints"


def prepared_dir(create: bool = False) -> Path:
    """Where ``python -m engine prepare`` and the Space's background prepare put checkpoints by default
    (inside the cache dir, so a mounted persistent volume keeps them between starts; ``CIS_PREPARED_DIR``
    overrides it)."""
    from .config import Settings, cache_dir

    given = Settings().prepared_dir
    path = Path(given) if given else cache_dir() / "checkpoints"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def slug(name: str) -> str:
    """File-name form of a backbone name or fingerprint (the ``@hash`` part of a fingerprint is dropped)."""
    import re

    base = str(name).split("@", 1)[0]
    return re.sub(r"[^A-Za-z0-9]+", "-", base).strip("-").lower() or "backbone"


def file_name(part: str, backbone: str, variant: Optional[str] = None) -> str:
    """``<part>-<backbone slug>[-<variant>].safetensors``; ``backbone`` is a backbone name or fingerprint."""
    tail = f"-{slug(variant)}" if variant else ""
    return f"{part}-{slug(backbone)}{tail}.safetensors"


def search_dirs(checkpoint_dir=None) -> list:
    """The folders searched, in order: ``checkpoint_dir`` (default: ``CIS_CHECKPOINTS``; several folders may
    be given separated by ``os.pathsep``), then :func:`prepared_dir`, then :func:`bundled_dir`; duplicates
    are dropped, keeping their first position."""
    if checkpoint_dir in (None, ""):
        from .config import Settings

        checkpoint_dir = Settings().checkpoints_given
    raw = checkpoint_dir
    entries = [str(p) for p in raw] if isinstance(raw, (list, tuple)) else str(raw).split(os.pathsep)
    dirs = [Path(e) for e in entries if e.strip()]
    dirs += [prepared_dir(), bundled_dir()]
    out, seen = [], set()
    for d in dirs:
        key = os.path.normcase(os.path.abspath(d))
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def resolve(patterns, read_record, fingerprint: Optional[str], checkpoint_dir=None,
            fingerprint_key: str = "backbone_fingerprint", variant_rank=None, accept=None) -> list:
    """[(path, record)] of the checkpoints fitting ``fingerprint`` (all readable ones when None), best first.

    ``patterns``: glob(s) of the part's ``.safetensors`` files; ``read_record(path)`` returns its record or
    raises CheckpointError (such files are passed over); ``variant_rank(record)`` gives the variant priority
    (lower first); ``accept(record)`` may drop further misfits (e.g. another embedding size)."""
    if isinstance(patterns, str):
        patterns = [patterns]
    found = []
    for position, directory in enumerate(search_dirs(checkpoint_dir)):
        if not Path(directory).is_dir():
            continue
        names = sorted({p for pat in patterns for p in Path(directory).glob(pat) if p.is_file()})
        for path in names:
            try:
                record = read_record(path)
            except CheckpointError:
                continue
            if fingerprint is not None and record.get(fingerprint_key) != fingerprint:
                continue
            if accept is not None and not accept(record):
                continue
            rank = variant_rank(record) if variant_rank else 0
            found.append(((position, rank, path.name), path, record))
    found.sort(key=lambda t: t[0])
    return [(path, record) for _, path, record in found]


def describe_search_path(checkpoint_dir=None) -> str:
    """The searched folders for messages (names relative to nothing; just as configured)."""
    return os.pathsep.join(str(d) for d in search_dirs(checkpoint_dir))


# -- which method to offer first: validation figures recorded with the checkpoints --------------------------
#
# A trainer may record, next to its checkpoint, how the methods compared on a *validation* split (the split
# it chose epochs or settings on, never the held-out test split). Three record shapes are read:
#   * ``"validation": {"split", "metric", "scores": {method: value}}`` (the general form);
#   * Context-I2W: ``training.held_out.cir = {"split", "<subset>": {"recall": {method: {"R@10": ...}}}}``;
#   * RTIC: ``held_out_all = {method or variant: {"R@10": ...}}`` with ``eval_split``; when the record also
#     holds ``held_out_tone`` (the same split's photos' black-and-white and night edits, each ranked among
#     every version of those photos), each method's score is the mean of its CIR R@10 and its tone R@1, the
#     objective ``eval concepts`` chose the backbone's colour / light weighting with: a composer that ignores
#     "at night" cannot be the default just because the CIR set asks for no light change.
# Figures from any other split are ignored, so a test-split number can never choose the default.

VALIDATION_SPLITS = ("val", "validation", "dev")
BASELINE_METHOD = "sum"
METRIC = "R@10"
TONE_METRIC = "R@1"  # each photo has three versions: R@10 mostly says whether any version of it was found
TONE_RULE = "mean of CIR R@10 and tone R@1"


def _pick_metric(scores: dict) -> Optional[str]:
    keys = [set(v) for v in scores.values() if isinstance(v, dict)]
    common = set.intersection(*keys) if keys else set()
    return METRIC if METRIC in common else (sorted(common)[0] if common else None)


def validation_comparisons(record: dict, method: str) -> list:
    """The method comparisons measured on a validation split that one checkpoint's ``record`` carries:
    ``[{"split", "metric", "scores": {method: value}, "source"}]``. ``method`` is the engine's name for the part
    the record belongs to (e.g. ``rtic``): a variant's figures (``rtic+gcn``) are filed under it."""
    out = []
    source = str(record.get("file") or record.get("weights") or method)

    def add(split, metric, scores):
        if str(split).lower() in VALIDATION_SPLITS and metric and len(scores) >= 2:
            out.append({"split": str(split), "metric": metric, "scores": scores, "source": Path(source).name})

    val = record.get("validation")
    if isinstance(val, dict) and isinstance(val.get("scores"), dict):
        add(val.get("split", ""), val.get("metric", METRIC), {k: float(v) for k, v in val["scores"].items()})
    cir = ((record.get("training") or {}).get("held_out") or {}).get("cir")
    if isinstance(cir, dict):
        subsets = {k: v for k, v in cir.items() if isinstance(v, dict) and isinstance(v.get("recall"), dict)}
        sub = subsets.get("all") or (next(iter(subsets.values())) if len(subsets) == 1 else None)
        if sub:
            metric = _pick_metric(sub["recall"])
            add(cir.get("split", ""), metric, {m: float(r[metric]) for m, r in sub["recall"].items() if metric in r})
    table = record.get("held_out_all")
    if isinstance(table, dict):
        split = record.get("eval_split") or (record.get("prepare") or {}).get("eval_split", "")
        variant = record.get("variant", method)

        def rows_of(t):
            return {(method if name == variant else name): r for name, r in (t or {}).items()
                    if isinstance(r, dict) and (name == variant or name in ("image", "text", "sum"))}

        rows, tone = rows_of(table), rows_of(record.get("held_out_tone"))
        metric = _pick_metric(rows)
        scores = {m: float(r[metric]) for m, r in rows.items() if metric in r}
        both = [m for m in scores if TONE_METRIC in tone.get(m, {})] if metric == METRIC else []
        if len(both) >= 2:  # the tone edits weigh as much as the CIR queries (module comment above)
            add(split, TONE_RULE, {m: (scores[m] + float(tone[m][TONE_METRIC])) / 2 for m in both})
        else:
            add(split, metric, scores)
    return out


def default_method(records: dict, available, baseline: str = BASELINE_METHOD):
    """(method, evidence): the method to offer first. ``records`` maps each loaded learned method to its
    checkpoint's record, ``available`` lists the methods the engine can run. Among the validation
    comparisons that include the ``baseline`` (the weighted sum), those covering most available methods
    decide (each was measured under its own trainer's protocol, so figures are only compared within one):
    the comparison whose best method beats the baseline by the widest margin names the winner; ties and
    no margin go to the baseline. Without such a comparison the baseline is the default and the evidence is
    None; otherwise the evidence is the deciding comparison (scores of available methods)."""
    available = list(available)
    fallback = baseline if baseline in available else (available[0] if available else baseline)
    comps = []
    for method, record in records.items():
        for comp in validation_comparisons(record or {}, method):
            scores = {m: v for m, v in comp["scores"].items() if m in available}
            if baseline in scores and len(scores) >= 2:
                comps.append(dict(comp, scores=scores))
    if not comps:
        return fallback, None
    widest = max(len(c["scores"]) for c in comps)

    def margin(c):
        return max(c["scores"].values()) - c["scores"][baseline]

    best = max((c for c in comps if len(c["scores"]) == widest), key=margin)  # first of equal margins
    winner = baseline if margin(best) <= 0 else max(best["scores"], key=best["scores"].get)
    return winner, best
