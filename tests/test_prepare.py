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
    (its trainer, its anchor fit, the defaults step) reads, trains it, and ends near its budget."""
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
    assert find_existing(part, create_backbone("tiny", "cpu"), str(out)) is not None
    assert f"| {part} | trained |" in printed
    # the steps that read the suite ran or were skipped with the command that runs them: never a failure
    assert "failed" not in printed


def test_prepare_tiny_small_budget_writes_found_checkpoints(empty_checkpoints, capsys):
    from engine.backbones import create_backbone

    out = empty_checkpoints / "prepared"
    rc = main(["--backbone", "tiny", "--out", str(out), "--parts", "rtic", "--budget-min", "1",
               "--force", "--quiet"], _settings(empty_checkpoints))
    printed = capsys.readouterr().out
    assert rc == 0, printed
    bb = create_backbone("tiny", "cpu")
    for part in ("rtic",):
        path = find_existing(part, bb, str(out))
        assert path is not None and path.parent == out
        side = json.loads(path.with_suffix(".json").read_text())
        plan = side["prepare"]
        assert plan["source"] == "trained" and plan["probe_s"] > 0 and plan["budget_s"] > 0
        assert min(plan["units"].values()) >= 1
        assert f"| {part} | trained | {path.name} |" in printed
    # a second run finds them and trains nothing
    rows = prepare("tiny", out, ["rtic"], budget_min=1.0, quiet=True, settings=_settings(empty_checkpoints))
    assert rows[0].part == "rtic" and rows[0].source == "existing"


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
