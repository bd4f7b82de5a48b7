"""The one record format (engine.checkpoints.make_record / write / find / load / convert): every shipped
checkpoint loads through the one loader, files of the older formats load or convert, and misfits are refused
with a message that names the file and says what to do."""
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from engine import checkpoints as ck
from engine.config import ASSETS, ROOT
from engine.errors import CheckpointError


@pytest.fixture
def search(tmp_path, monkeypatch):
    """A search path of one empty folder (no cache, no bundled files interfere with names)."""
    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CIS_PREPARED_DIR", str(tmp_path / "prepared"))
    (tmp_path / "ck").mkdir()
    monkeypatch.setenv("CIS_CHECKPOINTS", str(tmp_path / "ck"))
    return tmp_path / "ck"


def test_every_shipped_checkpoint_loads_through_the_one_loader():
    files = sorted((ASSETS / "checkpoints").glob("*.safetensors"))
    assert len(files) >= 8
    parts = set()
    for path in files:
        record = ck.read_record(path)
        loaded = ck.load(record["part"], path, fingerprint=record["backbone_fingerprint"])
        assert loaded.tensors and loaded.record["config"] and loaded.record["file"] == path.name
        parts.add(record["part"])
    assert parts == set(ck.PARTS)


def test_record_roundtrip_find_and_refusals(search):
    rec = ck.make_record("lattqe", "bb@1", {"dim": 4}, recipe={"lr": 0.1},
                         validation={"split": "val", "metric": "mAP", "scores": {"lattqe": 0.5, "none": 0.4}},
                         backbone_name="bb", val_map=0.5)
    path = ck.write(search / "lattqe-bb", {"w": torch.ones(2, 4)}, rec)
    assert path.name == "lattqe-bb.safetensors" and json.loads(path.with_suffix(".json").read_text())["part"] == "lattqe"
    assert not [p for p in search.iterdir() if p.name.startswith(".")]  # no temporary file left
    (hit, record), = ck.find("lattqe", "bb@1", dim=4)
    assert hit == path and record["recipe"] == {"lr": 0.1} and record["val_map"] == 0.5 and record["format"] == 2
    assert ck.find("lattqe", "bb@1", dim=8) == [] and ck.find("lattqe", "other@2") == []
    got = ck.load("lattqe", fingerprint="bb@1", dim=4)
    assert torch.equal(got.tensors["w"], torch.ones(2, 4))
    with pytest.raises(CheckpointError, match="lattqe-bb.safetensors was trained for backbone"):
        ck.load("lattqe", path, fingerprint="other@2")
    with pytest.raises(CheckpointError, match="expects 4-d embeddings"):
        ck.load("lattqe", path, dim=8)
    with pytest.raises(CheckpointError, match="holds a lattqe checkpoint, not ics"):
        ck.load("ics", path)
    with pytest.raises(CheckpointError, match=r"no ICS checkpoint .* make one with `python -m engine train ics --bits 16`"):
        ck.load("ics", fingerprint="bb@1", bits=16)
    with pytest.raises(ValueError, match="fields of the record"):
        ck.make_record("lattqe", "bb@1", {}, part="ics")
    path.write_bytes(path.read_bytes()[:64])
    with pytest.raises(CheckpointError, match="lattqe-bb.safetensors is not a readable checkpoint"):
        ck.load("lattqe", path)


def test_rtic_records_keep_their_format_1_key_readable(search):
    """Until RTIC's own loader moves to the record format, a file written by the layer carries both keys."""
    from engine.compose.rtic import read_checkpoint_record

    rec = ck.make_record("rtic+gcn", "bb@1", {"dim": 4})
    path = ck.write(search / "rtic-gcn-bb", {"w": torch.zeros(1)}, rec)
    old = read_checkpoint_record(path)
    assert old["kind"] == "rtic" and old["variant"] == "rtic+gcn" and old["backbone_fingerprint"] == "bb@1"
    plain = ck.write(search / "rtic-bb", {"w": torch.zeros(1)}, ck.make_record("rtic", "bb@1", {"dim": 4}))
    assert [p for p, _ in ck.find("rtic", "bb@1")] == [plain, path]  # the family, plain RTIC first


def _old_lattqe(folder):
    """A LAttQE file of format 1: kind/fingerprint/config metadata, the record in the JSON sidecar."""
    from engine.expand.lattqe import LAttQEConfig, LAttQEModel

    cfg = LAttQEConfig(dim=8, layers=1, heads=1)
    model = LAttQEModel(cfg)
    path = folder / "lattqe-old.safetensors"
    from dataclasses import asdict

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path),
              metadata={"kind": "lattqe", "fingerprint": "bb@1", "config": json.dumps(asdict(cfg))})
    path.with_suffix(".json").write_text(json.dumps({"kind": "lattqe", "fingerprint": "bb@1", "embed_dim": 8,
                                                     "config": asdict(cfg), "weights": path.name,
                                                     "train": {"epochs": 3}, "val_map": 0.3}))
    return path, model


def test_old_lattqe_file_loads_and_converts(search):
    from engine.expand.lattqe import load_lattqe

    path, model = _old_lattqe(search)
    record = ck.read_record(path)
    assert record["format"] == 1 and record["part"] == "lattqe" and record["recipe"] == {"epochs": 3}
    loaded, _ = load_lattqe(path, fingerprint="bb@1")
    out = subprocess.run([sys.executable, "-m", "engine.checkpoints", "convert", "lattqe", str(path)], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    new = ck.read_record(path)
    assert new["format"] == 2 and new["backbone_fingerprint"] == "bb@1" and new["val_map"] == 0.3
    again, _ = load_lattqe(path, fingerprint="bb@1")
    for a, b in zip(loaded.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)
    # an old LAttQE file without its sidecar cannot be read: the message says which file
    (search / "sub").mkdir()
    path2, _ = _old_lattqe(search / "sub")
    path2.with_suffix(".json").unlink()
    with pytest.raises(CheckpointError, match="lattqe-old.safetensors is not a readable checkpoint.*sidecar"):
        ck.read_record(path2)


def test_old_ics_file_loads_and_an_itq_era_file_is_refused(search):
    from dataclasses import asdict

    from engine.index.ics import ICSConfig, load_ics

    cfg = ICSConfig(dim=8, bits=16, hidden=8)
    from engine.index.ics import HashHead

    head = HashHead(8, 16, 8, 0.0)
    state = {f"head.{k}": v.contiguous() for k, v in head.state_dict().items()}
    state["centres"] = torch.ones(3, 16)
    path = search / "ics-16-bb.safetensors"
    save_file(state, str(path), metadata={"kind": "ics", "fingerprint": "bb@1", "config": json.dumps(asdict(cfg))})
    model = load_ics(path, fingerprint="bb@1", dim=8)
    assert model.bits == 16 and model.record["format"] == 1
    assert [p for p, _ in ck.find("ics", "bb@1", dim=8, bits=16)] == [path]
    old = {**asdict(cfg), "locality_bits": 8}
    save_file(state, str(path), metadata={"kind": "ics", "fingerprint": "bb@1", "config": json.dumps(old)})
    with pytest.raises(CheckpointError, match="older version that appended ITQ bits; retrain it"):
        load_ics(path)
