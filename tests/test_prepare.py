"""`python -m engine prepare` for the tiny backbone with a small budget (real trainers, real files)."""
import json

import pytest

from engine.prepare import Row, find_existing, format_table, main, prepare


@pytest.fixture
def empty_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setenv("CIS_CHECKPOINTS", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    return tmp_path


def test_prepare_tiny_small_budget_writes_found_checkpoints(empty_checkpoints, capsys):
    from engine.backbones import create_backbone

    out = empty_checkpoints / "prepared"
    rc = main(["--backbone", "tiny", "--out", str(out), "--parts", "rtic", "--budget-min", "1",
               "--force", "--quiet"])
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
    rows = prepare("tiny", out, ["rtic"], budget_min=1.0, quiet=True)
    assert rows[0].part == "rtic" and rows[0].source == "existing"


def test_prepare_refuses_bad_input_before_work(empty_checkpoints):
    from engine.errors import InputError

    with pytest.raises(InputError, match="unknown part"):
        prepare("tiny", empty_checkpoints / "o", ["nope"])
    with pytest.raises(InputError, match="--sha256"):
        prepare("tiny", empty_checkpoints / "o", ["context-i2w"], context_i2w_checkpoint="x.pt")
    with pytest.raises(InputError, match="--data"):
        prepare("tiny", empty_checkpoints / "o", ["rtic"], data=["bogus"])
    assert not (empty_checkpoints / "o").exists()
    assert "| ics | failed | - | boom | 0 |" in format_table([Row("ics", "failed", error="boom")])
