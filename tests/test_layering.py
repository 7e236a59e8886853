"""The layers of ../shared/DESIGN.md: every import inside geoarray points down, never up or sideways.

Each top-level unit of the package (``geoarray.optim``, ``geoarray.models``, ``geoarray.train``, …)
has a layer; an ``import`` or ``from … import`` anywhere in a module (function-level lazy imports
included) may name only the module's own unit or a unit of a lower layer. A new unit must be given a
layer here, so the layering is decided, not drifted into. Backend-independent: pure source analysis.
"""

from __future__ import annotations

import ast
from pathlib import Path

import geoarray

# DESIGN.md's diagram, bottom (0) to top
LAYERS = {
    "_typing": -1,  # the Array annotation alias (no imports)
    "_install": -1,  # the install command of an optional dependency (no imports)
    "_backend": 0,
    "_io": 1,
    "random": 2,
    "linalg": 2,
    "manifolds": 3,
    "optim": 4,
    "nn": 5,
    "data": 6,
    "models": 7,
    "gauge": 8,
    "_checkpoints": 9,
    "_train_args": 9,  # the argument checks of train.fit
    "train": 10,
    "torch": 11,
    "jax": 11,
    "commands": 12,
    "cli": 13,
    "__main__": 14,
}
ROOT = Path(geoarray.__file__).resolve().parent


def _unit(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "geoarray" else None


def _imports(path: Path) -> list[str]:
    """The geoarray modules (or packages) ``path`` imports, relative imports resolved."""
    rel = path.relative_to(ROOT.parent).with_suffix("")
    package = ".".join(rel.parts[:-1])  # for __init__.py, rel ends in "__init__": the package itself
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                if node.module:
                    out.append(".".join([*base, node.module]))
                else:
                    out.extend(".".join([*base, alias.name]) for alias in node.names)
            elif node.module and node.module.split(".")[0] == "geoarray":
                out.append(node.module)
        elif isinstance(node, ast.Import):
            out.extend(alias.name for alias in node.names if alias.name.split(".")[0] == "geoarray")
    return out


def test_every_import_points_down():
    units = {
        p.stem if p.is_file() else p.name for p in ROOT.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    units.discard("__init__")
    assert units - set(LAYERS) == set(), f"give these units a layer in LAYERS: {sorted(units - set(LAYERS))}"
    upward = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent)
        if len(rel.parts) == 2 and rel.name == "__init__.py":
            continue  # geoarray/__init__.py exposes every unit lazily (PEP 562)
        me = _unit(".".join(rel.with_suffix("").parts))
        for target in _imports(path):
            other = _unit(target)
            if other is None or other == me or other not in LAYERS:  # geoarray itself, or a name such as __version__
                continue
            if LAYERS[other] >= LAYERS[me]:
                upward.append(f"{rel} (layer {LAYERS[me]}) imports {target} (layer {LAYERS[other]})")
    assert upward == [], "imports that point up or sideways:\n" + "\n".join(sorted(set(upward)))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _load_time_imports(path: Path, modules: set[str], *, everywhere: bool = False) -> set[str]:
    """The geoarray modules ``path`` imports while it is being imported: its top-level statements (and
    their ``if``/``try`` bodies), not function-level imports nor ``if TYPE_CHECKING:`` blocks. ``from P
    import m`` names the module P.m where that is one, else P. ``everywhere``: every import statement of
    the file instead, in functions and ``TYPE_CHECKING`` blocks too."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                    visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                visit(node.orelse)
                visit(node.finalbody)
                for handler in node.handlers:
                    visit(handler.body)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                for alias in node.names:
                    out.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
            elif isinstance(node, ast.Import):
                out.update(alias.name for alias in node.names)

    tree = ast.parse(path.read_text(encoding="utf-8"))
    visit([n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))] if everywhere else tree.body)
    return (out & modules) - {me}


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                walk(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    return cycles


def test_no_import_cycle_through_function_level_imports():
    """No cycle either when every import statement counts, those inside functions (which run later, so
    they break no load) and ``TYPE_CHECKING`` blocks included: a lazy import back into an importer is a
    cycle deferred, not removed. The last one, geoarray.torch._foreign importing the optimizer class that
    imports it (to leave geoarray's own steps alone), is gone: ``geoarray.torch`` hands the class to
    ``_foreign.install``. The walk follows a function-level import (checked on that very one)."""
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {name: _load_time_imports(path, set(paths), everywhere=True) for name, path in paths.items()}
    # a function-level import the walk must see (geoarray.torch._dtensor reads the host reads policy in one)
    assert "geoarray._backend" in graph["geoarray.torch._dtensor"]
    assert "geoarray._backend" not in _load_time_imports(paths["geoarray.torch._dtensor"], set(paths))
    cycles = _cycles(graph)
    assert cycles == [], "import cycles (function-level imports included):\n" + "\n".join(cycles)


def test_no_import_cycle_between_modules():
    """No module of geoarray imports, while it loads, a module that imports it back (directly or through
    others): the load-time import graph of the package's files (a package standing for its __init__.py)
    has no cycle, so each file can be read and imported on its own terms. Function-level imports are the
    way a module reaches up (test_every_import_points_down keeps those pointing down too). The last cycle,
    geoarray.torch.optim ↔ conventions ↔ methods (now torch_optimizers and paper_optimizers; the base class
    re-exported its subclasses), is gone:
    the base class is geoarray.torch.optimizer and geoarray.torch.optim only gathers the optimizers."""
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {name: _load_time_imports(path, set(paths)) for name, path in paths.items()}
    gathered = {"geoarray.torch.optimizer", "geoarray.torch.paper_optimizers", "geoarray.torch.torch_optimizers"}
    assert graph["geoarray.torch.optim"] >= gathered  # the walk sees them
    cycles = _cycles(graph)
    assert cycles == [], "import cycles:\n" + "\n".join(cycles)
