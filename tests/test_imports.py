"""The package's import graph: no import circles between modules, no import against the layering.

Read from the source with ``ast`` (nothing is imported): every ``import`` / ``from … import`` in a module,
function-level ones included. ``from pkg import name`` counts as an import of ``pkg.name`` when that is a
module, else of ``pkg``. Imports under ``if TYPE_CHECKING:`` (never run) count for the circles (two modules
that name each other's types are still knotted together) but not for the layering.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "gnnpipe"

#: the layering (docs/ARCHITECTURE.md, "Layers"): a module may import its own package or a strictly lower layer.
#: data < models; schedulers < partitioners; correctors < core < experiments, costmodel < tasks < api < cli; shared
#: utilities (errors, registry, the package root) at the bottom, ``__main__`` on top.
LAYERS = {
    "gnnpipe.errors": 0,
    "gnnpipe": 1, "gnnpipe.registry": 1, "gnnpipe.progress": 1,
    "data": 2, "schedulers": 2,
    "models": 3, "partitioners": 3,
    "correctors": 4,
    "core": 5,
    "experiments": 6, "costmodel": 6,
    "tasks": 7,
    "api": 8, "calculator": 8, "relax": 8,
    "cli": 9,
    "__main__": 10,
}


#: inside a package, its parts (the next name below it: a subpackage or a module) in the same way. ``core`` (the
#: runtime every kind of work shares, nothing task-specific): what a run is told, the counted communication and the
#: rank grid at the bottom, the schedule interpreter and the stage protocol on them, the run's lifecycle around the
#: epoch loop on top. The shared cost model: the machine, live bytes and the statistics of repeats at the bottom, the
#: link probe on them. Node classification's profiler: the record and the contention probe at the bottom, unit
#: timing, then what is built on it, the whole profile.
INNER_LAYERS = {
    "gnnpipe.core": {
        "settings": 0, "comm": 0, "grid": 0,
        "runtime": 1,
        "run": 2,
    },
    "gnnpipe.costmodel": {
        "hardware": 0, "live": 0, "robust": 0,
        "link": 1,
    },
    "gnnpipe.tasks.nodes.cost.profile": {
        "record": 1, "contention": 1,
        "units": 2,
        "memory": 3, "overhead": 3,
        "measure": 5,
    },
}
CORE_LAYERS = INNER_LAYERS["gnnpipe.core"]


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ["gnnpipe", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path], typing: bool = False) -> set[str]:
    """The package modules ``name`` imports; ``typing``: also those under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if not typing and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for t in targets:
            if not t.startswith("gnnpipe"):
                continue
            while t not in modules and "." in t:
                t = t.rsplit(".", 1)[0]
            if t != name:
                found.add(t)
    return found


def _graph(typing: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, modules, typing) for m, p in modules.items()}


def _layer(module: str) -> tuple[str, int]:
    if module in LAYERS:
        return module, LAYERS[module]
    top = module.split(".")[1]
    if top not in LAYERS:
        raise AssertionError(f"{module}: its package {top!r} has no layer; add it to LAYERS in {__file__}")
    return top, LAYERS[top]


def _inner_layer(package: str, module: str) -> tuple[str, int]:
    """``(part, level)`` of a module inside ``package`` (the package itself, its facade: ``("", -1)``)."""
    if module != package and not module.startswith(package + "."):
        raise ValueError(f"{module} is not in {package}")
    if module == package:
        return "", -1
    part = module[len(package) + 1:].split(".")[0]
    layers = INNER_LAYERS[package]
    if part not in layers:
        raise AssertionError(f"{module}: {package}.{part} has no layer; put the module in one of "
                             f"{', '.join(layers)} or add it to INNER_LAYERS in {__file__}")
    return part, layers[part]


def _core_layer(module: str) -> tuple[str, int]:
    return _inner_layer("gnnpipe.core", module)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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


def test_the_import_reader_sees_known_edges():
    """The reader is not vacuous: it finds imports we know exist, relative and absolute (in functions too: below)."""
    g = _graph()
    assert "gnnpipe.tasks.nodes.history" in g["gnnpipe.tasks.nodes.aggregation"]
    assert "gnnpipe.schedulers.ir" in g["gnnpipe.schedulers.validate"]
    assert "gnnpipe.tasks.nodes.runner" in g["gnnpipe.tasks.nodes"]  # from .runner import (…) at its top
    assert "gnnpipe.tasks" in g["gnnpipe.api"]
    assert len(g) > 60


def test_the_import_reader_sees_imports_inside_functions(tmp_path):
    modules = _modules()
    src = tmp_path / "mod.py"
    src.write_text("def f():\n    from gnnpipe.schedulers.ir import Schedule\n    from . import validate\n")
    assert _imports("gnnpipe.schedulers.mod", src, modules) == {"gnnpipe.schedulers.ir", "gnnpipe.schedulers.validate"}


