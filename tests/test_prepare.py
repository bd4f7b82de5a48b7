"""`python -m engine prepare` for the tiny backbone with a small budget (real trainers, real files)."""
import json

import pytest

from engine.config import Settings
from engine.prepare import Row, find_existing, format_table, main, prepare


@pytest.fixture
def empty_checkpoints(tmp_path):
    (tmp_path / "empty").mkdir()
    return tmp_path


def _settings(folder) -> Settings:
    """The Settings of a machine whose CIS_CHECKPOINTS is an empty folder, passed in (no environment patch)."""
    return Settings(checkpoints=str(folder / "empty"), checkpoints_given=str(folder / "empty"))


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """A cache with nothing in it: no offline data set, no feature table, no prepared part (a fresh machine)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("CIS_CACHE_DIR", str(cache))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return cache


@pytest.mark.parametrize("part", ["rtic", "context-i2w"])
def test_prepare_one_composer_alone_on_an_empty_cache_builds_what_it_needs(part, empty_checkpoints, empty_cache,
                                                                           capsys):
    """A Space that prepares only one part, on a fresh machine: prepare builds every offline set that part
    (its trainer, its anchor fit, the defaults step) reads, trains it within its budget with a measured plan,
    writes a checkpoint the search finds, and a second run finds it instead of training again."""
    from engine.backbones import create_backbone
    from engine.data.builders import is_built
    from engine.prepare import data_needed, data_needs

    assert set(data_needs(part)) <= set(data_needed([part], {}))
    assert {"captions", "cir"} <= set(data_needed([part], {}))  # the anchor fit and defaults read the suite
    assert not any(is_built(n) for n in data_needed([part], {}))
    out = empty_checkpoints / "prepared"
    rc = main(["--backbone", "tiny", "--out", str(out), "--parts", part, "--budget-min", "1", "--force", "--quiet"],
              _settings(empty_checkpoints))
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert all(is_built(n) for n in data_needed([part], {}))
    # the steps that read the suite ran or were skipped with the command that runs them: never a failure
    assert "failed" not in printed
    path = find_existing(part, create_backbone("tiny", "cpu"), str(out))
    assert path is not None and path.parent == out and f"| {part} | trained | {path.name} |" in printed
    plan = json.loads(path.with_suffix(".json").read_text())["prepare"]
    assert plan["source"] == "trained" and plan["probe_s"] > 0 and plan["budget_s"] > 0
    # both probes ran and were measured: the first pays the set's one-time costs, the second plans the run
    assert plan["probe_cold_s"] > 0 and plan["probe_warm_s"] > 0
    assert plan["probe_s"] == pytest.approx(plan["probe_cold_s"] + plan["probe_warm_s"], abs=0.02)
    assert min(plan["units"].values()) >= 1
    # a second run finds it and trains nothing
    rows = prepare("tiny", out, [part], budget_min=1.0, quiet=True, settings=_settings(empty_checkpoints))
    assert rows[0].part == part and rows[0].source == "existing"


def test_prepare_refuses_bad_input_before_work(empty_checkpoints):
    from engine.errors import InputError

    with pytest.raises(InputError, match="unknown part"):
        prepare("tiny", empty_checkpoints / "o", ["nope"], settings=_settings(empty_checkpoints))
    with pytest.raises(InputError, match="--sha256"):
        prepare("tiny", empty_checkpoints / "o", ["context-i2w"], context_i2w_checkpoint="x.pt",
                settings=_settings(empty_checkpoints))
    with pytest.raises(InputError, match="--data"):
        prepare("tiny", empty_checkpoints / "o", ["rtic"], data=["bogus"], settings=_settings(empty_checkpoints))
    assert not (empty_checkpoints / "o").exists()
    assert "| ics | failed | - | boom | 0 |" in format_table([Row("ics", "failed", error="boom")])


def test_a_part_whose_turn_comes_after_the_budget_is_skipped_with_its_command(empty_checkpoints, monkeypatch):
    """The first part always runs; the budget spent, the next part is not started but listed with the command
    that prepares it, and the steps that need a trained composer are not run for it."""
    import time

    import engine.prepare as prep

    ran = []

    def fake_part(part, *a, **kw):
        ran.append(part)
        time.sleep(0.8)          # longer than the whole budget below
        return Row(part, "trained", "x.safetensors")

    monkeypatch.setattr(prep, "_prepare_part", fake_part)
    monkeypatch.setattr(prep, "build_data", lambda parts, sources, quiet, data_sources=None: {})
    monkeypatch.setattr(prep, "_prepare_anchor", lambda *a: pytest.fail("no anchor fit after the budget"))
    status = prep.Status()
    rows = prepare("tiny", empty_checkpoints / "o", ["lattqe", "ics"], budget_min=0.01, quiet=True, status=status,
                   settings=_settings(empty_checkpoints))
    assert ran == ["lattqe"]
    assert [(r.part, r.source) for r in rows] == [("lattqe", "trained"), ("ics", "skipped")]
    assert "python -m engine prepare --parts ics" in rows[1].error and status.state["ics"] == "failed"


def test_the_plan_pays_the_probes_one_time_cost_once_not_per_epoch():
    """What `prepare --backbone packaged:lite0+definitions --budget-min 65` measured: RTIC's cold probe took
    288 s, nearly all of it embedding the set once, and an epoch then took seconds; planned from the cold probe
    the run got 2 epochs of its 1,228 s share. From the warm probe it gets the shipped recipe's 30."""
    from engine.prepare import RTIC_MAX_EPOCHS, SAFETY, plan_units

    share = 1228.0
    assert plan_units("rtic", (1,), 288.0, 288.0, share, True) == (2,)  # no one-time cost: an epoch is 288 s
    assert plan_units("rtic", (1,), 288.0, 40.0, share, True) == (int(SAFETY * (share - 328.0) / 40.0),)
    assert plan_units("rtic", (1,), 288.0, 6.0, share, True) == (RTIC_MAX_EPOCHS,)
    # Context-I2W's probe embeds only its 128 pairs' images: every further pair may cost that again, once
    cold, warm, share = 22.4, 3.0, 1701.0
    pairs, epochs = plan_units("context-i2w", (128, 1), cold, warm, share, True)
    once, per_pair, left = (cold - warm) / 128, warm / 128, SAFETY * (share - cold - warm)
    assert pairs == 4096 and epochs >= 2
    assert pairs * once + epochs * pairs * per_pair <= left < pairs * once + (epochs + 1) * pairs * per_pair


