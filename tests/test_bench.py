"""The bench package: sections are plain functions in a registry (no "module:function" strings), an
unknown section fails before anything is measured, and the one approximate-search recall of the
evaluation core counts what it should."""
import numpy as np
import pytest

from engine.eval.metrics import approximate_recall, exact_top_ids


def test_every_section_is_registered_once_in_run_order():
    from engine.bench import HEAVY, SECTIONS

    names = list(SECTIONS)
    assert names[:2] == ["query", "memory"] and len(names) == len(set(names))
    for moved in ("expanders", "ics", "context-i2w", "integrity", "prepare-cost", "text-batch", "ann"):
        assert moved in SECTIONS and callable(SECTIONS.get(moved))
    assert HEAVY <= set(names)
    with pytest.raises(KeyError, match="known: "):
        SECTIONS.get("nope")


def test_unknown_section_fails_before_loading_the_engine(monkeypatch):
    import engine.service
    from engine.bench import cli

    monkeypatch.setattr(engine.service, "load_default_engine", lambda s: pytest.fail("engine loaded"))
    with pytest.raises(SystemExit, match="unknown bench section nope"):
        cli.main(["--only", "nope", "--out", ""])


def test_section_runs_from_the_registry_and_writes_its_part(tmp_path, monkeypatch):
    import engine.service
    from engine.bench import SECTIONS, cli

    monkeypatch.setattr(engine.service, "load_default_engine", lambda s: "ENGINE")
    seen = {}

    def fake(args, ctx):
        seen["engine"] = ctx["engine"]
        return "fake table", {"x": 1}

    monkeypatch.setitem(SECTIONS._items, "fake-section", fake)
    out = tmp_path / "B.md"
    assert cli.main(["--only", "fake-section", "--out", str(out), "--json", str(tmp_path / "b.json")]) == 0
    assert seen["engine"] == "ENGINE" and "## fake-section" in out.read_text() and "fake table" in out.read_text()
    assert '"x": 1' in (tmp_path / "b.json").read_text()


def test_approximate_recall_counts_the_exact_top_k_found():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    q = x[:4] + 0.01
    exact = exact_top_ids(x, q, 5)
    assert exact.shape == (4, 5) and list(exact[:, 0]) == [0, 1, 2, 3]
    assert approximate_recall(exact, exact) == 1.0
    half = exact.copy()
    half[:, 3:] = -1  # FAISS pads missing results with -1: they are never a hit
    assert approximate_recall(half, exact) == pytest.approx(3 / 5)
    assert approximate_recall(exact[:, ::-1], exact) == 1.0  # order inside the top-k does not matter
    with pytest.raises(Exception, match="rows"):
        approximate_recall(exact[:2], exact)
