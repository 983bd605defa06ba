"""``compile: True`` (``torch.compile`` of the model for the training steps) against eager
training, side by side in one process: the time of the first steps (which wait for the
compilation), seconds per optimiser step after them, and the step losses of the two.

    python benchmarks/bench_compile.py [--device cpu] [--batch-sizes 32 256] [--hidden 64]
                                       [--warmup 5] [--steps 10] [--genes 1000 ...]

The data are the built-in synthetic dataset (``harness.synthetic.load_synthetic``: 1,000 genes by
default, simulation split, seed 1). For each batch size, two models from
``torch.manual_seed(0)`` and ``model_initialize(hidden_size)``, each with the published
optimiser, one eager and one ``torch.compile(model)`` (the recipe's call), take
``warmup + steps`` optimiser steps (``engine.optimizer_steps``) on the same batches, gathered
beforehand, in turn: a step of one, then of the other. ``first s`` is the time of the
``warmup`` first steps (the compilation, and its recompilations for batches with other
numbers of perturbation sets), ``s/step`` the median of the next ``steps``, ``speed-up``
eager's s/step over this one's, and ``max loss diff`` the largest relative difference
between the two models' step losses.

Timings on a shared machine move with the other work on it: taking the steps in turn
weighs it on both modes alike, and the median leaves out the steps it hit hardest. ``--record`` appends the output to
``benchmarks/RESULTS.md``.
"""

import argparse
import statistics

import torch
from harness.models import new_model
from harness.record import add_record_argument, recorded
from harness.settings import LR, WEIGHT_DECAY
from harness.synthetic import add_size_arguments, load_synthetic
from harness.tables import StreamedTable
from harness.timing import Stopwatch

from gears_ddp.training.engine import optimizer_steps
from gears_ddp.training.optimization import make_optimizer


def trained(pert_data, device, hidden: int, batches, compiled: bool):
    """The optimiser steps (a generator of losses) of a new model, compiled or not."""
    gears = new_model(pert_data, device=device, hidden_size=hidden)
    optimizer, _ = make_optimizer(gears.model, LR, WEIGHT_DECAY)
    model = torch.compile(gears.model) if compiled else gears.model
    return optimizer_steps(model, batches, optimizer, gears.loss_context(), False, device)


def run(pert_data, device, batch_size: int, hidden: int, warmup: int, steps: int) -> dict:
    """Eager and compiled steps in turn, on the same batches (so that the machine's other work
    weighs on both alike): each mode's first steps' time, median s/step after them, losses."""
    pert_data.get_dataloader(batch_size=batch_size, test_batch_size=256)
    batches = [batch for _, batch in zip(range(warmup + steps), pert_data.dataloader["train_loader"])]
    if len(batches) < warmup + steps:
        raise SystemExit(f"the train set has {len(batches)} batches of {batch_size}; ask for fewer steps")
    torch._dynamo.reset()
    modes = {
        "eager": trained(pert_data, device, hidden, batches, False),
        "compiled": trained(pert_data, device, hidden, batches, True),
    }
    times = {mode: [] for mode in modes}
    losses = {mode: [] for mode in modes}
    for _ in batches:
        for mode, step in modes.items():
            with Stopwatch(device) as watch:
                losses[mode].append(float(next(step)))
            times[mode].append(watch.seconds)
    return {
        mode: {
            "first_s": sum(times[mode][:warmup]),
            "step_s": statistics.median(times[mode][warmup:]),
            "losses": losses[mode],
        }
        for mode in modes
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    add_size_arguments(parser)
    parser.add_argument("--data-path", default="./data/bench_compile")
    add_record_argument(parser)
    args = parser.parse_args()
    device = torch.device(args.device)
    with recorded(args.record):
        pert_data = load_synthetic(args.data_path, args)
        where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"
        print(
            f"data: {pert_data.adata.n_obs} cells x {pert_data.adata.n_vars} genes; hidden {args.hidden}; device "
            f"{device} ({where}); {args.warmup} first steps, then {args.steps} timed"
        )
        print()
        table = StreamedTable(["batch", "mode", "first s", "s/step", "speed-up", "max loss diff"], left=2)
        for batch_size in args.batch_sizes:
            result = run(pert_data, device, batch_size, args.hidden, args.warmup, args.steps)
            eager, compiled = result["eager"], result["compiled"]
            difference = max(abs(a - b) / abs(a) for a, b in zip(eager["losses"], compiled["losses"]))
            for mode, r in (("eager", eager), ("compiled", compiled)):
                table.add(
                    [
                        batch_size,
                        mode,
                        f"{r['first_s']:.1f}",
                        f"{r['step_s']:.3f}",
                        f"{eager['step_s'] / r['step_s']:.2f}",
                        f"{difference if mode == 'compiled' else 0:.1e}",
                    ]
                )


if __name__ == "__main__":
    main()