def test_prepare_trains_rtic_with_the_shipped_rtic_recipe():
    """`prepare` on the offline set trains RTIC as the shipped checkpoint was trained (docs/rtic.md): the same
    optimiser, rate, batch and its grouping, targets, cosine term, tone edits and open-vocabulary operations; only the epochs are
    planned, up to the shipped number."""
    from pathlib import Path

    from engine.prepare import RTIC_MAX_EPOCHS, _argv, data_needs
    from engine.train.rtic.cli import _parser

    sidecar = Path(__file__).resolve().parents[1] / "assets" / "checkpoints" / (
        "rtic-packaged-efficientnet-lite0-all-minilm-l6-v2.json")
    shipped = json.loads(sidecar.read_text())
    recipe = shipped["recipe"]
    a = _parser().parse_args(_argv("rtic", "tiny", "cpu", Path("o"), Path("r"), (RTIC_MAX_EPOCHS,), False, True, {},
                                   True))
    assert (a.optimizer, a.lr, a.batch_size, a.cos_weight, a.epochs, a.loss, a.margin, a.group_by_reference,
            a.group_by_photo) == (
        recipe["optimizer"], recipe["lr"], recipe["batch_size"], recipe["cos_weight"], recipe["epochs"],
        recipe["loss"], recipe["margin"], recipe["group_by_reference"], recipe["group_by_photo"])
    assert a.open_vocab and shipped["open_vocab"] and a.tone_edits and shipped["tone_edits"]
    assert a.max_targets == 1 and a.data == shipped["data"] == "cir"
    assert "open_vocab" in data_needs("rtic")  # built before the clock's training share, like the other sets
