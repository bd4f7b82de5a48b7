"""One spec per learned part (engine.checkpoints.PARTS): a new learned composer is its runtime module, its
trainer and one spec. This test adds a toy part exactly that way (two modules written here and one entry put
in the table, the three files of docs/architecture.md's recipe) and checks that everything that lists the
learned parts takes it: `python -m engine train`, `python -m engine prepare`, the background status line, the
composer registry, the loader's "train one with" sentence and the checkpoint layer."""
import sys
from importlib import import_module

import numpy as np
import pytest
import torch

import engine.compose
from engine import checkpoints
from engine.checkpoints import PARTS, Part, Prepare

# file 1: the runtime module (a composer that scales the weighted sum by a learned factor)
RUNTIME = '''
import numpy as np
import torch

from engine.checkpoints import find, load, part
from engine.compose.base import COMPOSERS, Composer, ComposerUnavailable, Composition, normalise


@COMPOSERS.register("toy")
class ToyComposer(Composer):
    name, label, needs_text = "toy", "Toy", True

    def __init__(self, backbone, checkpoint_dir=None, **_):
        super().__init__(backbone)
        found = find("toy", backbone.fingerprint, checkpoint_dir)
        if not found:
            raise ComposerUnavailable(f"no Toy checkpoint for {backbone.name}; {part('toy').train_hint()}")
        self.gain = float(load("toy", found[0][0], backbone.fingerprint).tensors["gain"])

    def compose(self, query):
        text = self.backbone.encode_texts([query.text]).embeddings[0].float()
        img = query.image_embedding.float() if query.image_embedding is not None else torch.zeros_like(text)
        return Composition(normalise(self.gain * (img + text)), {"gain": self.gain})
'''

# file 2: the trainer (the plain options prepare gives a part: --backbone --device --out --epochs --quiet)
TRAINER = '''
import argparse
from pathlib import Path

import torch

from engine.backbones import create_backbone
from engine.checkpoints import file_name, make_record, write


def main(argv=None):
    p = argparse.ArgumentParser()
    for opt in ("--backbone", "--device", "--out"):
        p.add_argument(opt)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    bb = create_backbone(args.backbone, args.device or "cpu")
    path = Path(args.out) / file_name("toy", bb.name)
    record = make_record("toy", bb.fingerprint, {"epochs": args.epochs}, backbone_name=bb.name)
    write(path, {"gain": torch.tensor(1.0 + args.epochs)}, record)
    return 0
'''

# file 3: the spec, one entry of engine.checkpoints.PARTS
SPEC = Part("toy", "Toy", "toy", "toy*.safetensors", "python -m engine train toy", "toy",
            trainer="toy_part_trainer", runtime="engine.compose.toy_part", text_alone=True, what="a toy composer",
            prepare=Prepare(share=0.1, probe=(1,), units=("epochs",)))


@pytest.fixture()
def toy_part(tmp_path, monkeypatch):
    (tmp_path / "toy_part.py").write_text(RUNTIME)
    (tmp_path / "toy_part_trainer.py").write_text(TRAINER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(engine.compose, "__path__", [*engine.compose.__path__, str(tmp_path)])
    monkeypatch.setitem(PARTS, "toy", SPEC)
    for module in checkpoints.runtime_modules("engine.compose"):  # what engine/compose/__init__.py runs
        import_module(module)
    yield
    engine.compose.COMPOSERS._items.pop("toy", None)
    for name in ("engine.compose.toy_part", "toy_part_trainer"):
        sys.modules.pop(name, None)


def test_a_toy_part_is_its_module_its_trainer_and_one_spec(toy_part, tiny, tmp_path):
    from engine import background, cli, prepare
    from engine.compose import COMPOSERS, ComposerUnavailable, Query

    # the registry has it, and without a checkpoint its loader names the training command from the spec
    with pytest.raises(ComposerUnavailable, match="train one with `python -m engine train toy`"):
        COMPOSERS.get("toy")(tiny, checkpoint_dir=str(tmp_path / "none"))
    # `python -m engine train toy` runs its trainer
    assert cli.trainers()["toy"] == ("toy_part_trainer", "a toy composer")
    out = tmp_path / "ck"
    assert cli.main(["train", "toy", "--backbone", "tiny:tiny-vit-a", "--out", str(out), "--epochs", "2"]) == 0
    comp = COMPOSERS.get("toy")(tiny, checkpoint_dir=str(out))
    vec = comp.compose(Query(text="a red apple", image_embedding=torch.ones(tiny.embed_dim), has_image=True)).vector
    assert comp.gain == 3.0 and np.isclose(np.linalg.norm(vec), 1.0)
    # `python -m engine prepare` lists it, probes it, plans it and trains it within its share of the budget
    assert "toy" in checkpoints.prepared_parts()
    from engine.config import Settings

    none = str(tmp_path / "none")  # no CIS_CHECKPOINTS folder holds a toy part
    rows = prepare.prepare("tiny:tiny-vit-a", tmp_path / "prepared", ["toy"], budget_min=1.0, device="cpu",
                           quiet=True, settings=Settings(checkpoints=none, checkpoints_given=none))
    assert [(r.part, r.source) for r in rows] == [("toy", "trained")], rows
    assert checkpoints.find("toy", tiny.fingerprint, str(tmp_path / "prepared"))
    # the app's status line names it by its label
    assert "**Toy**: available" in background.status_markdown(prepare.Status(state={"toy": "available"}), ["toy"])


def test_the_shipped_parts_are_read_from_their_specs():
    from engine import cli, prepare

    assert checkpoints.prepared_parts() == ["context-i2w", "rtic", "lattqe", "ics"]
    assert {k: v[0] for k, v in cli.trainers().items()} == {
        "context-i2w": "engine.train.context_i2w.cli", "rtic": "engine.train.rtic", "lattqe": "engine.train.lattqe",
        "ics": "engine.train.ics", "anchor": "engine.train.anchor_fit"}
    assert prepare.data_needs("lattqe") == ("labelled",) and prepare.data_needs("defaults") == ("captions", "cir")
    assert checkpoints.runtime_modules("engine.compose") == ["engine.compose.context_i2w", "engine.compose.rtic"]
    assert PARTS["ics"].command() == "python -m engine train ics --bits 64"
    assert PARTS["ics"].train_hint(bits=16).startswith("train one with `python -m engine train ics --bits 16`")
