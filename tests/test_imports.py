"""The package's import graph: no import circles between modules, no import against the layering.

Read from the source with ``ast`` (nothing is imported): every ``import`` / ``from … import`` in a module,
function-level ones included, except those under ``if TYPE_CHECKING:`` (never run). ``from pkg import name``
counts as an import of ``pkg.name`` when that is a module, else of ``pkg``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "gnnpipe"

#: the layering (STYLE "Habits", DESIGN §3): a module may import its own package or a strictly lower layer.
#: data < models; schedulers < partitioners; correctors < core < experiments, costmodel < api < cli; shared utilities
#: (errors, registry, the package root) at the bottom, ``__main__`` on top.
LAYERS = {
    "gnnpipe.errors": 0,
    "gnnpipe": 1, "gnnpipe.registry": 1, "gnnpipe.progress": 1,
    "data": 2, "schedulers": 2,
    "models": 3, "partitioners": 3,
    "correctors": 4,
    "core": 5,
    "experiments": 6, "costmodel": 6, "tasks": 6,
    "api": 7, "calculator": 7,
    "cli": 8,
    "__main__": 9,
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ["gnnpipe", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
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


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def _layer(module: str) -> tuple[str, int]:
    if module in LAYERS:
        return module, LAYERS[module]
    top = module.split(".")[1]
    if top not in LAYERS:
        raise AssertionError(f"{module}: its package {top!r} has no layer; add it to LAYERS in {__file__}")
    return top, LAYERS[top]


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
    """The reader is not vacuous: it finds imports we know exist, relative and absolute, in functions too."""
    g = _graph()
    assert "gnnpipe.core.history" in g["gnnpipe.core.aggregation"]
    assert "gnnpipe.schedulers.ir" in g["gnnpipe.schedulers.validate"]
    assert "gnnpipe.core.runner" in g["gnnpipe.api"]  # imported inside train()
    assert len(g) > 60


def test_no_import_circles():
    cycles = _cycles(_graph())
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


def test_a_circle_and_an_upward_import_would_be_caught():
    """The checks themselves: a two-module circle is found, and the layer map ranks cli above core."""
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _layer("gnnpipe.cli.train")[1] > _layer("gnnpipe.core.stage")[1] > _layer("gnnpipe.partitioners.layers")[1]
    # the cost model profiles with core and is used by api/cli; core never imports it
    assert _layer("gnnpipe.api")[1] > _layer("gnnpipe.costmodel.predict")[1] > _layer("gnnpipe.core.runner")[1]
    with pytest.raises(AssertionError, match="no layer"):
        _layer("gnnpipe.newpkg.mod")
