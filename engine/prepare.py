"""``python -m engine prepare``: make every learned part available for one backbone.

For each part asked for (``context-i2w``, ``rtic``, ``lattqe``, ``ics``) that the checkpoint layer
(:mod:`engine.checkpoints`) cannot already find for the backbone's fingerprint (or always with ``--force``),
the part's own trainer runs on the data this machine has (the offline sets, plus ``--data`` sources) and
writes ``<part>-<backbone slug>.safetensors`` + sidecar into ``--out`` (default: the prepared-checkpoint
cache, searched after ``CIS_CHECKPOINTS``).

Budget planning: the total ``--budget-min`` is shared between the parts (Context-I2W 45 %, RTIC 20 %,
LAttQE 20 %, ICS 15 %, re-shared when fewer parts run). Each trainer first runs a short probe (one epoch on a
small slice) twice: the first pays what the data costs once (embedding its images), the second's wall time gives
the cost per training unit (pair-epoch, triplet-epoch, query, item epoch); the run then gets as many units as fit
its share after both probes, with at least one epoch. On a short
budget without CUDA the Context-I2W mapper is the small configuration. The plan and the measured costs are
written into the checkpoint's ``.json`` sidecar under ``"prepare"``. The plan is an estimate (the load of a
shared machine changes); the limit is enforced by :mod:`engine.train.budget`: a part's trainer ends at the
last epoch that fits its share of the deadline.

Before training, every offline data set the asked-for parts read is built (:func:`data_needs`: a part's trainer,
its prior anchor's fit and the defaults step), whichever parts are asked for and in whatever order. After
training, the steps that read the held-out-domain suite run in the budget that is left, each only if some is
left (at least :data:`SUITE_STEP_S`): the prior anchor of each composer trained (``engine.train.anchor_fit``),
then the defaults (method, nQE).
A step the budget leaves out is listed as skipped with the command that runs it, and so is a part whose turn
comes after the budget is spent (the first part always runs). The budget does not bound a started part's
minimum: it runs its two probes and at least one epoch, so a run ends within the budget plus two probes and one
epoch of the last part it started (docs/deploy.md, "What the budget bounds", has a measured run).

Resumable: a finished part is found and skipped on the next run; the plan of an unfinished run is kept in
``<cache>/prepare/<slug>/<part>/plan.json`` and reused (no second probe), and Context-I2W / RTIC continue
from their saved training state. CUDA is used when present (``--device auto``).

``--context-i2w-checkpoint PATH_OR_URL --sha256 HEX`` converts the authors' released ``IM2TEXT_OWM_Attn``
checkpoint instead of training Context-I2W (see :mod:`engine.fetch`).

At the end a table lists part -> source (trained / converted / existing) -> file -> held-out (validation)
figure.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .checkpoints import PARTS as CHECKPOINT_PARTS
from .checkpoints import file_name, find, prepared_dir, prepared_parts, read_record, slug
from .config import Settings, resolve_device
from .process import configure_process
from .data import locations
from .data.formats import build_command
from .defaults import engine_defaults
from .errors import EngineError, InputError
from .fetch import ChecksumError, _check_hex, fetch_verified
from .fileio import atomic_write_text
from .train.budget import train_deadline

# training options of the shipped packaged checkpoints, so a prepared part is trained the same way
# the shipped packaged mapper's command (docs/context_i2w.md), seed included
CONTEXT_I2W_SMALL_RECIPE = ["--seed", "1", "--lr", "3e-4", "--warmup-steps", "30", "--gate-init", "0.3",
                            "--local-zero-init", "--global-dropout", "0.5", "--cosine-weight", "1.0"]
# the shipped RTIC's stage-1 recipe on the offline set (docs/rtic.md, "Command"): its optimiser, batch, one target
# per reference, the photos' tone edits, the open-vocabulary operation set, the cosine term and batches of whole
# source photos; the epochs are planned
RTIC_OFFLINE_RECIPE = ["--optimizer", "sgd", "--lr", "0.01", "--batch-size", "128", "--max-targets", "1",
                       "--tone-edits", "--open-vocab", "--cos-weight", "0.3", "--group-by-photo"]
CONTEXT_I2W_MAX_EPOCHS = 12  # the shipped packaged mapper's epochs (docs/context_i2w.md)
RTIC_MAX_EPOCHS = 30  # the shipped RTIC's epochs
LATTQE_SETS = "emoji,photos"
# each part's budget share, probe, units and data sets, and the checkpoint prepare makes of it: its spec
# (engine.checkpoints.PARTS[part].prepare); "defaults", the step that chooses the default method on the
# held-out-domain suite, reads the suite's sets
DEFAULTS_DATA = ("captions", "cir")


def _spec(part: str):
    return CHECKPOINT_PARTS[part].prepare


def data_needs(part: str) -> tuple:
    """The offline data sets ``part`` reads (its trainer, and for the composers the prior anchor's fit, which
    also reads the held-out-domain suite), built before training whichever parts are asked for."""
    return DEFAULTS_DATA if part == "defaults" else _spec(part).data


def _config(part: str) -> dict:
    """Which checkpoint of ``part`` prepare makes and looks for (ICS: its code length)."""
    return dict(_spec(part).config)


@dataclass
class Row:
    part: str
    source: str  # trained | converted | existing | failed
    file: str = ""
    held_out: str = ""
    seconds: float = 0.0
    error: str = ""


@dataclass
class Status:
    """What a background prepare reports (read by the app's status line)."""
    state: Dict[str, str] = field(default_factory=dict)  # part -> waiting | preparing | available | failed
    fraction: Dict[str, float] = field(default_factory=dict)
    error: Dict[str, str] = field(default_factory=dict)
    started: Dict[str, float] = field(default_factory=dict)  # part -> perf_counter at the start of its run
    planned_s: Dict[str, float] = field(default_factory=dict)

    def percent(self, part: str) -> int:
        """Progress of ``part`` in %: probe done = 20 %, then by elapsed time against the plan (max 99 %)."""
        if self.state.get(part) == "available":
            return 100
        frac = self.fraction.get(part, 0.0)
        if part in self.started and self.planned_s.get(part):
            frac = 0.2 + 0.8 * min((time.perf_counter() - self.started[part]) / self.planned_s[part], 0.99)
        return int(round(100 * min(frac, 0.99)))


# -- finding what exists --------------------------------------------------------------------------------


def find_existing(part: str, backbone, checkpoint_dir) -> Optional[Path]:
    """The checkpoint the layer would load for ``part`` and this backbone, or None (the table of parts,
    :data:`engine.checkpoints.PARTS`: ``rtic`` finds RTIC and RTIC+GCN)."""
    if part not in prepared_parts():
        raise InputError(f"unknown part {part!r}; choose from {', '.join(prepared_parts())}")
    hits = find(part, backbone.fingerprint, checkpoint_dir, dim=backbone.embed_dim, **_config(part))
    return hits[0][0] if hits else None


def target_path(part: str, backbone, out: Path) -> Path:
    """``<stem>-<backbone slug>.safetensors`` in ``out`` (ICS: ``ics-<bits>``, named by the fingerprint)."""
    bits = _config(part).get("bits")
    stem = CHECKPOINT_PARTS[part].stem + (f"-{bits}" if bits else "")
    return out / file_name(stem, backbone.name if not bits else backbone.fingerprint)


# -- running the trainers -------------------------------------------------------------------------------


def _run_trainer(module: str, argv: List[str], quiet: bool) -> float:
    """Runs ``module.main(argv)`` in this process; returns its wall time. Trainer stdout (JSON summaries)
    is swallowed; their tqdm bars (stderr) show unless ``quiet``."""
    mod = importlib.import_module(module)
    t0 = time.perf_counter()
    # trainers print JSON summaries; the CLI swallows them (the table says it all). In a background
    # thread (the app) nothing is redirected: sys.stdout/stderr are process-wide.
    main_thread = threading.current_thread() is threading.main_thread()
    with contextlib.redirect_stdout(io.StringIO()) if main_thread else contextlib.nullcontext():
        if quiet and main_thread:
            with contextlib.redirect_stderr(io.StringIO()):
                rc = mod.main(argv)
        else:
            rc = mod.main(argv)
    if rc:
        raise EngineError(f"{module} exited with status {rc}")
    return time.perf_counter() - t0


def _argv(part: str, spec: str, device: str, out: Path, run_dir: Path, units: int, probe: bool,
          small: bool, data: Dict[str, str], quiet: bool) -> List[str]:
    """Trainer arguments; ``units`` is the planned amount of work (see module doc)."""
    common = ["--backbone", spec, "--device", device]
    if part == "context-i2w":
        pairs, epochs = units
        a = [*common, "--data", data.get("captions", "captions+recoloured"), "--out", str(out),
             "--name", target_path(part, _BB[spec], out).name, "--run-dir", str(run_dir),
             "--epochs", str(epochs), "--max-pairs", str(pairs), "--eval-cir", ""]
        if probe:
            a += ["--val-split", "", "--val-fraction", "0"]
        if small:  # the small mapper with the shipped packaged checkpoint's recipe (docs/context_i2w.md)
            a += ["--small", *CONTEXT_I2W_SMALL_RECIPE]
        if not probe and (run_dir / "state.pt").exists():
            a.append("--resume")
    elif part == "rtic":
        (epochs,) = units
        a = [*common, "--out", str(out), "--run-dir", str(run_dir), "--epochs", str(epochs),
             "--eval-split", "" if probe else "val"]
        if "fashioniq" in data:
            a += ["--data", "fashioniq", "--root", data["fashioniq"]]
        elif "cirr" in data:
            a += ["--data", "cirr", "--root", data["cirr"]]
        else:  # the offline CIR set, with the shipped checkpoints' tone edits and cosine term (docs/rtic.md)
            a += RTIC_OFFLINE_RECIPE
        if not probe and any(run_dir.glob("*state*")):
            a.append("--resume")
    elif part == "lattqe":
        epochs, queries = units
        a = [*common, "--labelled", LATTQE_SETS, "--out", str(out), "--name",
             target_path(part, _BB[spec], out).stem, "--epochs", str(epochs), "--queries-per-epoch", str(queries)]
        if probe:
            a += ["--eval-queries", "16", "--val-queries", "32"]
    elif part == "ics":
        (epochs,) = units
        a = [*common, "--data", "multilabel", "--bits", str(_config(part)["bits"]), "--epochs", str(epochs),
             "--out", str(out)]
    else:  # a part with the plain trainer options (engine.checkpoints.Prepare)
        a = [*common, "--out", str(out), "--epochs", str(units[0])]
    if part in ("rtic", "context-i2w"):
        a.append("--no-anchor")  # the prior anchor is its own step after training, within the budget (_prepare_anchor)
    if quiet:
        a.append("--quiet")
    return a


_BB: Dict[str, object] = {}


# a step that reads the held-out-domain suite (a prior anchor's fit, the defaults) starts only with at least this
# much of the budget left (it embeds the suite's photos once per backbone and ranks every setting)
SUITE_STEP_S = 120.0
SAFETY = 0.5  # plan 50 % of the share: the machine's load can change between the probe and the run
EVAL_RESERVE = 0.2  # training must end this share of a part's time before its end: evaluation and writing


def plan_units(part: str, probe_units, cold_s: float, warm_s: float, seconds: float, small: bool) -> tuple:
    """Units for the real run, filling ``SAFETY`` x what is left of ``seconds`` (the part's share) after both
    probes. ``cold_s`` is the first probe: it also paid what a set costs once (embedding its images into the
    feature cache); ``warm_s`` is the same probe again, which pays only the training (and the trainer's start), so
    it is the cost per unit, an upper bound. Planning from the cold probe alone planned a few per cent of the
    share (RTIC: 2 epochs of a 20-minute share whose epochs take seconds once the set is embedded)."""
    warm_s = max(warm_s, 1e-3)
    left = max(SAFETY * (seconds - cold_s - warm_s), warm_s)  # at least as much as the probe again
    if part == "context-i2w":
        # the probe embeds only its slice's images: each new pair of the real run may cost that once more
        once = max(cold_s - warm_s, 0.0) / probe_units[0]
        per_pair = warm_s / probe_units[0]
        pairs = max(256, min(4096, int(left / (once + per_pair))))
        epochs = int((left - pairs * once) / (pairs * per_pair))
        return pairs, max(1, min(CONTEXT_I2W_MAX_EPOCHS, epochs))
    if part == "rtic":  # the probe is a whole epoch: every image is embedded by then
        return (max(2, min(RTIC_MAX_EPOCHS, int(left / warm_s))),)
    if part == "lattqe":
        per_q = warm_s / probe_units[1]
        total = int(left / per_q)
        queries = max(128, min(2048, total // 4))
        return max(1, min(40, total // queries)), queries
    if part == "ics":
        return (max(5, min(60, int(left / warm_s * probe_units[0]))),)
    return (max(1, int(left / warm_s * probe_units[0])),)  # epochs, linear in time


def _held_out(part: str, sidecar: dict) -> str:
    """The validation figure a part's trainer stored (never used to choose anything here)."""
    try:
        if part == "context-i2w":
            r = sidecar["training"]["held_out"]["pairs"]
            return f"{r['split']} caption->image R@10 {r['recall']['context-i2w']['R@10']:.2f} %"
        if part == "rtic":
            split = sidecar.get("eval_split") or sidecar.get("prepare", {}).get("eval_split", "held-out")
            return f"{split} composed R@10 {sidecar['held_out']['R@10']:.2f} %"
        if part == "lattqe":
            return f"val mAP@nQE {sidecar['val_map']:.3f} (no QE {sidecar['val_map_none']:.3f})"
        if part == "ics":
            return f"held-out mAP {sidecar['eval']['map_ics']:.3f} (LSH {sidecar['eval']['map_lsh']:.3f})"
    except (KeyError, TypeError):
        pass
    return "see sidecar"


def _annotate(path: Path, info: dict) -> dict:
    side = path.with_suffix(".json")
    record = json.loads(side.read_text()) if side.is_file() else {}
    record["prepare"] = info
    atomic_write_text(side, json.dumps(record, indent=1, default=str) + "\n")
    return record


def prepare(backbone: str = "auto", out: Optional[os.PathLike] = None, parts: Optional[Sequence[str]] = None,
            budget_min: float = 30.0, data: Sequence[str] = (), force: bool = False,
            context_i2w_checkpoint: Optional[str] = None, sha256: Optional[str] = None, device: str = "auto",
            quiet: bool = False, status: Optional[Status] = None, *, settings: Settings) -> List[Row]:
    """Makes ``parts`` available for ``backbone``; returns one :class:`Row` per part (see module doc).
    ``settings`` (the entry point's) gives the ``CIS_CHECKPOINTS`` folders searched after ``out`` and the
    prepared-checkpoint folder."""
    from .backbones import create_backbone

    t_start = time.perf_counter()  # the budget counts from here: loading the backbone is part of it
    known = prepared_parts()
    parts = [p.strip() for p in (known if parts is None else parts) if p.strip()]
    bad = [p for p in parts if p not in known]
    if bad:
        raise InputError(f"unknown part {bad[0]!r}; choose from {', '.join(known)}")
    if budget_min <= 0:
        raise InputError("--budget-min must be positive")
    sources = _parse_data(data)
    if context_i2w_checkpoint and not sha256:
        raise InputError("--context-i2w-checkpoint needs --sha256 HEX (the file's expected SHA-256)")
    if context_i2w_checkpoint:
        _check_hex(sha256)
    device = resolve_device(device)
    bb = create_backbone(backbone, device, settings=settings)
    spec = backbone
    _BB[spec] = bb
    out = Path(out) if out else prepared_dir(settings=settings)  # created by the first checkpoint written into it
    search = os.pathsep.join([str(out), settings.checkpoints_given])
    status = status or Status()
    for p in parts:
        status.state[p], status.fraction[p] = "waiting", 0.0
    deadline = t_start + budget_min * 60
    small = device != "cuda" and budget_min < 120
    rows: List[Row] = []
    todo = list(parts)
    missing = build_data(parts, sources, quiet, data_sources=locations.DataSources.from_settings(settings))
    while todo:
        part = todo.pop(0)
        t0 = time.perf_counter()
        status.state[part] = "preparing"
        try:
            lacking = [missing[n] for n in data_needs(part) if n in missing]
            if lacking and not (part == "context-i2w" and context_i2w_checkpoint):
                raise InputError(lacking[0])
            if rows and time.perf_counter() >= deadline and (force or find_existing(part, bb, search) is None):
                # the first part always runs; a later one whose turn comes after the budget is not started
                row = Row(part, "skipped", error=f"the budget is spent: prepare it with `python -m engine prepare "
                          f"--parts {part} --budget-min N`")
                status.state[part], status.error[part] = "failed", row.error
            else:
                row = _prepare_part(part, bb, spec, device, out, search, force, sources, small, quiet, deadline,
                                    todo, context_i2w_checkpoint, sha256, status, budget_min)
                status.state[part] = "available"
                status.fraction[part] = 1.0
        except Exception as exc:  # one part failing does not stop the others

            if isinstance(exc, ChecksumError):  # the wrong file: refuse the whole run, write nothing
                raise
            row = Row(part, "failed", error=f"{exc.__class__.__name__}: {exc}"[:300])
            status.state[part], status.error[part] = "failed", row.error
        row.seconds = round(time.perf_counter() - t0, 1)
        rows.append(row)
    for part in [r.part for r in rows if r.part in ("rtic", "context-i2w") and r.source == "trained"]:
        if deadline - time.perf_counter() >= SUITE_STEP_S:
            rows.append(_prepare_anchor(part, bb, search, out))
        else:  # part of the budget like training; without it the composer is used as trained
            rows.append(Row(f"anchor {part}", "skipped", error="the budget is spent: the composer is used without "
                            f"its prior anchor until `python -m engine train anchor --composer {part} --checkpoints "
                            f"{out}` runs"))
    if any(r.part in ("rtic", "context-i2w") and r.source not in ("failed", "skipped") for r in rows):
        if deadline - time.perf_counter() >= SUITE_STEP_S:
            rows.append(_prepare_defaults(bb, out, search, force, settings))
        else:  # part of the budget like training; the fallback defaults hold until it runs
            rows.append(Row("defaults", "skipped", error="the budget is spent: the weighted sum and the fallback "
                            "expansion defaults apply until `python -m engine eval generalise --side val --choose "
                            "--out DIR` runs"))
    return rows


def data_needed(parts: Sequence[str], sources: Dict[str, str]) -> List[str]:
    """The offline data sets ``parts`` read (:func:`data_needs`), in order, each once; a part trained on
    ``--data`` sources still needs the suite's sets for its anchor fit and the defaults step."""
    names: List[str] = []
    for part in [*parts, "defaults"] if any(p in ("rtic", "context-i2w") for p in parts) else parts:
        for n in data_needs(part):
            if n not in names:
                names.append(n)
    return names


def build_data(parts: Sequence[str], sources: Dict[str, str], quiet: bool = False,
               data_sources: Optional[locations.DataSources] = None) -> Dict[str, str]:
    """Builds (once, counted in the budget) every offline set the asked-for parts need, from ``data_sources``
    (the caller's Settings: a running app's background prepare passes its own). Returns {set: sentence}
    for each set that could not be built: the sentence names the command that builds it and why it is needed
    (the parts that need it then fail with it; the others go on)."""
    from .data.builders import ensure_built

    missing: Dict[str, str] = {}
    for name in data_needed(parts, sources):
        try:
            with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
                ensure_built(name, sources=data_sources)
        except Exception as exc:
            users = ", ".join(p for p in parts if name in data_needs(p)) or "the defaults step"
            missing[name] = (f"the offline data set {name!r} that {users} needs could not be built "
                             f"({exc.__class__.__name__}: {exc}); build it with: {build_command(name)}")
    return missing


def _prepare_anchor(part: str, bb, search: str, out: Path) -> Row:
    """Fits the prior anchor of the ``part`` checkpoint just trained (``engine.train.anchor_fit``); the
    sidecar keeps its ``prepare`` plan (the fit writes the checkpoint again)."""
    t0 = time.perf_counter()
    try:
        from .train.anchor_fit import anchor_checkpoint

        side = target_path(part, bb, out).with_suffix(".json")
        plan = json.loads(side.read_text()).get("prepare") if side.is_file() else None
        report = anchor_checkpoint(bb, part, search, progress=False)
        if plan:
            _annotate(side.with_suffix(".safetensors"), plan)
        cfg = report.get("config", {})
        row = Row(f"anchor {part}", "fitted", held_out=f"weight {cfg.get('weight', 0):g} (suite val + in-domain val)")
    except Exception as exc:  # the composer is usable without it
        row = Row(f"anchor {part}", "failed", error=f"{exc.__class__.__name__}: {exc}"[:300])
    row.seconds = round(time.perf_counter() - t0, 1)
    return row


def _prepare_defaults(bb, out: Path, search: str, force: bool, settings: Settings) -> Row:
    """The default method and nQE per expander for this backbone, chosen on the validation side of the
    held-out-domain suite exactly as for the shipped backbone (``engine.eval.generalise.choose_defaults``);
    ``settings``: prepare's, searching ``search``."""
    t0 = time.perf_counter()
    settings = replace(settings, checkpoints=search)
    found = engine_defaults(bb, settings)
    if found.source and not force:
        return Row("defaults", "existing", found.source, f"method {found.method}")
    try:
        from .eval.generalise import choose_defaults

        _, chosen, path = choose_defaults(bb, settings, out)
        row = Row("defaults", "chosen", str(path), f"method {chosen['method']} (suite val)")
    except Exception as exc:  # the parts are usable without it: the weighted sum stays the default
        row = Row("defaults", "failed", error=f"{exc.__class__.__name__}: {exc}"[:300])
    row.seconds = round(time.perf_counter() - t0, 1)
    return row


def _parse_data(specs: Sequence[str]) -> Dict[str, str]:
    """``--data KIND=PATH``: captions=<folder|csv|jsonl> (Context-I2W), fashioniq=<root> / cirr=<root> (RTIC)."""
    out = {}
    for s in specs:
        kind, sep, path = str(s).partition("=")
        if not sep or kind not in ("captions", "fashioniq", "cirr") or not path:
            raise InputError(f"--data {s!r}: expected captions=PATH, fashioniq=ROOT or cirr=ROOT")
        if not Path(path).exists():
            raise InputError(f"--data {s!r}: {path} does not exist")
        out[kind] = path
    return out


def _prepare_part(part, bb, spec, device, out, search, force, sources, small, quiet, deadline, todo,
                  ci2w_ckpt, sha256, status, budget_min) -> Row:
    if not force:
        found = find_existing(part, bb, search)
        if found is not None:
            return Row(part, "existing", str(found), _held_out(part, read_record(found)))
    if part == "context-i2w" and ci2w_ckpt:
        local = fetch_verified(ci2w_ckpt, sha256, quiet=quiet, deadline=deadline)  # within the budget
        target = target_path(part, bb, out)
        _run_trainer(CHECKPOINT_PARTS[part].trainer, ["--backbone", spec, "--device", device, "--checkpoint", str(local),
                                     "--epochs", "0", "--out", str(out), "--name", target.name,
                                     "--eval-cir", "", "--val-split", ""], quiet)
        rec = _annotate(target, {"source": "converted", "from": os.path.basename(str(ci2w_ckpt)),
                                 "sha256": sha256.lower()})
        return Row(part, "converted", str(target), _held_out(part, rec))
    t_part = time.perf_counter()
    remaining = max(deadline - t_part, 1.0)
    weights = [_spec(p).share for p in [part, *todo]]
    seconds = remaining * _spec(part).share / sum(weights)
    run_dir = prepared_dir(create=True).parent / "prepare" / slug(bb.fingerprint) / part
    run_dir.mkdir(parents=True, exist_ok=True)
    plan_file = run_dir / "plan.json"
    plan = json.loads(plan_file.read_text()) if plan_file.is_file() else None
    module = CHECKPOINT_PARTS[part].trainer
    if plan is None or plan.get("fingerprint") != bb.fingerprint or plan.get("budget_min") != budget_min:
        shutil.rmtree(run_dir / "run", ignore_errors=True)  # its state belongs to another plan
        probe = _spec(part).probe
        status.fraction[part] = 0.05
        probe_out = run_dir / "probe"
        cold_s, warm_s = (_run_trainer(module, _argv(part, spec, device, probe_out, run_dir / f"probe-run{i}", probe,
                                                     True, small, sources, quiet), quiet) for i in (0, 1))
        units = plan_units(part, probe, cold_s, warm_s, seconds, small)
        plan = {"fingerprint": bb.fingerprint, "budget_min": budget_min, "budget_s": round(seconds, 1), "probe_units": list(probe),
                "probe_s": round(cold_s + warm_s, 2), "probe_cold_s": round(cold_s, 2), "probe_warm_s": round(warm_s, 2),
                "units": list(units), "small_mapper": small, "device": device}

        atomic_write_text(plan_file, json.dumps(plan))
    status.fraction[part] = 0.2
    status.started[part], status.planned_s[part] = time.perf_counter(), max(seconds - plan["probe_s"], 1.0)

    # the plan is an estimate; this is the limit, leaving the part's evaluation and writing their share
    with train_deadline(min(deadline, t_part + seconds) - EVAL_RESERVE * seconds):
        run_s = _run_trainer(module, _argv(part, spec, device, out, run_dir / "run", tuple(plan["units"]), False,
                                           plan["small_mapper"], sources, quiet), quiet)
    target = target_path(part, bb, out)
    if not target.is_file():
        raise EngineError(f"the {part} trainer finished without writing {target.name}")
    unit_names = _spec(part).units
    info = {"source": "trained", "command": "python -m engine prepare", **plan,
            "units": dict(zip(unit_names, plan["units"])), "train_s": round(run_s, 1)}
    rec = _annotate(target, info)
    plan_file.unlink(missing_ok=True)
    return Row(part, "trained", str(target), _held_out(part, rec))


def format_table(rows: List[Row]) -> str:
    head = "| part | source | file | held-out | seconds |\n|---|---|---|---|---|"
    lines = [f"| {r.part} | {r.source} | {Path(r.file).name if r.file else '-'} | "
             f"{r.held_out or r.error or '-'} | {r.seconds:.0f} |" for r in rows]
    return "\n".join([head, *lines])


def main(argv: Optional[Sequence[str]] = None, settings: Optional[Settings] = None) -> int:
    """The command; ``settings``: read from the environment here, the entry point (a test passes its own)."""
    ap = argparse.ArgumentParser(prog="python -m engine prepare", description=__doc__.split("\n\n")[0])
    settings = settings or Settings()
    configure_process(settings)
    ap.add_argument("--backbone", default=settings.backbone)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default=None, help="checkpoint folder (default: the prepared-checkpoint cache)")
    ap.add_argument("--parts", default=",".join(prepared_parts()), help="comma list of " + ", ".join(prepared_parts()))
    ap.add_argument("--budget-min", type=float, default=30.0, help="total wall-time budget in minutes")
    ap.add_argument("--data", action="append", default=[], help="captions=PATH, fashioniq=ROOT or cirr=ROOT")
    ap.add_argument("--force", action="store_true", help="retrain parts that already exist")
    ap.add_argument("--context-i2w-checkpoint", default=None, help="authors' IM2TEXT_OWM_Attn file or http(s) URL")
    ap.add_argument("--sha256", default=None, help="expected SHA-256 of --context-i2w-checkpoint")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = prepare(args.backbone, args.out, args.parts.split(","), args.budget_min, args.data, args.force,
                   args.context_i2w_checkpoint, args.sha256, args.device, args.quiet, settings=settings)
    print(format_table(rows))
    print(f"total wall time: {time.perf_counter() - t0:.0f} s (budget {args.budget_min * 60:.0f} s)")
    return 1 if any(r.source == "failed" for r in rows) else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

