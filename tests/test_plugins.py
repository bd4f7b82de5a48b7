"""Report sections are registered functions; `bench --only X` and `eval offline --only X` rewrite X (with its
own date line) and keep the other sections."""
import pytest

from engine.reports import merge_sections


def test_offline_sections_are_registered_functions():
    from engine.eval import concepts, expansion, generalise
    from engine.eval.offline import OFFLINE_SECTIONS

    assert list(OFFLINE_SECTIONS) == ["query-expansion", "backbone-versions", "generalise", "edits-seen", "gallery-queries"]
    assert OFFLINE_SECTIONS.get("query-expansion") is expansion.offline_section
    assert OFFLINE_SECTIONS.get("backbone-versions") is concepts.offline_section
    assert OFFLINE_SECTIONS.get("generalise") is generalise.offline_section


def test_only_rewrites_its_own_section_header():
    old = ("# Benchmarks\n\nhead\n\n## query\n\n_Measured 2020-01-01 on old box._\n\nq old\n\n"
           "## ann\n\n_Measured 2020-01-01 on old box._\n\na old\n\n")
    new = merge_sections(old, ["## ann\n\n_Measured 2026-12-01 on new box._\n\na new"])
    assert "_Measured 2026-12-01 on new box._\n\na new" in new and "a old" not in new
    assert "## query\n\n_Measured 2020-01-01 on old box._\n\nq old" in new


def test_merge_keeps_head_and_order_and_appends_new_sections():
    old = "# Results\n\nhead text\n\n## a\n\na old\n\n## b\n\nb old\n"
    new = merge_sections(old, ["## a\n\na new", "## c\n\nc new"])
    assert new == "# Results\n\nhead text\n\n## a\n\na new\n\n## b\n\nb old\n\n## c\n\nc new\n"


def test_eval_offline_only_keeps_the_other_sections(tmp_path, monkeypatch):
    """`eval offline --only X` re-measures X and leaves the composed-retrieval tables (and the head) alone."""
    from engine.eval import offline

    monkeypatch.setitem(offline.OFFLINE_SECTIONS._items, "fake", lambda args, ctx: ("fresh table", {"x": 1}))
    monkeypatch.setattr(offline, "create_backbone", lambda spec, device, settings=None: object())
    out = tmp_path / "RESULTS.md"
    out.write_text("# Results\n\nold head\n\n## Composed retrieval (packaged)\n\n| rtic | 70.9 |\n\n"
                   "## fake\n\nstale table\n")
    assert offline.main(["--backbone", "stub", "--only", "fake", "--out", str(out)]) == 0
    text = out.read_text()
    assert "old head" in text and "## Composed retrieval (packaged)\n\n| rtic | 70.9 |" in text
    assert "fresh table" in text and "stale table" not in text
    assert text.index("## Composed retrieval") < text.index("## fake")
    with pytest.raises(SystemExit):
        offline.main(["--only", "nope", "--out", str(out)])


def test_atomic_writes_are_safe_under_concurrent_writers(tmp_path):
    """Eight threads write the same file 25 times each: every read sees one whole payload, no temporary
    file is left behind (unique temp names; a fixed name would be renamed away under another writer)."""
    import threading

    import torch

    from engine.fileio import atomic_path, atomic_write_bytes

    target = tmp_path / "shared.bin"
    payloads = [bytes([i]) * 200_000 for i in range(8)]
    errors = []

    def writer(i):
        try:
            for n in range(25):
                if n % 2:
                    atomic_write_bytes(target, payloads[i])
                else:
                    with atomic_path(target) as tmp:  # the path-based writers (torch.save, save_file)
                        tmp.write_bytes(payloads[i])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    seen = set()
    while any(t.is_alive() for t in threads):
        if target.exists():
            data = target.read_bytes()
            assert data in payloads  # never a torn or mixed file
            seen.add(data[0])
    for t in threads:
        t.join()
    assert not errors, errors
    assert target.read_bytes() in payloads
    assert [p.name for p in tmp_path.iterdir()] == ["shared.bin"]
    # a failing writer leaves the old file and no temporary file
    before = target.read_bytes()
    try:
        with atomic_path(target) as tmp:
            torch.save({"x": 1}, tmp)
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert target.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["shared.bin"]
