"""A sweep's search space: every mistake named by its key before any trial starts."""

import pytest

from gears_ddp.configuration.run_options import checked_run_options
from gears_ddp.sweeps.space import SearchSpace, SearchSpaceError, with_values

RUN = {"pert_data_path": "./data", "dataset_name": "norman", "args": {"epochs": 3}}


def _check(config):
    checked_run_options(config, "the run file")


def test_a_space_of_args_and_model_options_gives_optunas_distributions():
    space = SearchSpace.from_mapping(
        {
            "args": {
                "lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
                "batch_size": {"type": "categorical", "choices": [16, 32]},
                "model_config": {"hidden_size": {"type": "int", "low": 16, "high": 64}},
            }
        }
    )
    assert [d.key for d in space.dimensions] == ["args.lr", "args.batch_size", "args.model_config.hidden_size"]
    distributions = space.distributions()
    assert distributions["args.lr"].log and distributions["args.model_config.hidden_size"].high == 64
    assert list(distributions["args.batch_size"].choices) == [16, 32]
    space.check_against(RUN, _check)
    assert with_values(RUN, {"args.model_config.hidden_size": 32})["args"] == {
        "epochs": 3,
        "model_config": {"hidden_size": 32},
    }


@pytest.mark.parametrize(
    "args, message",
    [
        ({"learning_rate": {"type": "float", "low": 0.1, "high": 1}}, "args.learning_rate is not an option of the run"),
        (
            {"model_config": {"hidden": {"type": "int", "low": 1, "high": 2}}},
            "args.model_config.hidden is not an option of the run",
        ),
        (
            {"save_path": {"type": "categorical", "choices": ["a", "b"]}},
            "args.save_path says where or how a trial runs",
        ),
        ({"lr": {"type": "float", "low": 0.1, "high": 0.1}}, "args.lr has low 0.1 >= high 0.1"),
        (
            {"lr": {"type": "float", "low": 0.0, "high": 0.1, "log": True}},
            "args.lr is on a log scale but its range reaches 0.0",
        ),
        ({"batch_size": {"type": "categorical", "choices": []}}, "args.batch_size is categorical with no choices"),
        ({"epochs": {"type": "int", "low": 1.5, "high": 3}}, "args.epochs.low must be an integer"),
        ({"lr": {"type": "uniform", "low": 0.1, "high": 1}}, "args.lr must be a mapping with type"),
        ({"lr": {"type": "float", "low": 0.1, "high": 1, "step": 2}}, "args.lr .float. takes high, log, low, type"),
        (
            {"lr": {"type": "float", "low": 0.1, "high": 1, "log": "yes"}},
            "args.lr.log must be true or false, got 'yes'",
        ),
        (
            {"batch_size": {"type": "categorical", "choices": [16, [32]]}},
            "args.batch_size's choices must be numbers, strings, true/false or null",
        ),
        ({"model_config": {}}, "args.model_config must map model options to their ranges"),
        ({}, "no option to search; give at least one under args"),
    ],
)
def test_each_mistake_is_named_by_its_key(args, message):
    with pytest.raises(SearchSpaceError, match=message):
        SearchSpace.from_mapping({"args": args})


@pytest.mark.parametrize("space", [{"lr": {"type": "float", "low": 0.1, "high": 1}}, {"args": [1]}, [1], None])
def test_a_space_is_a_mapping_of_args(space):
    with pytest.raises(SearchSpaceError, match="must be a mapping with one key, args"):
        SearchSpace.from_mapping(space)


def test_a_value_the_runs_own_checks_refuse_is_named_before_any_trial():
    space = SearchSpace.from_mapping({"args": {"amp": {"type": "categorical", "choices": ["off", "fp8"]}}})
    with pytest.raises(
        SearchSpaceError, match="args.amp='fp8' of the search space: the run file: args\\['amp'\\] must be one of"
    ):
        space.check_against(RUN, _check)


def test_an_unquoted_off_among_the_choices_says_to_quote_them():
    """YAML reads ``choices: [off, fp16]`` as [False, 'fp16']: the refusal says to quote them."""
    import yaml

    space = SearchSpace.from_mapping(yaml.safe_load("args: {amp: {type: categorical, choices: [off, fp16]}}"))
    with pytest.raises(SearchSpaceError, match="args.amp=False of the search space: .*: quote the choices"):
        space.check_against(RUN, _check)


