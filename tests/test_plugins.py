"""Section plugins fail loudly; `bench --only X` rewrites X's own date / machine line."""
import pytest

from engine.bench import _merge
from engine.plugins import load_plugin


def test_broken_section_module_fails_loudly(tmp_path, monkeypatch):
    (tmp_path / "broken_section_mod.py").write_text("import a_module_that_does_not_exist\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match="a_module_that_does_not_exist"):
        load_plugin("broken_section_mod:bench_section")
    with pytest.raises(AttributeError, match="no function nope"):
        load_plugin("engine.plugins:nope")
    assert load_plugin("engine.plugins:load_plugin") is load_plugin


def test_only_rewrites_its_own_section_header():
    old = ("# Benchmarks\n\nhead\n\n## query\n\n_Measured 2020-01-01 on old box._\n\nq old\n\n"
           "## ann\n\n_Measured 2020-01-01 on old box._\n\na old\n\n")
    new = _merge(old, ["## ann\n\n_Measured 2026-12-01 on new box._\n\na new"])
    assert "_Measured 2026-12-01 on new box._\n\na new" in new and "a old" not in new
    assert "## query\n\n_Measured 2020-01-01 on old box._\n\nq old" in new
