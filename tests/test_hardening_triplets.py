"""Issue #35, part 5: ``eval triplets`` skips a line whose reference cannot be read or escapes the gallery
folder (naming the line) and goes on; each distinct reference is decoded and encoded once per run."""
import json

import pytest

from engine.eval import triplets as tr


@pytest.fixture()
def queries(gallery_index_dir, tmp_path):
    from engine.index.store import GalleryIndex

    items = GalleryIndex.load(gallery_index_dir, build_vectors=False).items
    (tmp_path / "broken.jpg").write_bytes(b"this is not an image")
    lines = [{"reference": items[0]["path"], "text": "at night", "targets": [items[5]["path"]]},
             {"reference": "../../../../../../../../etc/passwd", "text": "red", "targets": [items[5]["path"]]},
             {"reference": "broken.jpg", "text": "red", "targets": [items[5]["path"]]},
             {"reference": "gallery:3", "text": "in red", "targets": [items[7]["path"]]}]
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return q


def test_unreadable_and_escaping_references_are_skipped_by_line(gallery_index_dir, queries, capsys, monkeypatch):
    monkeypatch.setenv("CIS_BACKBONE", "packaged")
    monkeypatch.setenv("CIS_DEVICE", "cpu")
    rc = tr.main(["--index", str(gallery_index_dir), "--queries", str(queries), "--methods", "image",
                  "--expansions", "none", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err[-2000:]
    res = json.loads(out)
    assert res["queries"] == 2 and res["skipped_lines"] == 2
    lines = err.splitlines()
    assert any("q.jsonl line 2" in ln and "outside the gallery folder" in ln for ln in lines), err[-2000:]
    assert any("q.jsonl line 3" in ln and "broken.jpg" in ln for ln in lines), err[-2000:]
    assert "Traceback" not in err


def test_each_distinct_reference_is_encoded_once_per_run(gallery_engine, monkeypatch):
    from engine.search import FeatureCache

    monkeypatch.setattr(gallery_engine, "cache", FeatureCache(capacity=8))  # smaller than the run's references
    calls = []
    real = gallery_engine.backbone.encode_images_with_tokens

    def counted(pixels):
        calls.append(int(pixels.shape[0]))  # images encoded (several per forward pass)
        return real(pixels)

    monkeypatch.setattr(gallery_engine.backbone, "encode_images_with_tokens", counted)
    distinct = 12  # more than the engine's cache: a cycle over them missed on every line before
    stream = (tr.Triplet(i + 1, i % distinct, "at night", [(i * 7) % len(gallery_engine.index)])
              for i in range(2 * distinct))
    res = tr.evaluate_triplets(gallery_engine, stream, methods=["image"], expansions=["none"])
    assert res["queries"] == 2 * distinct
    assert sum(calls) == distinct
    assert len(calls) < distinct  # in batches, not one forward pass per reference


def test_a_bad_gallery_id_on_the_command_line_is_one_sentence(capsys):
    from engine.cli import main

    rc = main(["search", "--index", "gallery", "--image", "gallery:../../etc/passwd", "--text", "red"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.strip().splitlines() == ["error: bad gallery image 'gallery:../../etc/passwd'; expected gallery:ID"]
