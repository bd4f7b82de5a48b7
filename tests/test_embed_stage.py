"""One embedding stage (engine.index.pipeline.embed_stage), two distributors: the local runner and the Ray
runner's actors run the same decode -> preprocess -> thumbnail -> embed code with the same limits. The Ray
distributor is run here in this process by a stand-in for ``ray.data`` (tests/test_ray_runner.py runs the real
cluster), so the settings it hands its actors are checked where Ray is not installed too."""
import numpy as np
from PIL import Image

from engine import images
from engine.config import Settings
from engine.index import ray_runner
from engine.index.pipeline import build_index, embed_stage
from engine.index.shards import read_shard_file


class _Dataset:
    """``ray.data.from_items(...).map_batches(Cls, fn_constructor_kwargs=...)`` run here, one actor."""

    def __init__(self, items):
        self.items = items

    def map_batches(self, cls, fn_constructor_kwargs, **_):
        self.actor = cls(**fn_constructor_kwargs)
        return self

    def iter_rows(self):
        for item in self.items:
            out = self.actor({"shard_id": [item["shard_id"]], "paths": [item["paths"]]})
            yield {"shard_id": out["shard_id"][0], "n": out["n"][0]}


class _Ray:
    class data:
        class DataContext:
            @staticmethod
            def get_current():
                return type("Ctx", (), {})()

        @staticmethod
        def from_items(items, **_):
            return _Dataset(items)

    @staticmethod
    def init(**_):
        pass

    @staticmethod
    def shutdown():
        pass

    @staticmethod
    def cluster_resources():
        return {"CPU": 1}


def _images(folder, big: bool):
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(5):
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    if big:  # 3000 x 3000 RGB: 27 MB to decode, over a 10 MB limit
        Image.new("RGB", (3000, 3000), (200, 10, 10)).save(folder / "big.png")
    return folder


def test_the_stage_embeds_and_reports_what_it_cannot_decode(tiny, tmp_path):
    root = _images(tmp_path / "imgs", big=True)
    rel = sorted(p.name for p in root.iterdir())
    batches = list(embed_stage(tiny, root, rel, [f"{i:064x}" for i in range(len(rel))], None, 40_000_000,
                               max_decode_bytes=10_000_000, batch_size=4))
    done = [i for b in batches for i in b.positions]
    failed = dict(kv for b in batches for kv in b.failed)
    assert sorted(done) == [i for i, r in enumerate(rel) if r != "big.png"]
    assert list(failed) == [rel.index("big.png")] and "MB" in failed[rel.index("big.png")]
    assert all(b.embeddings.shape == (len(b.positions), tiny.embed_dim) for b in batches)


def test_ray_and_local_runners_share_the_stage_and_its_decode_limit(tiny, tmp_path, monkeypatch):
    """The Ray runner honours CIS_MAX_DECODE_MB (it ignored it when it had its own copy of the loop) and
    gives the same embeddings as the local runner."""
    monkeypatch.setattr(ray_runner, "_ray", lambda: _Ray)
    root = _images(tmp_path / "imgs", big=True)
    settings = Settings()
    settings.backbone, settings.max_decode_mb, settings.decode_budget_mb = "tiny:tiny-vit-a", 10.0, 50.0
    monkeypatch.setattr(images, "BUDGET", images.DecodeBudget())
    ray_index = ray_runner.build_index_ray(root, tmp_path / "ray", tiny, settings, shard_size=3)
    assert images.BUDGET.capacity == 50_000_000  # the actor decodes within the driver's CIS_DECODE_BUDGET_MB
    local = build_index(root, tmp_path / "local", tiny, workers=0, max_decode_bytes=10_000_000)
    assert sorted(it["path"] for it in ray_index.items) == sorted(it["path"] for it in local.items)
    assert "big.png" not in {it["path"] for it in ray_index.items}
    shards = sorted((tmp_path / "ray").rglob("shard-*.npz"))
    reasons = [r for s in shards for r in read_shard_file(s).reasons]
    assert len(reasons) == 1 and "MB" in reasons[0]
    by_path = {it["path"]: i for i, it in enumerate(local.items)}
    for i, it in enumerate(ray_index.items):
        assert np.allclose(ray_index.embeddings[i], local.embeddings[by_path[it["path"]]], atol=2e-3)
