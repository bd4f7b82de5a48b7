"""Prints the import layers of the project and exits 1 on a forbidden or unresolvable import or an import cycle.

    python tools/layers.py            # the layers, each unit with what it imports, then the verdict
    python tools/layers.py --quiet    # only the verdict (and the offending imports)

A *unit* is a top-level module or subpackage of ``engine`` (``engine/index/`` is ``index``), ``demo`` or
``app`` (app.py). Every import counts, also the ones inside functions (a lazy import is still a dependency).
Four rules:

1. a unit imports only from its own layer or the layers below it (``LAYERS``, lowest first);
2. no runtime unit (what serves a query: ``RUNTIME``) imports benchmark, evaluation, training or load-test
   code (``OFFLINE_ONLY``), even where rule 1 would allow it (``demo`` sits above them as an entry point);
3. every project import resolves: the module exists, and each name taken with ``from X import name`` is a
   submodule of X or a name X defines at its top level (relative imports inside one package included; an
   import inside a function is checked as strictly as one at the top, since only running it would tell);
4. no import cycle between modules (lazy imports included: a cycle hidden inside a function is still one).
   Importing ``a.b.c`` from outside package ``a.b`` runs ``a/b/__init__.py`` first, so it counts as an
   import of that package too;
5. an import inside a function defers something: a dependency (torch, faiss, gradio, ray, ...) that the
   module does not load at its top, directly or through the project modules it imports there. A lazy import
   of the standard library, of a dependency already loaded, or of a project module that loads nothing new is
   flagged: it hides the graph and saves nothing (``lazy_without_reason``; ``LAZY_PENDING`` lists files
   whose turn is later).

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
    ("stored parts and links", {"checkpoints", "defaults", "fetch", "share", "export", "query"}),
    ("model parts", {"backbones", "compose", "expand", "index"}),
    ("search", {"search"}),
    ("serving", {"service", "batching", "compare", "prebuilt"}),
    ("offline data", {"data", "process"}),
    ("evaluation", {"eval"}),
    ("training", {"train"}),
    ("offline runs: preparation, load test, benchmarks", {"prepare", "background", "loadtest", "bench"}),
    ("entry points", {"cli", "__main__", "demo", "app"}),
]
# function-local imports that would be flagged (rule 5) in files another change is rewriting now: path -> why they
# wait. Keep it short; a test fails when an entry is no longer needed.
LAZY_PENDING: Dict[str, str] = {}
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


PROJECT = ("engine", "demo", "app")


def _records(path: Path, root: Path) -> List[Tuple[str, List[str], int, bool]]:
    """(module, names taken from it (empty for ``import module``), line, whether the names are submodules: ``from
    . import x``, ``from engine import x``) of every project import in ``path``, relative imports resolved;
    inside functions too."""
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno, False) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            submodules = bool(node.module is None and node.level) or target in ("engine", "demo")
            found.append((target, [alias.name for alias in node.names], node.lineno, submodules))
    return [r for r in found if r[0].split(".")[0] in PROJECT]


def _imports(path: Path, root: Path) -> List[Tuple[str, int]]:
    """(imported module, line) of every project import in ``path``, relative imports resolved."""
    found = []
    for target, names, line, submodules in _records(path, root):
        if submodules:
            found += [(f"{target}.{name}", line) for name in names]  # "from engine import x", "from . import x"
        else:
            found.append((target, line))
    return found


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
    problems += unresolved(root)
    problems += [p for p in lazy_without_reason(root) if p.split(":")[0] not in LAZY_PENDING]
    modules = _modules(root)
    for ring in cycles(root):
        arrows = [f"{modules[a].relative_to(root)}:{line} -> {b}" for a in ring
                  for b, line in sorted(module_graph(root)[a].items()) if b in ring]
        problems.append(f"import cycle between {', '.join(ring)}: {'; '.join(arrows)}")
    return graph, problems


def _modules(root: Path) -> Dict[str, Path]:
    return {_module_name(path, root): path for path in source_files(root)}


def _top_level_names(path: Path) -> Set[str]:
    """Names ``path`` binds at its top level (also inside top-level if / try / with / for blocks); ``*`` when it
    takes every name of another module or answers any name (``__getattr__``)."""
    names: Set[str] = set()

    def targets(node):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                targets(elt)
        elif isinstance(node, ast.Starred):
            targets(node.value)

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    targets(t)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets(node.target)
            elif isinstance(node, ast.Import):
                names.update(a.asname or a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                names.update(a.asname or a.name for a in node.names)
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                targets(node.target)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        targets(item.optional_vars)
            for field in ("body", "orelse", "finalbody"):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    visit(getattr(node, field, []) or [])
            for handler in getattr(node, "handlers", []) or []:
                visit(handler.body)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)).body)
    return {"*"} if "__getattr__" in names else names


def unresolved(root: Path = ROOT) -> List[str]:
    """One line per project import that would fail when it runs: no such module, or no such name in it."""
    modules = _modules(root)
    names_of: Dict[str, Set[str]] = {}
    problems = []
    for path in source_files(root):
        for target, names, line, _ in _records(path, root):
            where = f"{path.relative_to(root)}:{line}"
            if target not in modules:
                problems.append(f"{where}: imports {target}, which does not exist")
                continue
            if target not in names_of:
                names_of[target] = _top_level_names(modules[target])
            defined = names_of[target]
            missing = [n for n in names if n != "*" and "*" not in defined and n not in defined
                       and f"{target}.{n}" not in modules]
            problems += [f"{where}: imports {n} from {target}, which has no such name or submodule" for n in missing]
    return problems


def module_graph(root: Path = ROOT) -> Dict[str, Dict[str, int]]:
    """{module: {module it imports: first line}}, lazy imports included; importing ``a.b.c`` from outside
    package ``a.b`` also imports ``a.b`` (its ``__init__`` runs first)."""
    modules = _modules(root)
    graph: Dict[str, Dict[str, int]] = {}
    for path in source_files(root):
        src = _module_name(path, root)
        own_package = src if path.name == "__init__.py" else src.rpartition(".")[0]
        edges = graph.setdefault(src, {})
        for target, names, line, _ in _records(path, root):
            hits = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules] or [target]
            if names and len(hits) < len(names) and target not in hits:
                hits.append(target)  # some names are not submodules: the package itself provides them
            for dst in hits:
                parts = dst.split(".")
                for i in range(1, len(parts) + 1):
                    mod = ".".join(parts[:i])
                    inside = own_package == mod or own_package.startswith(mod + ".")
                    if mod in modules and mod != src and (i == len(parts) or not inside):
                        edges.setdefault(mod, line)
    return graph


def cycles(root: Path = ROOT) -> List[List[str]]:
    """The import cycles: each a list of modules that import one another in a ring (Tarjan's components)."""
    graph = module_graph(root)
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            ring = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                ring.append(w)
                if w == v:
                    break
            if len(ring) > 1:
                found.append(sorted(ring))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(found)


def _split_imports(path: Path, root: Path):
    """(top-level imports, function-local imports) of ``path``: lists of (module, names, line, submodules) for
    the project's and (package, [], line, False) for everything else; a top-level ``try`` / ``if`` counts as top."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    project = {line: [] for line in ()}
    for rec in _records(path, root):
        project.setdefault(rec[2], []).append(rec)
    top, local = [], []

    def visit(node, inside):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if isinstance(child, ast.ImportFrom) and (child.level or child.module == "__future__"):
                    recs = project.get(child.lineno, []) if child.level else []
                else:
                    names = [a.name for a in child.names] if isinstance(child, ast.Import) else [child.module]
                    recs = [r for r in project.get(child.lineno, [])] or \
                        [(n.split(".")[0], [], child.lineno, False) for n in names]
                (local if inside else top).extend(recs)
            else:
                visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return top, local


def _third_party(name: str) -> bool:
    return name not in PROJECT and name not in sys.stdlib_module_names


def lazy_without_reason(root: Path = ROOT) -> List[str]:
    """Function-local imports that save nothing: a standard-library module (cheap), a dependency the module
    already loads at its top (directly or through the project modules it imports there), or a project module
    that loads no dependency the importing module does not load already. A lazy import that stays defers an
    optional or costly dependency (torch, faiss, gradio, ray, ...), and this check says so by construction."""
    modules = _modules(root)
    split = {name: _split_imports(path, root) for name, path in modules.items()}
    loads: Dict[str, Set[str]] = {}

    def deps(name: str, seen: Set[str]) -> Set[str]:  # third-party packages loaded by importing ``name``
        if name in loads:
            return loads[name]
        if name in seen or name not in split:
            return set()
        seen.add(name)
        out: Set[str] = set()
        parts = name.split(".")
        for i in range(1, len(parts)):  # importing a.b.c runs a/__init__ and a/b/__init__ first
            out |= deps(".".join(parts[:i]), seen)
        for target, names, _, submodules in split[name][0]:
            if target.split(".")[0] in PROJECT:
                for mod in [f"{target}.{n}" for n in names if f"{target}.{n}" in modules] + [target]:
                    out |= deps(mod, seen)
            elif _third_party(target):
                out.add(target)
        loads[name] = out
        return out

    problems = []
    for name, path in modules.items():
        have = deps(name, set())
        for target, names, line, _ in split[name][1]:
            where = f"{path.relative_to(root)}:{line}"
            if target.split(".")[0] in PROJECT:
                mods = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules] or [target]
                if any(m not in modules for m in mods):
                    continue  # unresolved: reported by rule 3
                extra = set().union(*(deps(m, set()) for m in mods)) - have
                if not extra:
                    problems.append(f"{where}: lazy import of {target} defers no dependency: import it at the top")
            elif not _third_party(target):
                problems.append(f"{where}: lazy import of {target} (standard library): import it at the top")
            elif target in have:
                problems.append(f"{where}: lazy import of {target}, already loaded at the top: import it there")
    return problems


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
    print(f"{len(problems)} forbidden import(s)" if problems else "layers OK (every import resolves, no cycle)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
