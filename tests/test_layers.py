"""The architecture of DESIGN.md, checked on the source: layers point one way
(``sim`` ← ``realrun`` ← ``analysis`` ← ``draftsim`` ← ``benchmarks``, installed as
``draftsim.sim``, ``draftsim.realrun``, ``draftsim.analysis``), ``sim`` never imports
torch or transformers, and no module reaches into another's private names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["sim", "realrun", "analysis", "draftsim", "benchmarks"]
#: Heavy real-model libraries that the simulation layer must do without.
NOT_IN_SIM = ("torch", "transformers", "accelerate", "gguf")


def _sources(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py"))


def _imports(tree: ast.AST, relative: bool = False) -> list[tuple[int, str, list[str]]]:
    """(line, module, imported names) of every import, at any depth (function-level too);
    relative imports (``from .x import y``, module ``.x``) only with ``relative``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.level == 0 and node.module or relative and node.level):
            out.append((node.lineno, "." * node.level + (node.module or ""), [a.name for a in node.names]))
    return out


#: The folder of each layer inside the ``draftsim`` namespace (pyproject's package-dir).
NAMESPACE = {"sim": "draftsim.sim", "realrun": "draftsim.realrun", "analysis": "draftsim.analysis", "draftsim": "draftsim"}


def _module_name(path: Path) -> str:
    """The dotted name a source file installs as (``realrun/executor.py`` → ``draftsim.realrun.executor``)."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] in NAMESPACE:
        parts = NAMESPACE[parts[0]].split(".") + parts[1:]
    return ".".join(parts)


def _absolute(path: Path, module: str) -> str:
    """An import's module as an absolute name (relative imports resolved against ``path``)."""
    level = len(module) - len(module.lstrip("."))
    if not level:
        return module
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (level - 1)]
    rest = module[level:]
    return ".".join(base + ([rest] if rest else []))


def _layer(module: str) -> str | None:
    """The layer an absolute module name belongs to (``draftsim.sim.x`` → ``sim``), or None."""
    parts = module.split(".")
    if parts[0] == "draftsim":
        return parts[1] if len(parts) > 1 and parts[1] in ("sim", "realrun", "analysis") else "draftsim"
    return "benchmarks" if parts[0] == "benchmarks" else None


@pytest.mark.parametrize("package", LAYERS)
def test_layers_point_one_way(package):
    above = LAYERS[LAYERS.index(package) + 1:]
    bad = []
    for path in _sources(package):
        for line, module, _ in _imports(ast.parse(path.read_text()), relative=True):
            absolute = _absolute(path, module)
            top = absolute.split(".")[0]
            if _layer(absolute) in above or (package == "sim" and top in NOT_IN_SIM):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {absolute}")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


@pytest.mark.parametrize("package", LAYERS + ["tests"])
def test_one_namespace(package):
    """The layers install as ``draftsim.sim``, ``draftsim.realrun`` and ``draftsim.analysis``:
    no source imports them as top-level packages (that works from a source tree's root and
    nowhere else), and a relative import never climbs out of ``draftsim``."""
    bad = []
    for path in _sources(package):
        for line, module, _ in _imports(ast.parse(path.read_text()), relative=True):
            absolute = _absolute(path, module)
            if absolute.split(".")[0] in ("sim", "realrun", "analysis") or (module.startswith(".") and not absolute.startswith("draftsim")):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "imports outside the draftsim namespace:\n" + "\n".join(bad)


def test_every_package_is_installed():
    """pyproject lists every package folder (a new subpackage left out would be missing from
    the wheel while an editable install still finds it)."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {_module_name(p.parent / "__init__.py") for layer in NAMESPACE for p in (ROOT / layer).rglob("__init__.py")}
    assert folders == set(config["packages"])
    assert all(config["package-dir"][NAMESPACE[layer]] == layer for layer in NAMESPACE)


def _defined_names(tree: ast.AST) -> set[str]:
    """Every name a module defines: functions, classes, assignments (attributes of self too)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _project_private_names() -> set[str]:
    return {n for package in LAYERS for path in _sources(package) for n in _defined_names(ast.parse(path.read_text())) if _private(n)}


