"""The one record format (engine.checkpoints.make_record / write / find / load): every shipped checkpoint loads
through the one loader, files of the retired format 1 are refused with the command that retrains them, and
misfits are refused with a message that names the file and says what to do."""
import json
import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from engine import checkpoints as ck
from engine.config import ASSETS, ROOT, Settings
from engine.errors import CheckpointError


@pytest.fixture
def search(tmp_path, monkeypatch):
    """A search path of one empty folder (no cache, no bundled files interfere with names): the folder; its
    Settings (CIS_CHECKPOINTS = the folder, an empty prepared folder) come from :func:`_in`."""
    monkeypatch.setenv("CIS_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "ck").mkdir()
    return tmp_path / "ck"


def _in(search) -> Settings:
    """The Settings an entry point would pass to search ``search`` first, with an empty prepared folder."""
    return Settings(checkpoints=str(search), checkpoints_given=str(search), prepared_dir=str(search.parent / "prepared"))


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
    (hit, record), = ck.find("lattqe", "bb@1", dim=4, settings=_in(search))
    assert hit == path and record["recipe"] == {"lr": 0.1} and record["val_map"] == 0.5 and record["format"] == 2
    assert ck.find("lattqe", "bb@1", dim=8, settings=_in(search)) == [] and ck.find("lattqe", "other@2", settings=_in(search)) == []
    got = ck.load("lattqe", fingerprint="bb@1", dim=4, settings=_in(search))
    assert torch.equal(got.tensors["w"], torch.ones(2, 4))
    with pytest.raises(CheckpointError, match="lattqe-bb.safetensors was trained for backbone"):
        ck.load("lattqe", path, fingerprint="other@2")
    with pytest.raises(CheckpointError, match="expects 4-d embeddings"):
        ck.load("lattqe", path, dim=8)
    with pytest.raises(CheckpointError, match="holds a lattqe checkpoint, not ics"):
        ck.load("ics", path)
    with pytest.raises(CheckpointError, match=r"no ICS checkpoint .* make one with `python -m engine train ics --bits 16`"):
        ck.load("ics", fingerprint="bb@1", bits=16, settings=_in(search))
    with pytest.raises(ValueError, match="fields of the record"):
        ck.make_record("lattqe", "bb@1", {}, part="ics")
    path.write_bytes(path.read_bytes()[:64])
    with pytest.raises(CheckpointError, match="lattqe-bb.safetensors is not a readable checkpoint"):
        ck.load("lattqe", path)


def test_shipped_rtic_files_load_their_exact_weights_and_anchor():
    """The bundled RTIC and RTIC+GCN files (the record format) load through load_rtic: every weight is the stored
    tensor, the anchor's banks, router and ramps come with them, and the tie rule puts plain RTIC first."""
    from safetensors.torch import load_file

    from engine.compose.anchor import PREFIX, load_anchor
    from engine.compose.rtic import find_rtic, load_rtic

    files = sorted((ASSETS / "checkpoints").glob("rtic*.safetensors"))
    assert [p.name.split("-")[1] for p in files] == ["gcn", "packaged"]
    for path in files:
        raw = load_file(str(path))
        model, record = load_rtic(path, ck.read_record(path)["backbone_fingerprint"])
        assert record["format"] == ck.RECORD_FORMAT and record["part"] == ("rtic+gcn" if "-gcn-" in path.name else "rtic")
        state = model.state_dict()
        assert set(state) == {k for k in raw if not k.startswith(PREFIX)}
        assert all(torch.equal(state[k], raw[k]) for k in state) and not model.training
        anchor = load_anchor(path, record)
        assert torch.equal(anchor.text_bank, torch.nn.functional.normalize(raw[PREFIX + "text_bank"].float(), dim=-1))
        assert anchor.config.to_dict() == record["anchor"]
    fp = ck.read_record(files[0])["backbone_fingerprint"]
    shipped = [r["part"] for p, r in find_rtic(fp, str(ASSETS / "checkpoints")) if p.parent == ASSETS / "checkpoints"]
    assert shipped == ["rtic", "rtic+gcn"]


def test_an_anchored_rtic_file_saved_again_keeps_weights_anchor_and_figures(search):
    """What engine.train.anchor_fit does with an RTIC file: the loaded record goes back in as ``extra`` with a
    new anchor; a format-1 file comes out in the record format, with the same weights and figures."""
    import shutil

    from engine.compose.anchor import Anchor, AnchorConfig, load_anchor
    from engine.compose.rtic import load_rtic, save_rtic

    shipped = next((ASSETS / "checkpoints").glob("rtic-gcn-*.safetensors"))
    path = search / shipped.name
    shutil.copy(shipped, path)
    model, record = load_rtic(path)
    bank = torch.nn.functional.normalize(torch.randn(3, model.config.dim), dim=-1)
    anchor = Anchor(AnchorConfig(weight=0.5), text_bank=bank, image_bank=bank)
    extra = {k: v for k, v in record.items() if k not in ("kind", "format_version", "config", "backbone_fingerprint",
                                                          "backbone_name", "file", "anchor", "anchor_fit")}
    save_rtic(path, model, record["backbone_fingerprint"], record["backbone_name"], extra, anchor, variant="rtic+gcn")
    again, new = load_rtic(path, record["backbone_fingerprint"])
    assert new["format"] == ck.RECORD_FORMAT and new["part"] == "rtic+gcn" and new["recipe"] == record["recipe"]
    assert all(new[k] == record[k] for k in ("held_out", "history", "graph", "eval_split", "config"))
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))
    back = load_anchor(path, new)
    assert back.config == anchor.config and torch.allclose(back.text_bank, bank)


