"""Prints the import layers of the project and exits 1 on a forbidden import.

    python tools/layers.py            # the layers, each unit with what it imports, then the verdict
    python tools/layers.py --quiet    # only the verdict (and the offending imports)

A *unit* is a top-level module or subpackage of ``engine`` (``engine/index/`` is ``index``), ``demo`` or
``app`` (app.py). Every import counts, also the ones inside functions (a lazy import is still a dependency).
Two rules:

1. a unit imports only from its own layer or the layers below it (``LAYERS``, lowest first);
2. no runtime unit (what serves a query: ``RUNTIME``) imports benchmark, evaluation, training or load-test
   code (``OFFLINE_ONLY``), even where rule 1 would allow it (``demo`` sits above them as an entry point).

Standard library only, so it runs before anything is installed.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent

LAYERS: List[Tuple[str, Set[str]]] = [
    ("foundation", {"engine", "config", "errors", "registry", "fileio", "sysinfo", "images", "labels", "reports"}),
    ("stored parts and links", {"checkpoints", "fetch", "share", "export", "query"}),
    ("model parts", {"backbones", "compose", "expand", "index"}),
    ("search", {"search", "defaults"}),
    ("serving", {"service", "batching", "compare", "prebuilt"}),
    ("offline: data, evaluation, training, benchmarks", {"data", "eval", "train", "prepare", "background",
                                                         "loadtest", "bench"}),
    ("entry points", {"cli", "__main__", "demo", "app"}),
]
RUNTIME = {"backbones", "compose", "expand", "index", "search", "service", "batching", "demo"}
OFFLINE_ONLY = {"bench", "eval", "train", "loadtest"}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if parts[0] == "engine" and len(parts) > 1 else parts[0]


def _imports(path: Path, root: Path) -> List[Tuple[str, int]]:
    """(imported module, line) of every project import in ``path``, relative imports resolved."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if (node.module is None and node.level) or target in ("engine", "demo"):  # "from engine import x"
                found += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
            else:
                found.append((target, node.lineno))
    return [(m, line) for m, line in found if m.split(".")[0] in ("engine", "demo", "app")]


def source_files(root: Path = ROOT) -> List[Path]:
    files = sorted((root / "engine").rglob("*.py")) + sorted((root / "demo").rglob("*.py"))
    return files + ([root / "app.py"] if (root / "app.py").exists() else [])


def check(root: Path = ROOT) -> Tuple[Dict[str, Dict[str, Set[str]]], List[str]]:
    """({unit: {imported unit: {where}}}, problems) for the project at ``root``."""
    layer_of = {u: i for i, (_, units) in enumerate(LAYERS) for u in units}
    graph: Dict[str, Dict[str, Set[str]]] = {}
    problems = []
    for path in source_files(root):
        src = _unit(_module_name(path, root))
        if src not in layer_of:
            problems.append(f"{path.relative_to(root)}: unit {src!r} is in no layer (add it to LAYERS)")
            continue
        for target, line in _imports(path, root):
            dst = _unit(target)
            if dst == src:
                continue
            where = f"{path.relative_to(root)}:{line}"
            graph.setdefault(src, {}).setdefault(dst, set()).add(where)
            if dst not in layer_of:
                problems.append(f"{where}: imports {target}, whose unit {dst!r} is in no layer")
            elif layer_of[dst] > layer_of[src]:
                problems.append(f"{where}: {src} ({LAYERS[layer_of[src]][0]}) imports {target} from a higher "
                                f"layer ({LAYERS[layer_of[dst]][0]})")
            elif src in RUNTIME and dst in OFFLINE_ONLY:
                problems.append(f"{where}: runtime unit {src} imports {target} ({dst} is offline-only)")
    return graph, problems


def main(argv=None) -> int:
    quiet = "--quiet" in (argv if argv is not None else sys.argv[1:])
    graph, problems = check()
    if not quiet:
        for i, (name, units) in enumerate(LAYERS):
            print(f"layer {i}: {name}")
            for unit in sorted(units):
                deps = sorted(graph.get(unit, {}))
                tag = " [runtime]" if unit in RUNTIME else ""
                print(f"    {unit}{tag} -> {', '.join(deps) if deps else '(nothing of the project)'}")
        print(f"runtime units ({', '.join(sorted(RUNTIME))}) never import {', '.join(sorted(OFFLINE_ONLY))}")
    for p in problems:
        print("FORBIDDEN " + p)
    print(f"{len(problems)} forbidden import(s)" if problems else "layers OK")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
