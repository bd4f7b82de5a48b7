"""The one checkpoint layer: naming, search path order, tie rule, shipped checkpoints found."""
import json
import os

import numpy as np
import pytest

from engine import checkpoints as ck
from engine.config import ASSETS, Settings


def _write(path, record):
    """A stand-in checkpoint: a small valid safetensors file (the layer passes over damaged or non-finite
    weights, issue #27) whose record the reader below returns."""
    import torch
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.ones(2)}, str(path))
    path.with_suffix(".json").write_text(json.dumps(record))


def _read(path):
    return json.loads(path.with_suffix(".json").read_text())


def test_names_follow_part_slug_variant():
    assert ck.slug("packaged:efficientnet-lite0+all-MiniLM-L6-v2@7c0e") == "packaged-efficientnet-lite0-all-minilm-l6-v2"
    assert ck.file_name("rtic", "open_clip:ViT-B-32@abc") == "rtic-open-clip-vit-b-32.safetensors"
    assert ck.file_name("ics-64", "tiny:a@1", "gcn") == "ics-64-tiny-a-gcn.safetensors"


def test_search_path_order_settings_then_cache_then_bundled(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))
    s = Settings(checkpoints_given=os.pathsep.join([str(a), str(b)]), prepared_dir="")  # CIS_CHECKPOINTS=a:b
    dirs = ck.search_dirs(settings=s)
    assert dirs == [a, b, tmp_path / "cache" / "checkpoints", ASSETS / "checkpoints"]
    # an explicit folder replaces the settings' one; the bundled folder is listed once
    assert ck.search_dirs(str(ASSETS / "checkpoints"), s) == [ASSETS / "checkpoints", tmp_path / "cache" / "checkpoints"]
    # without the caller's Settings nothing is read again: the default prepared folder, then the bundled one
    assert ck.search_dirs() == [tmp_path / "cache" / "checkpoints", ASSETS / "checkpoints"]
    # what the engine hands a loader: the settings' whole path (CIS_CHECKPOINTS, else the bundled folder, first)
    s.checkpoints, s.prepared_dir = str(a), str(tmp_path / "prepared")
    assert ck.search_path(s) == os.pathsep.join(map(str, [a, tmp_path / "prepared", ASSETS / "checkpoints"]))
    assert ck.search_dirs(ck.search_path(s))[:3] == [a, tmp_path / "prepared", ASSETS / "checkpoints"]


def test_resolution_order_and_tie_rule(tmp_path, monkeypatch):
    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))
    a, b = tmp_path / "a", tmp_path / "b"
    cache = tmp_path / "cache" / "checkpoints"
    _write(cache / "part-bb.safetensors", {"fp": "bb@1", "variant": "main"})
    _write(b / "part-bb.safetensors", {"fp": "bb@1", "variant": "main"})
    _write(b / "part-bb-alt.safetensors", {"fp": "bb@1", "variant": "alt"})
    _write(a / "part-zz.safetensors", {"fp": "bb@1", "variant": "alt"})
    _write(a / "part-other.safetensors", {"fp": "other@1", "variant": "main"})
    _write(a / "part-aa.safetensors", {"fp": "bb@1", "variant": "alt"})
    (a / "part-bad.safetensors").write_bytes(b"x")  # unreadable record: passed over
    (a / "part-bad.json").write_text("{")
    rank = {"main": 0, "alt": 1}

    def read(p):
        try:
            return _read(p)
        except ValueError:
            raise ck.CheckpointError("bad") from None

    # make the newest file the worst by the rule: mtime must not matter
    os.utime(cache / "part-bb.safetensors", (4e9, 4e9))
    found = ck.resolve("part-*.safetensors", read, "bb@1", os.pathsep.join([str(a), str(b)]), fingerprint_key="fp",
                       variant_rank=lambda r: rank[r["variant"]])
    names = [(p.parent.name, p.name) for p, _ in found]
    assert names == [("a", "part-aa.safetensors"), ("a", "part-zz.safetensors"),  # first folder, then name
                     ("b", "part-bb.safetensors"), ("b", "part-bb-alt.safetensors"),  # variant before name
                     ("checkpoints", "part-bb.safetensors")]  # the cache after CIS_CHECKPOINTS
    assert ck.resolve("part-*.safetensors", read, "none@0", str(a), fingerprint_key="fp") == []


def test_shipped_packaged_checkpoints_are_found(tmp_path, monkeypatch):
    """Every shipped learned part resolves for the packaged backbone's fingerprint through the layer."""
    from engine.compose.rtic import find_rtic
    from engine.expand.lattqe import find_checkpoints as find_lattqe
    from engine.index.ics_index import available_ics_types, find_ics_checkpoints, make_ics_index

    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))  # no CIS_CHECKPOINTS: the loaders read no Settings
    fp = ck.read_record(ASSETS / "checkpoints" / "ics-64-packaged-efficientnet-lite0-all-minilm-l6-v2.safetensors")[
        "backbone_fingerprint"]
    dim = 512  # the packaged backbone's visual-channel version: 384 bridge + 128 visual
    assert [p.name for p, _ in ck.find("context-i2w", fp)] == ["context_i2w-packaged-efficientnet-lite0-all-minilm-l6-v2.safetensors"]
    assert [p.name for p, _ in find_rtic(fp)] == ["rtic-packaged-efficientnet-lite0-all-minilm-l6-v2.safetensors",
                                                         "rtic-gcn-packaged-efficientnet-lite0-all-minilm-l6-v2.safetensors"]
    assert [p.name for p, _ in find_lattqe(None, fp, dim)] == ["lattqe-packaged-efficientnet-lite0-all-minilm-l6-v2.safetensors"]
    assert available_ics_types(None, fp, dim) == ["ics-16", "ics-32", "ics-64", "ics-128"]
    assert available_ics_types(None, "tiny:x@0", dim) == []
    (path, _), = find_ics_checkpoints(64, None, fp, dim)
    assert path.name == "ics-64-packaged-efficientnet-lite0-all-minilm-l6-v2.safetensors"
    idx = make_ics_index(64, dim, 3, fingerprint=fp)
    x = np.random.default_rng(0).normal(size=(3, dim)).astype(np.float32)
    idx.build(x / np.linalg.norm(x, axis=1, keepdims=True))
    assert idx.search(x[:1], 1)[1][0, 0] == 0
    with pytest.raises(ck.CheckpointError, match="ics-64-packaged"):
        make_ics_index(64, dim, 3, fingerprint="tiny:x@0")
