"""``gears-ddp train`` for a torchrun test: on the first attempt
(``TORCHELASTIC_RESTART_COUNT`` 0), rank 1 kills itself with SIGKILL after its
``DIE_AFTER_STEPS``-th optimiser step, as a node lost mid-epoch would."""

import os
import signal
import sys

import gears_ddp.training.recipe as recipe
from gears_ddp.cli import main

DIE_AFTER_STEPS = int(os.environ.get("DIE_AFTER_STEPS", "6"))

if os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0" and os.environ.get("RANK") == "1":
    steps = recipe.optimizer_steps

    def steps_then_die(*args, **kwargs):
        for number, loss in enumerate(steps(*args, **kwargs), start=1):
            yield loss
            if number == DIE_AFTER_STEPS:
                os.kill(os.getpid(), signal.SIGKILL)

    recipe.optimizer_steps = steps_then_die

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