def test_type_checking_imports_count_for_circles_only(tmp_path):
    """An import under ``if TYPE_CHECKING:`` is an edge of the circle graph, not of the layering graph."""
    modules = _modules()
    src = tmp_path / "mod.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                   "    from gnnpipe.schedulers.ir import Schedule\n")
    assert _imports("gnnpipe.schedulers.mod", src, modules) == set()
    assert _imports("gnnpipe.schedulers.mod", src, modules, typing=True) == {"gnnpipe.schedulers.ir"}


def test_no_import_circles():
    cycles = _cycles(_graph(typing=True))
    assert cycles == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_no_import_against_the_layering():
    bad = []
    for module, targets in _graph().items():
        pkg, level = _layer(module)
        for t in targets:
            tpkg, tlevel = _layer(t)
            if tpkg != pkg and tlevel >= level:
                bad.append(f"{module} (layer {level}) imports {t} (layer {tlevel})")
    assert bad == [], "imports against the layering:\n" + "\n".join(sorted(bad))


@pytest.mark.parametrize("package", sorted(INNER_LAYERS))
def test_inside_a_layered_package_imports_point_down(package):
    """Inside ``core`` (and the profiler): a module imports its own part or a strictly lower one (``runtime`` never
    imports ``run``); every module of the package sits in a part with a layer (``core`` holds only subpackages)."""
    g = _graph()
    inside = [m for m in g if m == package or m.startswith(package + ".")]
    assert len(inside) > len(INNER_LAYERS[package]), f"{package}: its modules are not found"
    bad = []
    for module in inside:
        part, level = _inner_layer(package, module)  # a module in no part with a layer fails here
        if module == package:
            continue  # the package's facade re-exports its parts
        for t in g[module]:
            if t != package and not t.startswith(package + "."):
                continue
            tpart, tlevel = _inner_layer(package, t)
            if tpart != part and tlevel >= level:
                bad.append(f"{module} ({part}, level {level}) imports {t} ({tpart or 'the package'}, level {tlevel})")
    assert bad == [], f"imports against the layering inside {package}:\n" + "\n".join(sorted(bad))


def test_an_upward_import_inside_core_would_be_caught():
    assert _core_layer("gnnpipe.core.run.launch")[1] > _core_layer("gnnpipe.core.runtime.execute")[1] \
        > _core_layer("gnnpipe.core.comm")[1]
    assert _core_layer("gnnpipe.core.comm")[1] == _core_layer("gnnpipe.core.settings.config")[1]
    with pytest.raises(AssertionError, match="has no layer"):
        _core_layer("gnnpipe.core.newsub.mod")
    with pytest.raises(AssertionError, match="has no layer"):
        _core_layer("gnnpipe.core.loose_module")
    assert _inner_layer("gnnpipe.tasks.nodes.cost.profile", "gnnpipe.tasks.nodes.cost.profile.measure")[1] \
        > _inner_layer("gnnpipe.tasks.nodes.cost.profile", "gnnpipe.tasks.nodes.cost.profile.record")[1]


#: what ``core`` may import of ``gnnpipe.models``: the registry and its facade (build a model by name), no family
MODEL_REGISTRY = {"gnnpipe.models", "gnnpipe.models.registry", "gnnpipe.models.options", "gnnpipe.models.build",
                  "gnnpipe.models.io"}


def test_core_imports_no_task_and_no_model_family():
    """``core`` is task-neutral: it imports no task (the layering) and of the models only the registry."""
    bad = []
    for module, targets in _graph().items():
        if not module.startswith("gnnpipe.core"):
            continue
        for t in targets:
            if t.startswith("gnnpipe.tasks") or (t.startswith("gnnpipe.models") and t not in MODEL_REGISTRY):
                bad.append(f"{module} imports {t}")
    assert bad == [], "core imports task or model-family code:\n" + "\n".join(sorted(bad))


def test_a_circle_and_an_upward_import_would_be_caught():
    """The checks themselves: a two-module circle is found, and the layer map ranks cli above core."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _layer("gnnpipe.cli.train")[1] > _layer("gnnpipe.tasks.nodes.stage")[1] \
        > _layer("gnnpipe.partitioners.layers")[1]
    # a task's cost model is built on the shared one, which profiles with core; api drives the tasks
    assert _layer("gnnpipe.api")[1] > _layer("gnnpipe.tasks.nodes.cost.predict")[1] \
        > _layer("gnnpipe.costmodel.link")[1] > _layer("gnnpipe.core.run.launch")[1]
    with pytest.raises(AssertionError, match="no layer"):
        _layer("gnnpipe.newpkg.mod")
