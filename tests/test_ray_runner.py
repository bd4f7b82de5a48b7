"""--runner ray on a real two-node local Ray cluster: same items and embeddings as --runner local, a worker
killed mid-run loses and duplicates nothing, finished shards are not recomputed."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ray = pytest.importorskip("ray", reason="the Ray extra (requirements-scale.txt) is not installed")

from engine.index.store import GalleryIndex
from engine.sysinfo import free_port

ROOT = Path(__file__).resolve().parent.parent
BACKBONE = "tiny:tiny-vit-a"
N_IMAGES = 200


def _ray_cli(*args, env, check=True):
    ray_bin = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    return subprocess.run([ray_bin, *args], env=env, capture_output=True, text=True, timeout=120, check=check)


@pytest.fixture(scope="module")
def cluster():
    """A head node and a second node on loopback, one CPU each; stopped whatever happens."""
    temp = tempfile.mkdtemp(prefix="r")  # short: Ray's socket paths must stay under 107 bytes
    # loopback-only test cluster: no token authentication (docs/scale.md keeps it on for real clusters)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", PYTHONPATH=str(ROOT))
    port = free_port()
    address = f"127.0.0.1:{port}"
    try:
        _ray_cli("start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "1",
                 "--num-gpus", "0", "--object-store-memory", str(100 << 20), "--include-dashboard", "false", "--temp-dir", temp, "--disable-usage-stats",
                 env=env)
        _ray_cli("start", "--address", address, "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
                 "--num-gpus", "0", "--object-store-memory", str(100 << 20), env=env)
        yield address, env
    finally:
        _ray_cli("stop", "--force", env=env, check=False)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A few hundred small distinct images in nested folders."""
    root = tmp_path_factory.mktemp("imgs")
    rng = np.random.default_rng(0)
    for i in range(N_IMAGES):
        sub = root / f"d{i % 3}"
        sub.mkdir(exist_ok=True)
        arr = (rng.random((24, 32, 3)) * 255).astype(np.uint8)
        Image.fromarray(arr).save(sub / f"{i:04d}.png")
    (root / "broken.png").write_bytes(b"not an image")
    return root


def _index(src, out, env, *extra):
    cmd = [sys.executable, "-m", "engine", "index", str(src), "--out", str(out), "--backbone", BACKBONE,
           "--device", "cpu", *extra]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc, timeout=240):
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    return out


def _load(out):
    idx = GalleryIndex.load(out)
    return [it["path"] for it in idx.items], idx.embeddings.astype(np.float32), idx


def test_ray_matches_local_and_survives_a_killed_worker(cluster, images, tmp_path):
    address, env = cluster
    local = _index(images, tmp_path / "local", env, "--workers", "0")
    _finish(local)
    paths_l, emb_l, idx_l = _load(tmp_path / "local")
    assert len(paths_l) == N_IMAGES

    _finish(_index(images, tmp_path / "ray", env, "--runner", "ray", "--address", address, "--shard-size", "32"))
    paths_r, emb_r, idx_r = _load(tmp_path / "ray")
    assert paths_r == paths_l
    assert [it["sha256"] for it in idx_r.items] == [it["sha256"] for it in idx_l.items]
    assert float(np.abs(emb_r - emb_l).max()) <= 1e-4
    assert [s["path"] for s in idx_r.meta["skipped"]] == ["broken.png"]
    _scores, ids = idx_r.search(emb_r[:5], 1)  # the assembled FAISS index answers like the local one
    assert list(ids[:, 0]) == [0, 1, 2, 3, 4]

    # a second run, killing one embedding worker as soon as it has finished a shard
    out = tmp_path / "killed"
    proc = _index(images, out, env, "--runner", "ray", "--address", address, "--shard-size", "8")
    killed = None
    deadline = time.time() + 180
    while killed is None and time.time() < deadline and proc.poll() is None:
        for marker in out.glob("ray-shards/*/workers/*"):
            if marker.read_text().strip() not in ("", "0"):
                os.kill(int(marker.name), signal.SIGKILL)
                killed = int(marker.name)
                break
        time.sleep(0.05)
    _finish(proc)
    assert killed is not None, "the run ended before a worker could be killed"
    paths_k, emb_k, _ = _load(out)
    assert paths_k == paths_l and len(set(paths_k)) == N_IMAGES  # every item exactly once
    assert float(np.abs(emb_k - emb_l).max()) <= 1e-4

    # resume: finished shards are not recomputed, a missing one is
    shards = sorted(out.glob("ray-shards/*/shard-*.npz"))
    assert len(shards) == -(-(N_IMAGES + 1) // 8)
    stamps = {s: s.stat().st_mtime_ns for s in shards}
    shards[3].unlink()
    _finish(_index(images, out, env, "--runner", "ray", "--address", address, "--shard-size", "8"))
    assert shards[3].exists()
    assert all(s.stat().st_mtime_ns == stamps[s] for s in shards if s != shards[3])
    paths_2, emb_2, _ = _load(out)
    assert paths_2 == paths_l and float(np.abs(emb_2 - emb_l).max()) <= 1e-4
