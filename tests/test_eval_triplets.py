"""`engine eval triplets`: metrics against ranks worked out by hand, the query file's checks, the CLI."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.errors import InputError
from engine.eval.triplets import evaluate_triplets, main, read_queries, triplet_metrics


def test_metrics_against_hand_computed_ranks():
    scores = np.array([
        [0.9, 0.8, 0.7, 0.6, 0.5],    # ref 0 excluded -> order 1,2,3,4; targets {2,4} at positions 2 and 4
        [0.1, 0.5, 0.5, 0.2, 0.3],    # ref 3; 1 and 2 tie -> gallery order puts 1 first; target 2 at position 2
        [0.95, 0.1, 0.2, 0.3, 0.4],   # ref 0 would be first; excluded -> target 4 at position 1
        [1.0, 0.0, 0.0, 0.0, 0.0],    # the only target is the reference itself: unfindable, a miss
    ])
    pos = np.zeros((4, 5), bool)
    pos[0, [2, 4]] = pos[1, 2] = pos[2, 4] = pos[3, 0] = True
    excl = np.zeros((4, 5), bool)
    excl[0, 0] = excl[1, 3] = excl[2, 0] = excl[3, 0] = True
    m = triplet_metrics(scores, pos, excl)
    # first-hit 0-based ranks: 1, 1, 0, inf
    assert m["R@1"] == pytest.approx(25.0)
    assert m["R@5"] == pytest.approx(75.0) and m["R@10"] == pytest.approx(75.0)
    # AP@10 = (1/min(10,|T|)) sum P@i rel(i): q0 (1/2 + 2/4)/2 = 0.5; q1 1/2; q2 1; q3 0 -> mean 0.5
    assert m["mAP@10"] == pytest.approx(50.0)


@pytest.fixture()
def tiny_index(small_gallery, tmp_path, tiny):
    from engine.config import Settings
    from engine.index.pipeline import build_index
    from engine.search import open_engine

    build_index(small_gallery, tmp_path / "idx", tiny, workers=0)
    s = Settings()
    s.checkpoints = str(tmp_path / "no-checkpoints")
    return tmp_path / "idx", open_engine(tmp_path / "idx", backbone=tiny, settings=s)


def test_engine_ranks_against_hand_computed(tiny_index, tmp_path, monkeypatch):
    _, engine = tiny_index
    n, d = len(engine.index), engine.backbone.embed_dim
    assert n == 8
    emb = np.zeros((n, d), np.float32)
    emb[np.arange(n), np.arange(n)] = 1.0  # item i = axis i, so the score of item i is the query's i-th weight
    engine.index.embeddings = emb.astype(np.float16)
    w = torch.zeros(d)
    w[:8] = torch.tensor([0.9, 0.1, 0.5, 0.3, 0.0, 0.2, 0.4, 0.05])
    monkeypatch.setattr(engine, "reference_features", lambda image: ("h", w, torch.zeros(2, 4), False))
    paths = [it["path"] for it in engine.index.items]
    qf = tmp_path / "q.jsonl"
    qf.write_text(json.dumps({"reference": "gallery:0", "targets": [paths[2], paths[3]]}) + "\n\n"
                  + json.dumps({"reference": "gallery:0", "text": "x", "targets": [paths[1]]}) + "\n")
    res = evaluate_triplets(engine, read_queries(qf, engine.index), methods=["image"], expansions=["none"])
    m = res["methods"]["image"]["none"]
    # without item 0: 2 (.5), 6 (.4), 3 (.3), 5 (.2), 1 (.1), 7, 4
    # q0: targets at positions 1 and 3 -> rank 0, AP (1 + 2/3)/2; q1: target 1 at position 5 -> rank 4, AP 1/5
    assert m["R@1"] == pytest.approx(50.0) and m["R@5"] == pytest.approx(100.0)
    assert m["mAP@10"] == pytest.approx(100 * ((1 + 2 / 3) / 2 + 0.2) / 2, abs=1e-6)


def test_query_file_errors_are_one_sentence(tiny_index, tmp_path):
    _, engine = tiny_index
    qf = tmp_path / "q.jsonl"
    for line, msg in (("{not json", "not valid JSON"), ('{"reference": "gallery:99", "targets": ["a"]}', "does not exist"),
                      ('{"text": "red", "targets": ["nope.jpg"]}', "not in the index"),
                      ('{"targets": ["a"]}', "neither a reference nor a text"),
                      ('{"text": "red", "targets": []}', "non-empty list")):
        qf.write_text(line + "\n")
        with pytest.raises(InputError, match=msg):
            read_queries(qf, engine.index)


def test_cli_json_excludes_the_reference(tiny_index, tmp_path, capsys):
    idx_dir, engine = tiny_index
    paths = [it["path"] for it in engine.index.items]
    qf = tmp_path / "q.jsonl"
    # reference given as a file inside the gallery and as gallery:ID; each query's only target is the
    # reference itself, so with the reference excluded nothing can be found
    qf.write_text(json.dumps({"reference": str(engine.index.image_path(1)), "text": "red",
                                  "targets": [paths[1]]}) + "\n"
                  + json.dumps({"reference": "gallery:2", "text": "a photo", "targets": [paths[2]]}) + "\n")
    assert main(["--index", str(idx_dir), "--queries", str(qf), "--checkpoints", str(tmp_path / "none"),
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["queries"] == 2 and res["gallery"] == 8
    assert {"image", "text", "sum"} <= set(res["methods"])
    for per in res["methods"].values():
        assert "none" in per
        for met in per.values():
            assert met["R@10"] == 0.0 and met["mAP@10"] == 0.0
    assert main(["--index", str(idx_dir), "--queries", str(tmp_path / "missing.jsonl")]) == 1
    assert "does not exist" in capsys.readouterr().err
