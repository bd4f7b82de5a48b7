"""Issue #27: ``python -m engine eval triplets`` streams its file. Run as a user runs it (a subprocess), with
its peak memory read from outside (/proc VmHWM of the process): a 10,000-line file must cost about what a
1,000-line file costs (before, every reference's features were kept: about 257 kB a line, so 10,000 lines
would have added some 5 GB), with a progress bar; bad lines are each named in one sentence and skipped;
unreadable and missing files are one sentence and exit code 1."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools import hardening_bench as hb  # noqa: E402

MB = 1 << 20


@pytest.fixture(scope="module")
def index_dir(gallery_index_dir):
    return gallery_index_dir


def test_long_file_runs_in_bounded_memory_with_progress(index_dir, tmp_path, capsys):
    small = hb.run_triplets_once(index_dir, hb.triplet_file(tmp_path / "q1k.jsonl", 1000, index_dir))
    big = hb.run_triplets_once(index_dir, hb.triplet_file(tmp_path / "q10k.jsonl", 10_000, index_dir))
    with capsys.disabled():
        print(f"\n[#27] eval triplets: 1000 lines peak {small['peak_mb']} MB, 10000 lines peak {big['peak_mb']} MB "
              f"({big['seconds']} s)")
    assert small["rc"] == 0 and big["rc"] == 0, big["stderr"][-2000:]
    res = json.loads(big["stdout"])
    assert res["queries"] == 10_000 and res["skipped_lines"] == 0
    assert 0.0 <= res["methods"]["image"]["none"]["R@10"] <= 100.0
    assert big["peak_mb"] - small["peak_mb"] < 100, (small["peak_mb"], big["peak_mb"])
    assert "queries" in big["stderr"] and "10000/10000" in big["stderr"]  # the progress bar reached the end
    assert "Traceback" not in big["stderr"]


def test_bad_lines_are_each_one_sentence_and_skipped(index_dir, tmp_path):
    good = hb.triplet_file(tmp_path / "good.jsonl", 4, index_dir).read_bytes().splitlines()
    q = tmp_path / "mixed.jsonl"
    lines = [good[0],                                    # 1 ok
             b'{"text": "caf\xe9 at night", "targets": ["x"]}',  # 2 Latin-1, not UTF-8
             b"{not json",                               # 3
             b"[" * 10_000 + b"]" * 10_000,              # 4 nested too deeply
             b'{"text": "red", "targets": ["nope.jpg"]}',  # 5 not in the index
             b'{"text": "' + b"x" * 1_200_000 + b'"}',   # 6 longer than the line limit
             good[1], b"", good[2]]                      # 7 ok, 8 blank, 9 ok
    q.write_bytes(b"\n".join(lines) + b"\n")
    r = hb.run_triplets_once(index_dir, q)
    assert r["rc"] == 0, r["stderr"][-2000:]
    res = json.loads(r["stdout"])
    assert res["queries"] == 3 and res["skipped_lines"] == 5
    err = r["stderr"]
    for n, words in ((2, "not UTF-8"), (3, "not valid JSON"), (4, "nested too deeply"), (5, "not in the index"),
                     (6, "longer than")):
        line = next((ln for ln in err.splitlines() if f"mixed.jsonl line {n}" in ln), "")
        assert words in line, (n, err[-3000:])
    assert "5 of 9 lines skipped" in err
    assert "Traceback" not in err


def test_unreadable_and_missing_files_are_one_sentence(index_dir, tmp_path):
    folder = tmp_path / "a-folder.jsonl"
    folder.mkdir()
    for path, words in ((folder, "cannot be read"), (tmp_path / "missing.jsonl", "does not exist")):
        r = hb.run_triplets_once(index_dir, path)
        assert r["rc"] == 1, r
        errors = [ln for ln in r["stderr"].splitlines() if ln.startswith("error:")]
        assert len(errors) == 1 and words in errors[0], r["stderr"][-2000:]
        assert "Traceback" not in r["stderr"]
    empty = tmp_path / "only-bad.jsonl"
    empty.write_bytes(b"\xff\xfe\n{oops\n")
    r = hb.run_triplets_once(index_dir, empty)
    assert r["rc"] == 1 and "holds no valid queries" in r["stderr"] and "Traceback" not in r["stderr"]
