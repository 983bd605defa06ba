"""The sweep report's ranking of the settings (Optuna's PED-ANOVA importances): given where
the finished trials can rank them, and left out, without Optuna's warning, where they cannot
(Optuna then gives every setting the same importance, which a picture would show as a finding)."""

import warnings

import optuna
import pytest

from gears_ddp.sweeps.report import importances_of


def _study(values_of) -> optuna.Study:
    """An in-memory study of trials over lr and hidden_size, valued by ``values_of``."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    distributions = {
        "args.lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True),
        "args.model_config.hidden_size": optuna.distributions.IntDistribution(8, 128),
    }
    for value, params in values_of(distributions):
        study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions, value=value))
    return study


def test_a_setting_that_decides_the_value_ranks_first():
    import numpy as np

    rng = np.random.default_rng(0)

    def trials(distributions):
        for _ in range(40):
            lr, hidden = float(10 ** rng.uniform(-4, -1)), int(rng.integers(8, 129))
            yield abs(np.log10(lr) + 2.5), {"args.lr": lr, "args.model_config.hidden_size": hidden}

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importances = importances_of(_study(trials))
    assert importances is not None and set(importances) == {"args.lr", "args.model_config.hidden_size"}
    assert importances["args.lr"] > 0.8 > importances["args.model_config.hidden_size"]


@pytest.mark.parametrize("n_trials", [0, 1])
def test_too_few_finished_trials_rank_nothing_and_say_nothing(n_trials):
    def trials(distributions):
        for number in range(n_trials):
            yield 0.5, {"args.lr": 1e-3, "args.model_config.hidden_size": 8 + number}

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Optuna's "importances will be equal" would fail here
        assert importances_of(_study(trials)) is None
