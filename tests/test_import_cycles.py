"""No import cycles among specdec's modules, not even ones hidden behind a function-level import.

The graph is read from the source with ast: every `import` / `from ... import` anywhere in a
module (module top, function bodies, class bodies) is an edge, except those under
`if TYPE_CHECKING:`, which never run. `from package import name` leads to the submodule
package.name when there is one, else to the package's __init__; importing a module of another
package also runs that package's __init__, an edge to it (a module whose import re-enters a
package __init__ that imports the module back fails when it is the first one imported). Imports
of other projects and dynamic imports (importlib.import_module) are not followed.
`python tests/test_import_cycles.py` lists the cycles as they stand."""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

# the installed packages (pyproject's packages; strategies/, heads/, ... map onto specdec.*)
PACKAGES = ("specdec", "specdec.interop", "specdec.serve", "specdec.strategies", "specdec.heads", "specdec.family",
            "specdec.configs", "specdec.configs.bench", "specdec.benchmarks")


def package_folders(packages=PACKAGES) -> dict[str, Path]:
    return {name: Path(next(iter(importlib.util.find_spec(name).submodule_search_locations)))
            for name in packages}


def module_files(folders: dict[str, Path]) -> dict[str, Path]:
    """{dotted module name: file} of every module of the given packages (one folder level each)."""
    modules = {}
    for package, folder in folders.items():
        for path in sorted(folder.glob("*.py")):
            modules[package if path.name == "__init__.py" else f"{package}.{path.stem}"] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
           (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node, skipping the bodies of `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]))
            continue
        yield from _imports(node)


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """{module: the modules among `modules` it imports}."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph.setdefault(name, set())
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in modules)
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:       # a submodule
                    edges.add(f"{base}.{alias.name}")
                elif base in modules:                      # a name defined by the module (or package __init__)
                    edges.add(base)
        # importing a.b.c first runs the __init__ of a and a.b: an edge to each of those packages that is
        # not already running around this module (its own package and that package's parents)
        own = {package.rsplit(".", depth)[0] for depth in range(package.count(".") + 1)}
        edges.update(parent for target in list(edges) for parent in _parents(target)
                     if parent in modules and parent not in own)
        edges.discard(name)
    return graph


def _parents(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle [a, b, ..., a] per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(set(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_a_cycle(graph, component) for component in components]


def _a_cycle(graph, component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first back to it)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph[node] & component):
                if succ == start:
                    return paths[node] + [start]
                if succ not in paths:
                    paths[succ] = paths[node] + [succ]
                    following.append(succ)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not a cycle")


# ---------------------------------------------------------------------- the tests
def test_the_packages_checked_are_the_installed_ones():
    tomllib = pytest.importorskip("tomllib")          # Python 3.11+
    with open(Path(__file__).parent.parent / "pyproject.toml", "rb") as f:
        assert sorted(tomllib.load(f)["tool"]["setuptools"]["packages"]) == sorted(PACKAGES)


def test_specdec_has_no_import_cycles():
    graph = import_graph(module_files(package_folders()))
    # the graph is really read (a vacuous graph would have no cycles either)
    assert "specdec.loop" in graph["specdec.api"] and "specdec.verifier" in graph["specdec.api"]
    assert "specdec.heads.io" in graph["specdec.heads.train"]
    cycles = find_cycles(graph)
    assert not cycles, "import cycles (move the shared piece into a module both can import at the top):\n" + \
        "\n".join(" -> ".join(cycle) for cycle in cycles)


def _package(root: Path, files: dict[str, str]) -> dict[str, Path]:
    """The modules of `files` ({relative path: source}) written under root: pkg and its subpackages."""
    for relpath, text in files.items():
        path = root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    folders = {p.parent for p in root.rglob("__init__.py")}
    return module_files({".".join(folder.relative_to(root).parts): folder for folder in folders})


def test_a_planted_cycle_through_a_function_level_import_is_found(tmp_path):
    modules = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from .b import thing\n",
        "pkg/b.py": "import os\n\ndef thing():\n    from pkg.sub import c\n    return c\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "from .. import a\n",
        "pkg/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import thing\n",
        "pkg/e.py": "from . import d\n",
    })
    graph = import_graph(modules)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.sub", "pkg.sub.c"} and graph["pkg.sub.c"] == {"pkg.a"}
    assert graph["pkg.d"] == set() and graph["pkg.e"] == {"pkg.d"}     # TYPE_CHECKING imports never run
    assert find_cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]


def test_a_cycle_planted_in_specdec_is_found(tmp_path):
    """The real modules plus one planted module-level import: the check fails."""
    modules = module_files(package_folders())
    planted = tmp_path / "verifier.py"
    planted.write_text(modules["specdec.verifier"].read_text(encoding="utf-8") + "\nfrom .api import Speculator\n")
    modules["specdec.verifier"] = planted
    cycles = find_cycles(import_graph(modules))
    assert any({"specdec.verifier", "specdec.api"} <= set(cycle) for cycle in cycles), cycles


def test_package_import_of_a_submodule_is_not_an_edge_to_the_package(tmp_path):
    """`from . import store` inside pkg/build.py while pkg/__init__ imports build: no cycle (Python
    resolves the submodule, the half-initialised package is never read)."""
    modules = _package(tmp_path, {
        "pkg/__init__.py": "from .build import make\n",
        "pkg/build.py": "from . import store\n\ndef make():\n    return store\n",
        "pkg/store.py": "import os\n",
    })
    graph = import_graph(modules)
    assert graph["pkg"] == {"pkg.build"} and graph["pkg.build"] == {"pkg.store"}
    assert find_cycles(graph) == []


def test_a_cycle_through_a_package_init_is_found(tmp_path):
    """x/__init__ imports x.io, which imports y.fmt, which imports x.module: importing y.fmt first
    runs x/__init__, then x.io, which finds y.fmt half made - the heads / interop layout before."""
    modules = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/x/__init__.py": "from .io import load\n",
        "pkg/x/io.py": "from pkg.y.fmt import detect\n\ndef load():\n    return detect\n",
        "pkg/x/module.py": "class Heads:\n    pass\n",
        "pkg/y/__init__.py": "",
        "pkg/y/fmt.py": "from pkg.x.module import Heads\n\ndef detect():\n    return Heads\n",
    })
    graph = import_graph(modules)
    assert graph["pkg.y.fmt"] == {"pkg.x", "pkg.x.module"}
    assert find_cycles(graph) == [["pkg.x", "pkg.x.io", "pkg.y.fmt", "pkg.x"]]


if __name__ == "__main__":      # the cycles as they stand, one per line
    for found in find_cycles(import_graph(module_files(package_folders()))):
        print(" -> ".join(found))