def test_a_postgresql_url_without_a_driver_takes_psycopg_where_it_is_installed(monkeypatch):
    """``postgresql://`` means psycopg2 to SQLAlchemy before 2.1, psycopg (3) from 2.1 on: with
    psycopg installed, the one the documentation asks for, the URL names it whatever the
    SQLAlchemy; a URL that names a driver, and other databases, are left as given."""
    import importlib.util

    from gears_ddp.sweeps.study import with_installed_driver

    find_spec = importlib.util.find_spec
    for installed in (find_spec("json"), None):  # a module's spec, or none: psycopg found or not

        def psycopg_as(name, *args, spec=installed):
            return spec if name == "psycopg" else find_spec(name, *args)

        monkeypatch.setattr(importlib.util, "find_spec", psycopg_as)
        url = "postgresql://me@dbhost:5432/sweeps"
        assert with_installed_driver(url) == ("postgresql+psycopg://me@dbhost:5432/sweeps" if installed else url)
        for given in ("postgresql+psycopg2://me@dbhost/sweeps", "mysql://me@dbhost/sweeps", "sqlite:///sweeps.db"):
            assert with_installed_driver(given) == given


def test_a_storage_that_does_not_answer_and_a_study_of_another_space_are_named(tmp_path):
    from gears_ddp.sweeps.study import SweepError, load_or_create_study, open_storage
    from gears_ddp.sweeps.train_sweep import PRUNER

    with pytest.raises(
        SweepError, match="--storage postgresql://nobody@127.0.0.1:9/none: the database does not answer"
    ):
        open_storage(tmp_path, "postgresql://nobody@127.0.0.1:9/none")
    with pytest.raises(SweepError, match="--storage ftp://x: a database URL"):
        open_storage(tmp_path, "ftp://x")
    storage = open_storage(tmp_path, None)
    made_by = {"space": {"args.lr": {"type": "float", "low": 0.001, "high": 0.1, "log": True}}, "seed": 0}
    study = load_or_create_study(storage, "sweep", made_by, 0, PRUNER)
    assert (tmp_path / "study.journal").is_file() and study.user_attrs["made_by"] == made_by
    assert (
        load_or_create_study(open_storage(tmp_path, None), "sweep", made_by, 0, PRUNER).user_attrs["made_by"] == made_by
    )
    other = {**made_by, "space": {"args.lr": {"type": "float", "low": 0.01, "high": 0.1, "log": True}}}
    with pytest.raises(
        SweepError, match="the study 'sweep' was made by another sweep .its search space differs.: give"
    ):
        load_or_create_study(open_storage(tmp_path, None), "sweep", other, 0, PRUNER)


def test_a_process_that_continues_a_study_with_another_seed_continues_it(tmp_path):
    """The seed seeds the process that starts the study; one that resumes or joins it seeds
    its draws afresh, so another --seed is no other sweep; another pruner is, and is named."""
    from gears_ddp.sweeps.study import SweepError, load_or_create_study, open_storage
    from gears_ddp.sweeps.train_sweep import PRUNER

    made_by = {
        "space": {"args.lr": {"type": "float", "low": 0.001, "high": 0.1}},
        "sampler": {"name": "tpe", "seed": 0},
    }
    load_or_create_study(open_storage(tmp_path, None), "sweep", made_by, 0, PRUNER)
    reseeded = {**made_by, "sampler": {"name": "tpe", "seed": 5}}
    assert (
        load_or_create_study(open_storage(tmp_path, None), "sweep", reseeded, 5, PRUNER).user_attrs["made_by"]
        == made_by
    )
    other = {**made_by, "pruner": {"name": "median", "startup_trials": 2}, "sampler": {"name": "random"}}
    with pytest.raises(
        SweepError,
        match="made by another sweep .its pruner, sampler differ.: give the sweep its own folder or storage$",
    ):
        load_or_create_study(open_storage(tmp_path, None), "sweep", other, 0, PRUNER)
