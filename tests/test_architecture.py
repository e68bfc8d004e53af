"""The package's structure, asserted so that it cannot silently decay.

Data flows one way: plan <- models <- runtime <- profiling <- predict <- search <- workflows <- report <- cli.
A module may import its own layer and the layers below it, never one above (that would be an arrow running
back up the data flow), and the module import graph has no cycle. Every import counts, also one inside a
function (a lazy import is still a dependency); only imports under ``if TYPE_CHECKING:`` are left out (they
never run). The ``plan`` package, model names and the error and unit helpers import no torch.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "hybridplan"

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "units", "limits"}),  # limits: bounds on input numbers, imports no torch
    frozenset({"plan"}),
    frozenset({"collectives"}),  # torch.distributed helpers shared by models (tensor parallelism) and the runtime
    frozenset({"models"}),
    frozenset({"runtime"}),
    frozenset({"profiling"}),
    frozenset({"predict"}),
    frozenset({"search"}),
    frozenset({"workflows"}),
    frozenset({"report"}),
    frozenset({"cli"}),
    frozenset({"__init__", "__main__"}),
)
"""Top-level parts of the package, lowest first."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _resolve(target: str) -> str | None:
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


class _Imports(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module is None:
            return
        for alias in node.names:
            full = f"{node.module}.{alias.name}"
            self._add(full if full in MODULES else node.module)

    def _add(self, name: str) -> None:
        if name == "hybridplan" or name.startswith("hybridplan."):
            resolved = _resolve(name)
            if resolved is not None:
                self.found.add(resolved)


def _graph() -> dict[str, set[str]]:
    graph = {}
    for name, path in MODULES.items():
        visitor = _Imports()
        visitor.visit(ast.parse(path.read_text()))
        graph[name] = visitor.found - {name}
    return graph


GRAPH = _graph()


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(module: str) -> int:
    part = _part(module)
    for i, members in enumerate(LAYERS):
        if part in members:
            return i
    raise AssertionError(f"{module}: part {part!r} has no layer in tests/test_architecture.py LAYERS")


def test_every_part_has_a_layer():
    for module in MODULES:
        _layer(module)


def test_no_import_runs_back_up_the_data_flow():
    upward = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
                    if _part(b) not in ("__init__", "__main__") and _layer(b) > _layer(a))
    assert not upward, "imports from a lower stage to a higher one:\n" + "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_no_cycle():
    assert _cycles(GRAPH) == []


def test_every_package_declares_its_public_names():
    missing = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*")
               if p.is_dir() and p.name != "__pycache__" and not (p / "__init__.py").exists()]
    assert not missing, f"package folders without __init__.py: {missing}"
    without = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("__init__.py") if "__all__" not in p.read_text()]
    assert not without, f"__init__.py without __all__: {without}"


@pytest.mark.parametrize("module", ["hybridplan.plan", "hybridplan.models.names", "hybridplan.errors", "hybridplan.units", "hybridplan.limits",
                                    "hybridplan.profiling.store", "hybridplan.predict.memory",
                                    "hybridplan.workflows.export"])
def test_torch_free_modules(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False", f"importing {module} imports torch"


def test_layers_are_what_the_readme_tour_says():
    """The tour of the code (docs/architecture.md) lists the folders in data-flow order, as LAYERS does."""
    readme = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text()
    order = [p for layer in LAYERS for p in sorted(layer) if (PACKAGE / p).is_dir()]
    positions = [readme.find(f"`{p}/`") for p in order]
    assert all(pos >= 0 for pos in positions), dict(zip(order, positions))
    assert positions == sorted(positions), dict(zip(order, positions))


def test_graph_sanity():
    """The parser sees imports at any depth and skips TYPE_CHECKING blocks."""
    tree = ast.parse("import hybridplan.errors\nif TYPE_CHECKING:\n    import hybridplan.cli\n"
                     "def f():\n    from hybridplan.plan import plan\n")
    visitor = _Imports()
    visitor.visit(tree)
    assert "hybridplan.errors" in visitor.found and "hybridplan.cli" not in visitor.found
    assert any(m.startswith("hybridplan.plan") for m in visitor.found)
