"""``GEARS`` is a front: the parts below it (training, inference, evaluation, report, model,
data, runtime) take explicit inputs and never reach into a ``GEARS`` object. Checked two
ways: in the code (no module below ``gears.py`` reads or sets an attribute that only a
``GEARS`` object has, or takes a ``gears`` argument), and by running the training recipe
with parts built by hand, no ``GEARS`` object anywhere."""

from __future__ import annotations

import ast

import torch
from test_layers import LAYER_OF, PACKAGE, module_name, part_of

from gears_ddp.evaluation.metrics import EvaluationAccumulator
from gears_ddp.model.losses import LossContext
from gears_ddp.model.network import GEARSModel
from gears_ddp.training.recipe import TrainingInputs, TrainingRecipe, TrainingResult
from gears_ddp.training.training_options import TrainingOptions

BELOW_THE_FRONT = {part for part, level in LAYER_OF.items() if level < LAYER_OF["gears"]}


def _modules_below_the_front() -> dict[str, ast.Module]:
    return {
        module_name(path): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
        if part_of(module_name(path)) in BELOW_THE_FRONT
    }


def _names_defined_in_classes(tree: ast.Module, only: str | None = None) -> set[str]:
    """Attribute names the classes of ``tree`` (or the class ``only``) define: methods,
    class-level fields and ``self.x = ...`` assignments."""
    names = set()
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        if only is not None and cls.name != only:
            continue
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node in cls.body:
                names.add(node.name)
            elif isinstance(node, ast.AnnAssign) and node in cls.body and isinstance(node.target, ast.Name):
                names.add(node.target.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                names.add(node.attr)
    return names


def front_only_attributes() -> set[str]:
    """What a ``GEARS`` object has that no class below the front defines, and that is not
    a ``torch.nn.Module``'s (``train``, ``eval``: the networks' own)."""
    front = _names_defined_in_classes(ast.parse((PACKAGE / "gears.py").read_text(encoding="utf-8")), "GEARS")
    below = set().union(*(_names_defined_in_classes(tree) for tree in _modules_below_the_front().values()))
    return {name for name in front - below - set(dir(torch.nn.Module)) if not name.startswith("__")}


def reaches_into_the_front(modules: dict[str, ast.Module], front_only: set[str]) -> list[str]:
    """``module: line: what`` for each use of a front-only attribute on something other than
    ``self``, and each parameter named ``gears``."""
    found = []
    for name, tree in modules.items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in front_only
                and not (isinstance(node.value, ast.Name) and node.value.id == "self")
            ):
                found.append(f"{name}:{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.arg) and node.arg == "gears":
                found.append(f"{name}:{node.lineno}: a parameter named gears")
    return sorted(found)


def test_no_module_below_the_front_reaches_into_a_gears_object():
    front_only = front_only_attributes()
    assert {"best_model", "weights_from", "test_baseline_results", "save_model", "train_with"} <= front_only
    assert reaches_into_the_front(_modules_below_the_front(), front_only) == []


def test_the_check_finds_a_module_that_reaches_into_the_front():
    tree = ast.parse(
        "def export(gears):\n    return gears.best_model\n\n"
        "class Recipe:\n    def run(self):\n        self.best_model = 1\n"
    )
    assert reaches_into_the_front({"gears_ddp.inference.x": tree}, {"best_model"}) == [
        "gears_ddp.inference.x:1: a parameter named gears",
        "gears_ddp.inference.x:2: .best_model",
    ]


def test_the_recipe_trains_parts_built_by_hand(toy):
    """No ``GEARS`` object: the network, loaders, loss context and accumulators made from
    the data directly; the result holds the best network, its epoch, the history and the
    test evaluation of every test condition."""
    toy.get_dataloader(batch_size=16, test_batch_size=64)
    coexpression, go = toy.coexpression_graph(0.4, 20), toy.go_graph(20)
    torch.manual_seed(0)
    network = GEARSModel(
        len(toy.gene_names),
        len(toy.pert_names),
        coexpression.edge_index,
        coexpression.edge_weight,
        go.edge_index,
        go.edge_weight,
        hidden_size=8,
    )
    inputs = TrainingInputs(
        network,
        toy.dataloader,
        LossContext.from_pert_data(toy, 0.1, 1.0),
        lambda: EvaluationAccumulator.from_pert_data(toy),
        uncertainty=False,
        device=torch.device("cpu"),
    )
    result = TrainingRecipe(inputs, TrainingOptions.from_dict({"epochs": 2}, "train")).run()
    assert isinstance(result, TrainingResult)
    assert [record["epoch"] for record in result.history] == [1, 2] and result.best_epoch in (1, 2)
    best = min(result.history, key=lambda record: record["val_mse_de"])
    assert result.best_epoch == best["epoch"]
    assert set(result.test_result.conditions) == set(toy.set2conditions["test"])
    assert result.best_network is not network and not result.best_network.training
    assert len(result.parameter_digests) == 1
