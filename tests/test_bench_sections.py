"""Every `python -m engine bench` section runs, on tiny inputs: a section that no test runs can break
unseen (issue #34: `--only query` failed with ModuleNotFoundError and nobody knew). The figures of these runs
mean nothing; only that each section measures and writes its part of the report."""
import json

import pytest

from engine.bench import SECTIONS

# the smallest inputs each section accepts (the defaults are docs/BENCHMARKS.md's)
TINY = ["--queries", "2", "--compare-repeats", "1", "--index-images", "4", "--batch-size", "2",
        "--sizes", "3000", "--dim", "64", "--ann-queries", "10", "--index-types", "flat,ivf,hnsw,ivfpq",
        "--hnsw-max", "3000", "--ivfpq-max", "3000", "--hnsw-efc", "40", "--hnsw-ef-search", "16",
        "--ics-bits", "16", "--ics-epochs", "1", "--ics-train", "2000", "--ics-queries", "20", "--ics-multilabel", "",
        "--expander-gallery", "200", "--expander-queries", "3", "--loadtest-clients", "2", "--loadtest-duration", "2",
        "--loadtest-warmup", "0", "--loadtest-compute-seconds", "1",
        "--prepare-archs", "tiny-vit-a", "--text-batches", "1,2", "--text-repeats", "2"]


def test_the_list_below_is_every_section():
    assert sorted(SECTIONS) == sorted(ALL)


ALL = ["query", "memory", "compare", "indexing", "ann", "startup", "info", "loadtest", "expanders", "ics",
       "context-i2w", "integrity", "prepare-cost", "text-batch"]


@pytest.mark.parametrize("name", ALL)
def test_section_runs_on_tiny_inputs(name, gallery_engine, tmp_path, monkeypatch):
    import engine.service
    import engine.train.context_i2w
    from engine.bench import cli

    monkeypatch.setattr(engine.service, "load_default_engine", lambda settings: gallery_engine)
    # prepare-cost counts the offline caption set's pairs; a stand-in list, so the test builds no data set
    monkeypatch.setattr(engine.train.context_i2w, "load_pairs", lambda spec, split="train": [object()] * 3)
    out, raw = tmp_path / "BENCHMARKS.md", tmp_path / "bench.json"
    assert cli.main(["--only", name, "--out", str(out), "--json", str(raw), *TINY]) == 0
    text = out.read_text()
    assert f"## {name}\n" in text and "did not answer" not in text, text[-2000:]
    figures = json.loads(raw.read_text())[name]
    assert figures, f"section {name} returned no figures"
    if name in ("info", "loadtest"):
        assert figures["returncode"] == 0, text[-2000:]
    if name == "ics":
        assert (tmp_path / "ics_map.png").is_file()  # beside the report, never in docs/ from a test