def test_rtic_saves_and_loads_through_the_layer_and_refuses_format_1_files(search, caplog):
    """RTIC writes the record format (make_record + write) and loads it through ck.load; a file of the retired
    format 1 (the record only under the "rtic" metadata key) is refused with the command that retrains it, and
    the search passes it over in one log line."""
    from engine.compose.rtic import RTIC, RTICConfig, find_rtic, load_rtic, save_rtic

    torch.manual_seed(0)
    model = RTIC(RTICConfig(dim=4, n_blocks=1)).eval()
    path = save_rtic(search / "rtic-gcn-bb.safetensors", model, "bb@1", "bb", {"train_config": {"epochs": 1},
                     "held_out": {"R@10": 1.0}}, variant="rtic+gcn")
    rec = ck.read_record(path)
    assert rec["format"] == ck.RECORD_FORMAT and rec["part"] == "rtic+gcn" and rec["recipe"] == {"epochs": 1}
    assert rec["held_out"] == {"R@10": 1.0} and json.loads(path.with_suffix(".json").read_text())["part"] == "rtic+gcn"
    old_record = {"kind": "rtic", "format_version": 1, "config": {"dim": 4, "n_blocks": 1, "negative_slope": 0.01},
                  "backbone_fingerprint": "bb@1", "backbone_name": "bb", "variant": "rtic", "train_config": {"epochs": 2}}
    plain = search / "rtic-bb.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(plain),
              metadata={"rtic": json.dumps(old_record)})
    refusal = "rtic-bb.safetensors is an older checkpoint format; retrain it with `python -m engine train rtic --data cir`"
    with pytest.raises(CheckpointError, match=re.escape(refusal)):
        ck.read_record(plain)
    with pytest.raises(CheckpointError, match=re.escape(refusal)):
        load_rtic(plain, "bb@1")
    assert [p for p, _ in ck.find("rtic", "bb@1", settings=_in(search))] == [path] == [p for p, _ in find_rtic("bb@1", str(search))]
    assert refusal in caplog.text
    with pytest.raises(CheckpointError, match="rtic-gcn-bb.safetensors was trained for backbone 'bb@1'"):
        load_rtic(path, "other@1")


