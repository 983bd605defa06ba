"""Training steps in float32 and bfloat16 against the floor of their matrix products, where
a step's time goes, and the test metrics of both precisions over seeds.

    python benchmarks/bench_precision.py [--amp off bf16] [--steps 10] [--repeats 7] [--threads N]
                                         [--breakdown] [--seeds 1 2 3 --epochs 3]
                                         [--genes 2000 --cells-per-condition 100 ...]

The data are the built-in synthetic dataset (``harness.synthetic.load_synthetic``: 2,000
genes by default, simulation split, seed 1), batch 32, hidden 64, the published optimiser.

**Steps against their floor.** One model (``torch.manual_seed(0)``) takes ``--steps``
optimiser steps (``engine.training_step``) on batches gathered beforehand, once per
precision (``amp``: 'off' is float32, 'bf16' bfloat16 autocast). A step's floor is the
matrix products it dispatches (``mm``, ``addmm``, ``bmm``, ``baddbmm`` whose result has
more than one row and column; the statistics' matrix-vector products are left out),
recorded from a float32 step on each batch and run alone, on operands of the same shapes
and strides, in float32 for 'off' and all in bfloat16 for 'bf16': the arithmetic the model
cannot skip, at the speed of the precision's matrix kernels. Steps and floors are timed in
turn, ``--repeats`` times each (``harness.timing.alternating_medians``), so that the
machine's other work weighs on all of them alike; the table gives the medians per step
and the ratios.

**Where a step's time goes** (``--breakdown``): each operator of the steps timed on its own
(a ``TorchDispatchMode``, which adds its own cost per operator, so the figures are shares
rather than the step's time): matrix products, casts between dtypes, operators on
row-sized tensors (at least ``ROW_SIZED`` elements: the per-(set, gene) rows), and the rest.

With ``--breakdown`` it also times single operators on one piece of rows as the fused
decoder cuts them on a CPU (``weighted_norm.ROWS_PER_PASS`` rows of width 128; the
products from width 64): a product in each precision against the elementwise passes and
casts that surround it, in turn, medians of ``PIECE_REPEATS``.

**Test metrics over seeds** (``--seeds``): for each seed, a model trained ``--epochs``
epochs in each precision (``harness.models.trained_model``: the seed sets the initial
weights and the loaders' pairing and shuffling, the data and split are the same), and its
test ``pearson_delta``, ``mse`` and ``mse_de``; mean +- sd per precision and the paired
difference bf16 - fp32 with its verdict (``harness.spread``).

``--threads`` sets torch's threads (default: torch's own choice). On a machine shared with
other work, two threads that wait for each other at every parallel operator can be slowed
far more than one: compare runs at the same setting.

``--record`` appends the output to ``benchmarks/RESULTS.md``.
"""

import argparse
import collections
import time

import torch
from harness.machine import load_average
from harness.models import new_model, trained_model
from harness.record import add_record_argument, recorded
from harness.settings import BATCH_SIZE, LR, WEIGHT_DECAY
from harness.spread import mean_sd, paired_difference
from harness.synthetic import add_size_arguments, load_synthetic
from harness.tables import print_table
from harness.timing import alternating_medians
from torch.utils._python_dispatch import TorchDispatchMode

from gears_ddp.runtime.host_memory import retained_host_memory
from gears_ddp.training.engine import Precision, training_step
from gears_ddp.training.optimization import make_optimizer

CPU = torch.device("cpu")
PRODUCTS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.mm.out,
    torch.ops.aten.addmm.default,
    torch.ops.aten.addmm.out,
    torch.ops.aten.bmm.default,
    torch.ops.aten.bmm.out,
    torch.ops.aten.baddbmm.default,
}
CASTS = {torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default}
ROW_SIZED = 2**17  # elements: a piece of (set, gene) rows is 4,096 x 64 or 128
PIECE_REPEATS = 200
MODES = {"off": "float32", "bf16": "bfloat16"}


def _spec(value):
    return ("tensor", tuple(value.shape), value.stride()) if isinstance(value, torch.Tensor) else ("value", value)


class RecordedProducts(TorchDispatchMode):
    """The matrix products dispatched while active (see the module docstring), as
    (operator, argument specs, keyword specs)."""

    def __init__(self):
        super().__init__()
        self.products = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in PRODUCTS and out.dim() >= 2 and out.shape[-1] > 1 and out.shape[-2] > 1:
            self.products.append((func, [_spec(a) for a in args], {k: _spec(v) for k, v in kwargs.items()}))
        return out


