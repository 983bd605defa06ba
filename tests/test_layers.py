"""The package's layers: no module imports a higher layer, no package imports a sibling of
its own layer, and no modules import each other in a circle. Every import counts, those
inside functions too.

    python -m pytest tests/test_layers.py -q
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gears_ddp"

# Lowest first. A module may import its own folder and the layers below its own.
LAYERS = (
    ("_logging", "_options", "_version"),
    ("data",),
    ("datasets", "model", "runtime"),
    ("evaluation",),
    ("report",),
    ("interactions",),  # scores of changes, observed and predicted: below inference, which predicts the changes
    ("training", "inference"),
    ("configuration",),  # a run's options, checked once: what launching starts and distributed schedules
    ("gears",),
    ("launching",),  # starting a run's ranks: cluster environments, launchers, supervision, one rank
    ("distributed",),
    ("runs", "sweeps"),  # saved runs read back; sweeps of runs (their trials placed as replicates are)
    ("train_distributed",),  # the seed guide's module: train_multi_gpu and the functions it names
    ("cli",),
    ("__init__", "__main__", "launch", "utils"),  # the public names, the entry points, the published gears.utils
)
LAYER_OF = {part: level for level, parts in enumerate(LAYERS) for part in parts}
# Modules in another layer than their folder's, each for a reason:
PLACED_APART = {
    # the scheduler job's identity, which the run folder's lock (runtime.folder_lock) records,
    # is read from the launchers' variables there, the one module that reads them: it imports
    # nothing from gears_ddp (test_the_environments_import_nothing_from_the_package)
    "gears_ddp.launching.environments": "_logging",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 2 else parts)


def part_of(module: str) -> str:
    """The layer part of ``gears_ddp.x.y``: ``x`` (``__init__`` for the package itself)."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def layer_of(module: str) -> int:
    """The layer of ``module``: its part's, unless ``PLACED_APART`` places it elsewhere."""
    return LAYER_OF[PLACED_APART.get(module, part_of(module))]


def imported_modules(path: Path) -> set[str]:
    """Every ``gears_ddp`` module ``path`` imports, at any depth of the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("gears_ddp"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gears_ddp"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if _is_module(candidate) else node.module)
    return found


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def import_graph() -> dict[str, set[str]]:
    return {module_name(path): imported_modules(path) for path in sorted(PACKAGE.rglob("*.py"))}


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, imports in graph.items():
        for target in imports:
            if part_of(target) != part_of(module) and layer_of(target) >= layer_of(module):
                wrong.append(f"{module} imports {target}")
    return sorted(wrong)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import circles among modules (a package's ``__init__`` counts as the package)."""
    found, state = [], {}

    def visit(module, trail):
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                found.append(trail[trail.index(target) :] + [target])
            elif target not in state:
                visit(target, trail + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return found


def test_every_part_of_the_package_has_a_layer():
    parts = {part_of(name) for name in import_graph()}
    assert parts - set(LAYER_OF) == set()


def test_no_module_imports_a_higher_layer_or_a_sibling_layer():
    assert layer_violations(import_graph()) == []


def test_the_environments_import_nothing_from_the_package():
    assert import_graph()["gears_ddp.launching.environments"] == set()


def test_no_import_circles():
    graph = {
        module: {t for t in targets if t != module and not module.startswith(t + ".")}
        for module, targets in import_graph().items()
    }  # a module may import its own package
    assert circles(graph) == []


def test_the_checks_catch_an_upward_import_and_a_circle():
    graph = {"gears_ddp.data.io": {"gears_ddp.training.recipe"}, "gears_ddp.training.recipe": {"gears_ddp.data.io"}}
    assert layer_violations(graph) == ["gears_ddp.data.io imports gears_ddp.training.recipe"]
    assert circles(graph) == [["gears_ddp.data.io", "gears_ddp.training.recipe", "gears_ddp.data.io"]]
    placed = {"gears_ddp.launching.environments": {"gears_ddp.runtime.devices"}}
    assert layer_violations(placed) == ["gears_ddp.launching.environments imports gears_ddp.runtime.devices"]
