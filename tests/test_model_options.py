"""The model's options have one definition, ``ModelOptions``: ``model_initialize``'s
signature and checks, the saved ``config.pkl``, ``args['model_config']``, the help and
``tunable_parameters`` all come from it."""

import inspect

import pytest

from gears_ddp.configuration.run_options import option_help
from gears_ddp.configuration.sections import TrainingArgs
from gears_ddp.gears import GEARS
from gears_ddp.model.model_options import ModelOptions


def test_model_initialize_shows_every_model_option_with_its_default():
    parameters = inspect.signature(GEARS.model_initialize).parameters
    shown = {name: p.default for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert shown == ModelOptions.defaults()
    assert set(GEARS.tunable_parameters()) == set(ModelOptions.names())


def test_the_saved_config_and_args_hold_the_same_options(toy):
    toy.get_dataloader(batch_size=16)
    gears = GEARS(toy)
    gears.model_initialize(hidden_size=8, uncertainty=True)
    assert {k: gears.config[k] for k in ModelOptions.names()} == {
        **ModelOptions.defaults(),
        "hidden_size": 8,
        "uncertainty": True,
    }
    args = TrainingArgs.from_dict({"model_config": {"hidden_size": 8, "uncertainty": True}})
    assert args.model_config == {k: gears.config[k] for k in ModelOptions.names()}
    help_text = option_help()
    assert all(
        f"args.model_config.{name} [{default!r}]" in help_text for name, default in ModelOptions.defaults().items()
    )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"hidden_size": 0}, r"model_initialize: hidden_size must be an integer >= 1, got 0"),
        ({"uncertainty": "yes"}, r"model_initialize: uncertainty must be True or False"),
        ({"coexpress_threshold": 1.5}, r"coexpress_threshold is a correlation in \[0, 1\]"),
    ],
)
def test_model_initialize_and_args_check_the_same_way(toy, options, message):
    toy.get_dataloader(batch_size=16)
    with pytest.raises(ValueError, match=message):
        GEARS(toy).model_initialize(**options)
    with pytest.raises(ValueError, match=message.replace("model_initialize", r"args\['model_config'\]")):
        TrainingArgs.from_dict({"model_config": options})
    with pytest.raises(TypeError, match=r"model_initialize\(\) got unknown keyword argument\(s\) \['hidden'\]"):
        GEARS(toy).model_initialize(hidden=8)


def test_the_network_and_the_loss_take_their_defaults_from_the_one_definition():
    from gears_ddp.model.losses import LossContext
    from gears_ddp.model.network import NETWORK_OPTIONS, GEARSModel

    defaults = ModelOptions.defaults()
    network = inspect.signature(GEARSModel).parameters
    assert set(NETWORK_OPTIONS) <= set(defaults)
    assert {name: network[name].default for name in NETWORK_OPTIONS} == {
        name: defaults[name] for name in NETWORK_OPTIONS
    }
    loss = inspect.signature(LossContext.from_pert_data).parameters
    for name in ("direction_lambda", "uncertainty_reg"):
        assert loss[name].default == defaults[name] == LossContext.__dataclass_fields__[name].default