def replay(products, dtype: torch.dtype):
    """A function running ``products`` on new operands of their shapes and strides in ``dtype``."""
    generator = torch.Generator().manual_seed(0)

    def operand(spec):
        if spec[0] == "value":
            return spec[1]
        return torch.empty_strided(spec[1], spec[2], dtype=torch.float32).uniform_(-1, 1, generator=generator).to(dtype)

    prepared = [
        (func, [operand(a) for a in args], {k: operand(v) for k, v in kwargs.items()})
        for func, args, kwargs in products
    ]

    def run():
        for func, args, kwargs in prepared:
            func(*args, **kwargs)

    return run


class OperatorTimes(TorchDispatchMode):
    """Seconds spent in each category of operator while active (see the module docstring)."""

    def __init__(self):
        super().__init__()
        self.seconds = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        start = time.perf_counter()
        out = func(*args, **kwargs)
        self.seconds[self._category(func, args, out)] += time.perf_counter() - start
        return out

    @staticmethod
    def _category(func, args, out) -> str:
        if func in PRODUCTS:
            return "matrix products"
        tensors = [a for a in (*args, out) if isinstance(a, torch.Tensor)]
        if func in CASTS and len({t.dtype for t in tensors}) > 1:
            return "casts between dtypes"
        if any(t.numel() >= ROW_SIZED for t in tensors):
            return "other operators on row-sized tensors"
        return "operators on small tensors"


def step_timings(pert_data, args) -> None:
    """Steps and floors of each precision, in turn (see the module docstring)."""
    gears = new_model(pert_data)
    model, context = gears.model, gears.loss_context()
    optimizer, _ = make_optimizer(model, LR, WEIGHT_DECAY)
    batches = [batch for _, batch in zip(range(args.steps), pert_data.dataloader["train_loader"])]
    precisions = {amp: Precision.for_mode(amp, CPU) for amp in args.amp}
    model.train()

    def steps(precision):
        return lambda: [training_step(model, [batch], optimizer, context, False, CPU, precision) for batch in batches]

    with retained_host_memory():  # as the recipe trains on a CPU
        for precision in precisions.values():
            steps(precision)()  # first-call work
        recorder = RecordedProducts()
        with recorder:
            steps(Precision())()  # the products of float32 steps
        floors = {amp: replay(recorder.products, torch.float32 if amp == "off" else torch.bfloat16) for amp in args.amp}
        functions = {
            **{f"step {amp}": steps(p) for amp, p in precisions.items()},
            **{f"floor {amp}": floors[amp] for amp in args.amp},
        }
        seconds = alternating_medians(functions, args.repeats)
    n = len(batches)
    sets = sum(len(b.sets.counts) for b in batches) / n
    print(
        f"{n} steps per call, {sets:.1f} distinct sets a batch on average; {len(recorder.products) / n:.0f} matrix "
        f"products a step; {torch.get_num_threads()} threads; medians of {args.repeats} calls each, in turn; load "
        f"average {load_average()}\n"
    )
    rows = [
        [
            MODES.get(amp, amp),
            f"{seconds[f'step {amp}'] / n * 1e3:.1f}",
            f"{seconds[f'floor {amp}'] / n * 1e3:.1f}",
            f"{seconds[f'step {amp}'] / seconds[f'floor {amp}']:.2f}x",
        ]
        for amp in args.amp
    ]
    print_table(["precision", "step (ms)", "floor: its matrix products (ms)", "step / floor"], rows)
    if "off" in args.amp and "bf16" in args.amp:
        print(
            f"\nbfloat16 against float32: step {seconds['step off'] / seconds['step bf16']:.2f}x faster, floor "
            f"{seconds['floor off'] / seconds['floor bf16']:.2f}x faster."
        )
    if args.breakdown:
        print()
        breakdown(model, batches, optimizer, context, precisions)
        piece_costs()


def breakdown(model, batches, optimizer, context, precisions) -> None:
    """Milliseconds a step per category of operator, each precision (``OperatorTimes``)."""
    times = {}
    with retained_host_memory():
        for amp, precision in precisions.items():
            with OperatorTimes() as timer:
                for batch in batches:
                    training_step(model, [batch], optimizer, context, False, CPU, precision)
            times[amp] = timer.seconds
    categories = [
        "matrix products",
        "casts between dtypes",
        "other operators on row-sized tensors",
        "operators on small tensors",
    ]
    rows = []
    for category in categories:
        rows.append(
            [category]
            + [
                f"{times[amp][category] / len(batches) * 1e3:.1f} "
                f"({times[amp][category] / sum(times[amp].values()):.0%})"
                for amp in precisions
            ]
        )
    print_table(["operators timed one by one (ms a step, share)"] + [MODES.get(amp, amp) for amp in precisions], rows)


