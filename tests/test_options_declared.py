"""Options declared once: the split options are a dataclass that ``PertData.prepare_split``'s
signature agrees with, every options class checks without changing itself, and a pair
screen's options (``PairScreenOptions``) are checked once, at the edge; a bad launch option
of ``args``, a run file's section that is no mapping and a malformed ``--set`` are named."""

import dataclasses
import inspect
from pathlib import Path

import pytest
import yaml

from gears_ddp.configuration.sections import ReplicateOptions, TrainingArgs
from gears_ddp.data.pertdata import SPLIT_DEFAULTS, SPLIT_OPTIONS, PertData
from gears_ddp.data.splits import SplitOptions
from gears_ddp.inference.pair_screen_options import PAIR_SCREEN_COMMAND, PairScreenOptions
from gears_ddp.inference.prediction import DRAWN_CELLS_CHANGE
from gears_ddp.training.training_options import TrainingOptions


def test_the_split_options_are_prepare_splits_parameters_with_its_defaults():
    parameters = {
        name: parameter.default
        for name, parameter in inspect.signature(PertData.prepare_split).parameters.items()
        if name != "self"
    }
    assert list(parameters) == list(SPLIT_OPTIONS) == SplitOptions.names()
    assert parameters == SPLIT_DEFAULTS == SplitOptions.defaults()


@pytest.mark.parametrize(
    "options, changed",
    [
        (TrainingOptions(save_path=Path("run")), {"save_path": "run"}),
        (
            TrainingArgs(**{**TrainingArgs.defaults(), "model_config": None}),
            {"model_config": TrainingArgs.from_dict({}).model_config},
        ),
        (ReplicateOptions(seeds=(1, 2), split_seeds=(3, 4)), {"seeds": [1, 2], "split_seeds": [3, 4]}),
        (PairScreenOptions(seeds=[0], gpu_ids=(0,)), {"seeds": (0,), "gpu_ids": [0]}),
    ],
)
def test_check_never_changes_the_options_checked_returns_a_new_object(options, changed):
    before = dataclasses.replace(options)
    where = "replicates" if isinstance(options, ReplicateOptions) else "args"
    options.check(where)
    assert options == before
    checked = options.checked(where)
    assert options == before
    assert {key: getattr(checked, key) for key in changed} == changed
    assert TrainingArgs.from_dict({}).model_config["hidden_size"] == 64


def test_pair_screen_options_take_seeds_with_the_drawn_cells_change_only():
    assert PairScreenOptions.from_dict({"seeds": None}, "screen").seeds == (0,)
    drawn = PairScreenOptions.from_dict({"change": DRAWN_CELLS_CHANGE, "seeds": [4, 7]}, "screen")
    assert drawn.seeds == (4, 7) and drawn.seed == 4
    with pytest.raises(ValueError, match=r"several seeds \(\[4, 7\]\) draw control cells for the drawn-cells change"):
        PairScreenOptions.from_dict({"seeds": [4, 7]}, "pair_screen_replicates")
    with pytest.raises(ValueError, match="seed 3 draws control cells for the drawn-cells change only"):
        PairScreenOptions.from_dict({"seeds": [3]}, "screen")
    with pytest.raises(ValueError, match=f"--seed draws control cells for --change {DRAWN_CELLS_CHANGE} only"):
        PairScreenOptions.from_dict({"seeds": [3]}, PAIR_SCREEN_COMMAND)
    with pytest.raises(ValueError, match="seeds must name at least one seed"):
        PairScreenOptions.from_dict({"seeds": []}, "screen")
    with pytest.raises(ValueError, match="must be a non-negative integer, got -1"):
        PairScreenOptions.from_dict({"change": DRAWN_CELLS_CHANGE, "seeds": [-1]}, "screen")
    with pytest.raises(ValueError, match=r"several seeds \(\[4, 7\]\) measure the drawn cells' noise"):
        drawn.with_one_draw("pair_screen_on_devices")


@pytest.mark.parametrize(
    "values, message",
    [
        ({"chunk_pairs": 0}, "chunk_pairs must be a positive integer, got 0"),
        ({"change": "other"}, r"change must be one of \['exact', "),
        ({"cpu_processes": 0}, "cpu_processes must be an integer >= 1, got 0"),
        ({"overwrite": "yes"}, r"screen\(overwrite=...\) must be True or False"),
    ],
)
def test_bad_pair_screen_options_are_named(values, message):
    with pytest.raises(ValueError, match=message):
        PairScreenOptions.from_dict(values, "screen")


def test_unknown_pair_screen_options_are_refused_as_python_refuses_them():
    with pytest.raises(TypeError, match=r"pair_screen_on_devices\(\) got unknown keyword argument\(s\) \['seed'\]"):
        PairScreenOptions.from_dict({"seed": 2}, "pair_screen_on_devices")


@pytest.mark.parametrize(
    "args, message",
    [
        ({"model_config": 64}, r"args\['model_config'\] must be a dict of GEARS.model_initialize options, got 64"),
        ({"expression_storage": "disk"}, r"args\['expression_storage'\] must be one of \("),
        ({"timeout_s": 0}, r"args\['timeout_s'\] must be a positive number, got 0"),
        ({"timeout_s": float("inf")}, r"args\['timeout_s'\] must be a positive number, got inf"),
        ({"timeout_s": True}, r"args\['timeout_s'\] must be a positive number, got True"),
        ({"find_unused_parameters": "no"}, r"args\['find_unused_parameters'\] must be True or False, got 'no'"),
        ({"cpu_threads": 0}, r"args\['cpu_threads'\] must be a positive integer or None, got 0"),
        ({"cpu_threads": 1.5}, r"args\['cpu_threads'\] must be a positive integer or None, got 1.5"),
        ({"cpu_threads": True}, r"args\['cpu_threads'\] must be a positive integer or None, got True"),
        ({"seed": None}, r"args\['seed'\] must be set, got None"),
    ],
)
def test_bad_launch_args_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        TrainingArgs.from_dict(args)


@pytest.mark.parametrize(
    "config, overrides, message",
    [
        ({"args": [1, 2]}, [], r"run.yaml: args must be a mapping, got \[1, 2\]"),
        ({"split_config": "simulation"}, [], "run.yaml: split_config must be a mapping, got 'simulation'"),
        ({}, ["args.epochs=[1"], r"--set 'args.epochs=\[1': the value is not valid YAML \(.* at line 1, column"),
        ({}, ["args.epochs"], r"--set 'args.epochs': write it as key=value"),
        ({}, ["epochs=3"], r"--set 'epochs=3': unknown key 'epochs'; the keys are"),
    ],
)
def test_a_run_file_and_its_overrides_are_named_where_they_are_wrong(tmp_path, config, overrides, message):
    from gears_ddp.configuration.run_options import RunConfigError, read_run_options

    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"pert_data_path": str(tmp_path), "dataset_name": "toy", **config}))
    with pytest.raises(RunConfigError, match=message):
        read_run_options(run, overrides)
