"""``compile: True``: the training steps run a ``torch.compile``d model and give the losses of
eager training."""
import numpy as np
import pytest
import torch

from gears_ddp import GEARS
from gears_ddp.training import recipe
from gears_ddp.training.options import TrainingOptions


def _step_losses(pert_data, monkeypatch, compile: bool):
    """The model the training steps ran and their losses, in ``GEARS.train``."""
    seen = []
    steps = recipe.optimizer_steps

    def recorded(model, *args, **kwargs):
        seen.append(model)
        for loss in steps(model, *args, **kwargs):
            seen.append(float(loss))
            yield loss

    monkeypatch.setattr(recipe, "optimizer_steps", recorded)
    pert_data.get_dataloader(32, test_batch_size=64)
    torch.manual_seed(0)
    gears = GEARS(pert_data, device="cpu")
    gears.model_initialize(hidden_size=64)
    gears.train(epochs=1, max_steps=4, compile=compile)
    for model in (gears.model, gears.best_model):  # what the user gets back is the network itself
        assert not isinstance(model, torch._dynamo.eval_frame.OptimizedModule)
    return seen[0], seen[1:]


@pytest.mark.slow
def test_compiled_training_steps_give_the_eager_losses(toy, monkeypatch):
    """Four steps, with batches of several numbers of perturbation sets (a recompilation):
    the losses agree to 1e-5 (the compiled kernels add in another order)."""
    torch._dynamo.reset()
    eager_model, eager = _step_losses(toy, monkeypatch, compile=False)
    compiled_model, compiled = _step_losses(toy, monkeypatch, compile=True)
    assert isinstance(compiled_model, torch._dynamo.eval_frame.OptimizedModule)
    assert not isinstance(eager_model, torch._dynamo.eval_frame.OptimizedModule)
    assert len(eager) == len(compiled) == 4
    np.testing.assert_allclose(compiled, eager, rtol=1e-5)


def test_compile_is_a_boolean_option():
    assert TrainingOptions.from_dict({}).compile is False
    with pytest.raises(ValueError, match=r"args\['compile'\] must be True or False"):
        TrainingOptions.from_dict({"compile": "yes"})