def piece_costs() -> None:
    """Microseconds of single operators on one piece of rows (see the module docstring), each
    writing into a tensor made beforehand, so that only its own pass is timed."""
    from gears_ddp.model.weighted_norm import ROWS_PER_PASS

    generator = torch.Generator().manual_seed(0)
    functions = {}
    for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
        x = torch.randn(ROWS_PER_PASS, 128, generator=generator).to(dtype)
        out = torch.empty(ROWS_PER_PASS, 128, dtype=dtype)
        narrow, weight = torch.randn(ROWS_PER_PASS, 64, generator=generator).to(dtype), torch.randn(128, 64).to(dtype)
        column = torch.randn(128, generator=generator).to(dtype)
        other = torch.empty(ROWS_PER_PASS, 128, dtype=torch.bfloat16 if dtype == torch.float32 else torch.float32)
        functions.update(
            {
                f"product (rows x 64) @ (64 x 128), {name}": lambda a=narrow, w=weight, o=out: torch.mm(a, w.T, out=o),
                f"x * y, {name}": lambda x=x, o=out: torch.mul(x, x, out=o),
                f"addcmul (a BatchNorm's affine), {name}": lambda x=x, c=column, o=out: torch.addcmul(c, x, c, out=o),
                f"relu_, {name}": lambda o=out: o.relu_(),
                f"sum over rows, {name}": lambda x=x: x.sum(0),
                f"cast into the other precision, {name}": lambda x=x, o=other: o.copy_(x),
            }
        )
    with retained_host_memory():
        seconds = alternating_medians(functions, PIECE_REPEATS)
    print(
        f"\nSingle operators on one piece of {ROWS_PER_PASS:,} rows x 128 (the product: x 64 -> 128), "
        f"{torch.get_num_threads()} threads, medians of {PIECE_REPEATS} in turn:\n"
    )
    print_table(["operator", "microseconds"], [[name, f"{value * 1e6:.0f}"] for name, value in seconds.items()])


def quality(pert_data, args) -> None:
    """Test metrics of both precisions over ``args.seeds`` (see the module docstring)."""
    metrics = ("pearson_delta", "mse", "mse_de")
    results = {amp: {metric: [] for metric in metrics} for amp in args.amp}
    for seed in args.seeds:
        for amp in args.amp:
            _, report = trained_model(pert_data, args.epochs, seed=seed, loader_seed=seed, amp=amp)
            for metric in metrics:
                results[amp][metric].append(report["model"][f"test_{metric}"])
    print(
        f"Test metrics after {args.epochs} epochs, seeds {' '.join(map(str, args.seeds))} (each seed: initial "
        f"weights, pairing and shuffling)\n"
    )
    rows = []
    for metric in metrics:
        row = [metric] + [mean_sd(results[amp][metric]) for amp in args.amp]
        if len(args.amp) == 2:
            first, second = args.amp
            _, difference, verdict = paired_difference(
                results[second][metric],
                results[first][metric],
                metric == "pearson_delta",
                (MODES[second], MODES[first]),
            )
            row += [difference, verdict]
        rows.append(row)
    header = ["test metric"] + [MODES.get(amp, amp) for amp in args.amp]
    if len(args.amp) == 2:
        header += [f"{MODES[args.amp[1]]} - {MODES[args.amp[0]]}", "verdict"]
    print_table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--amp", nargs="+", default=["off", "bf16"], choices=list(MODES))
    parser.add_argument(
        "--steps", type=int, default=10, help="optimiser steps in one timed call (default 10; 0: no step timings)"
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed calls of each, in turn (default 7)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--breakdown", action="store_true", help="also time each operator of the steps")
    parser.add_argument("--seeds", type=int, nargs="*", default=[], help="train both precisions with these seeds")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of each trained model (default 3)")
    add_size_arguments(parser, genes=2000, cells_per_condition=100, perturbed_genes=120, combos=60, control_cells=3000)
    parser.add_argument("--data-path", default="./data/bench_precision")
    add_record_argument(parser)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pert_data = load_synthetic(args.data_path, args)
    pert_data.get_dataloader(batch_size=BATCH_SIZE, test_batch_size=256)
    with recorded(args.record):
        print(f"data: {pert_data.adata.n_obs} cells x {pert_data.adata.n_vars} genes; batch {BATCH_SIZE}, hidden 64\n")
        if args.steps:
            step_timings(pert_data, args)
        if args.seeds:
            if args.steps:
                print()
            quality(pert_data, args)


if __name__ == "__main__":
    main()