def _old_lattqe(folder):
    """A LAttQE file of format 1: kind/fingerprint/config metadata, the record in the JSON sidecar."""
    from dataclasses import asdict

    from engine.expand.lattqe import LAttQEConfig, LAttQEModel

    cfg = LAttQEConfig(dim=8, layers=1, heads=1)
    model = LAttQEModel(cfg)
    path = folder / "lattqe-old.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path),
              metadata={"kind": "lattqe", "fingerprint": "bb@1", "config": json.dumps(asdict(cfg))})
    path.with_suffix(".json").write_text(json.dumps({"kind": "lattqe", "fingerprint": "bb@1", "embed_dim": 8,
                                                     "config": asdict(cfg), "weights": path.name,
                                                     "train": {"epochs": 3}, "val_map": 0.3}))
    return path


def test_old_lattqe_file_is_refused_with_the_command_that_retrains_it(search):
    from engine.expand.lattqe import load_lattqe

    path = _old_lattqe(search)
    before = path.read_bytes()
    refusal = "lattqe-old.safetensors is an older checkpoint format; retrain it with `python -m engine train lattqe`"
    with pytest.raises(CheckpointError, match=re.escape(refusal)):
        load_lattqe(path, fingerprint="bb@1")
    out = subprocess.run([sys.executable, "-m", "engine.checkpoints", "show", str(path)], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.strip() == refusal and "Traceback" not in out.stderr
    assert path.read_bytes() == before  # refused, not rewritten
    out = subprocess.run([sys.executable, "-m", "engine.checkpoints", "convert", "lattqe", str(path)], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 2 and "invalid choice: 'convert'" in out.stderr  # the converter is gone


def test_old_ics_file_is_refused_and_an_itq_era_record_too(search):
    from dataclasses import asdict

    from engine.index.ics import HashHead, ICSConfig, load_ics

    cfg = ICSConfig(dim=8, bits=16, hidden=8)
    head = HashHead(8, 16, 8, 0.0)
    state = {f"head.{k}": v.contiguous() for k, v in head.state_dict().items()}
    state["centres"] = torch.ones(3, 16)
    path = search / "ics-16-bb.safetensors"
    save_file(state, str(path), metadata={"kind": "ics", "fingerprint": "bb@1", "config": json.dumps(asdict(cfg))})
    with pytest.raises(CheckpointError, match=re.escape(
            "ics-16-bb.safetensors is an older checkpoint format; retrain it with `python -m engine train ics --bits 16`")):
        load_ics(path, fingerprint="bb@1", dim=8)
    assert ck.find("ics", "bb@1", dim=8, bits=16, settings=_in(search)) == []
    ck.write(path, state, ck.make_record("ics", "bb@1", asdict(cfg)))
    assert load_ics(path, fingerprint="bb@1", dim=8).bits == 16
    assert [p for p, _ in ck.find("ics", "bb@1", dim=8, bits=16, settings=_in(search))] == [path]
    ck.write(path, state, ck.make_record("ics", "bb@1", {**asdict(cfg), "locality_bits": 8}))
    with pytest.raises(CheckpointError, match="older version that appended ITQ bits; retrain it"):
        load_ics(path)


def test_inventory_lists_each_shipped_file_once_under_its_own_part(search):  # an empty CIS_CHECKPOINTS + prepared
    listed = [(name, entry.split(" (")[0].split("/")[-1]) for name, entries in ck.inventory(settings=_in(search)).items()
              for entry in entries]
    files = sorted(p.name for p in (ASSETS / "checkpoints").glob("*.safetensors"))
    assert sorted(f for _, f in listed) == files  # every file once: RTIC+GCN's not also under RTIC
    for name, f in listed:
        assert ck.read_record(ASSETS / "checkpoints" / f)["part"] == name