@pytest.mark.parametrize("package", LAYERS)
def test_no_cross_module_private_names(package):
    """A private name (``_x``) of the project is used only in the module that defines it: no
    ``from m import _x`` across modules, no ``obj._x`` for a project ``_x`` the module does not
    define itself (private names of the standard library are not the project's to police)."""
    bad = []
    project = _project_private_names()
    for path in _sources(package):
        tree = ast.parse(path.read_text())
        own = _defined_names(tree)
        for line, module, names in _imports(tree, relative=True):
            if module.startswith(".") or _layer(module):
                bad.extend(f"{path.relative_to(ROOT)}:{line} imports {module}.{n}" for n in names if _private(n))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in project and node.attr not in own:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} uses .{node.attr}")
    assert not bad, "private names used across modules:\n" + "\n".join(bad)


def test_docstring_references_resolve():
    """Every fully qualified ``:mod:`` / ``:func:`` / ``:class:`` / ``:data:`` / ``:meth:``
    reference to the project in a docstring names something that exists (no stale docs)."""
    import importlib
    import re

    pattern = re.compile(r":(?:mod|func|class|data|meth):`~?(draftsim\.[A-Za-z_.]+)`")
    stale = []
    for package in LAYERS[:-1]:
        for path in _sources(package):
            for ref in sorted(set(pattern.findall(path.read_text()))):
                parts = ref.split(".")
                for i in range(len(parts), 0, -1):
                    try:
                        obj = importlib.import_module(".".join(parts[:i]))
                    except ImportError:
                        continue
                    try:
                        for name in parts[i:]:
                            obj = getattr(obj, name)
                    except AttributeError:
                        stale.append(f"{path.relative_to(ROOT)}: {ref}")
                    break
                else:
                    stale.append(f"{path.relative_to(ROOT)}: {ref}")
    assert not stale, "docstrings name what does not exist:\n" + "\n".join(stale)


def _import_graph() -> dict[str, set[str]]:
    """Module → the project modules it imports, resolved: relative and absolute imports at any
    depth (function-level and ``TYPE_CHECKING`` ones too), ``from pkg import mod`` as ``pkg.mod``
    where ``mod`` is a module."""
    modules = {_module_name(p): p for layer in LAYERS[:-1] for p in _sources(layer)}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for _, module, names in _imports(ast.parse(path.read_text()), relative=True):
            absolute = _absolute(path, module)
            targets = [f"{absolute}.{n}" for n in names if f"{absolute}.{n}" in modules] or [absolute]
            for t in targets:
                while t and t not in modules:  # a name inside a module: the module
                    t = t.rpartition(".")[0]
                if t and t != name and not name.startswith(t + ".") and t != name.rpartition(".")[0]:
                    graph[name].add(t)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    """No module imports, however indirectly and however late (inside a function), one that
    imports it back; a package's ``__init__`` re-exporting its own modules does not count."""
    graph = _import_graph()
    assert len(graph) > 100
    circles = _cycles(graph)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


@pytest.mark.parametrize("layer", ["sim", "realrun", "analysis"])
def test_one_tree_no_second_copy(layer):
    """One tree (docs/ARCHITECTURE.md): ``import sim`` from the repository root would load a second
    copy of the layer with other classes (another DraftsimError); each layer's ``__init__`` refuses it
    and names the one import that works."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", f"import {layer}"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and f"import draftsim.{layer}, not {layer}" in last


@pytest.mark.parametrize("layer", ["sim", "realrun", "analysis"])
def test_one_tree_paths_resolve_like_imports(layer):
    """``draftsim/<layer>`` is a link to the layer's folder, so path-based tools (pyright, IDEs,
    import-graph drawings) find ``draftsim.<layer>.x`` at ``draftsim/<layer>/x.py``, as Python does."""
    link = ROOT / "draftsim" / layer
    assert link.is_symlink() and link.resolve() == (ROOT / layer).resolve()
    assert (link / "__init__.py").read_text() == (ROOT / layer / "__init__.py").read_text()
