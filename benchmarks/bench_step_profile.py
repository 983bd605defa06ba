"""Where a training step's time goes: the top kernels of a step replayed from a CUDA graph,
from ``torch.profiler``, at Norman's width (5,000 genes) by default.

    python benchmarks/bench_step_profile.py [--device cuda] [--compile off on] [--amp off bf16]
                                            [--batch-size 32] [--steps 20] [--top 15]
                                            [--genes 5000 ...] [--data-path ./data/bench_epoch]
                                            [--json profile.json]

The data are those of ``bench_epoch.py`` (the built-in synthetic dataset at Norman size,
written once under ``--data-path``; the GPU check passes the same folder). For each
``--compile`` and ``--amp`` setting: ``torch.manual_seed(0)``, ``model_initialize(hidden_size=64)``,
the published optimiser, and the training loader's padded batches (as ``train`` gives a
CUDA graph). On a GPU the step is ``training.cuda_graphs.CapturedStep`` as ``train`` runs it:
3 eager warm-up steps (where ``compile on`` compiles the network), the capture, then
``--steps`` replays, each timed with CUDA events, and the same replays again under
``torch.profiler`` (CPU and CUDA activities). Printed per setting: the step's median
milliseconds and its floor (the step's matrix products alone, ``torch.mm`` of the same
shapes timed the same way, the bound the issue of the step's floor is about), then the
``--top`` kernels by CUDA time per step with their calls per step and share of the step,
then the ``--top`` operators with their input shapes (``operators``): the same steps run
eagerly (a replay hides which operator launched a kernel; the kernels are the same), each
operator's own device time per step, and the megabytes its inputs hold at 4 bytes a value,
so that its time can be set against the bytes it reads (the step's passes over its rows,
not its launches, bound it once it replays).
A setting whose ``torch.compile`` fails is recorded with the error's first lines
(``failed``) and the others go on; ``compile on`` under a torch release where ``train``
refuses ``compile=True`` (``compile_refusal``: under 2.11.0 the compiled step computes zero
gradients for most layers, so its time is not a training step's) is recorded as refused,
with the reason, and not timed.

On a CPU (``--small`` runs of the GPU check) there is no graph: the eager step is profiled,
with the operators' CPU time, so the script and its JSON are checked in the suite.
"""

import argparse
import math
import statistics
import time

import torch
from harness.models import new_model
from harness.record import add_json_argument, add_record_argument, recorded, write_figures
from harness.settings import LR, WEIGHT_DECAY
from harness.synthetic import add_size_arguments, load_synthetic
from harness.tables import print_table

from gears_ddp.training.cuda_graphs import CapturedStep
from gears_ddp.training.engine import Precision, training_step
from gears_ddp.training.optimization import make_optimizer
from gears_ddp.training.training_options import compile_refusal

WARMUP_STEPS = 3


def padded_batches(pert_data, count: int) -> list:
    """The first ``count`` training batches, their perturbation sets padded as for a graph."""
    loader = pert_data.dataloader["train_loader"]
    loader.set_epoch(0)
    batches = []
    for batch in loader.batches(0, loader.max_sets_per_batch()):
        batches.append(batch)
        if len(batches) == count:
            return batches
    raise SystemExit(f"the training set has {len(batches)} batches; {count} are needed")


def timed_steps(step, batches, device: torch.device) -> list[float]:
    """Milliseconds of each ``step(batch)``: CUDA events on a GPU, the wall clock on a CPU."""
    times = []
    for batch in batches:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(batch)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            tick = time.perf_counter()
            step(batch)
            times.append(1e3 * (time.perf_counter() - tick))
    return times


def product_floor_ms(gears, batch, device: torch.device, amp: str) -> float:
    """The step's largest matrix products alone: the recovery MLP's two Linear layers over the
    (set, gene) rows, forward and both backward products, timed as the step is."""
    sets = batch.sets.n_sets
    hidden = gears.config["hidden_size"]
    rows = sets * gears.model.num_genes
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16 if amp == "fp16" else torch.float32
    x = torch.randn(rows, hidden, device=device, dtype=dtype)
    w1 = torch.randn(hidden, 2 * hidden, device=device, dtype=dtype)
    w2 = torch.randn(2 * hidden, hidden, device=device, dtype=dtype)

    def products(_):
        h = x @ w1  # forward
        y = h @ w2
        y @ w2.T, h.T @ y  # backward of the second: input and weight gradients
        h @ w1.T, x.T @ h  # and of the first

    products(None)
    return statistics.median(timed_steps(products, range(10), device))


def profile_setting(
    pert_data, device: torch.device, batch_size: int, steps: int, compile: bool, amp: str, top: int
) -> dict:
    """The figures of one setting (see the module docstring)."""
    pert_data.get_dataloader(batch_size=batch_size, test_batch_size=256)
    gears = new_model(pert_data, device=device)
    network = gears.model.train()
    model = torch.compile(network) if compile else network
    optimizer, _ = make_optimizer(network, LR, WEIGHT_DECAY)
    context, precision = gears.loss_context(), Precision.for_mode(amp, device)
    batches = padded_batches(pert_data, WARMUP_STEPS + 1 + 2 * steps)
    captured = CapturedStep(device) if device.type == "cuda" else None
    run = captured or training_step

    def step(batch):
        return run(model, [batch], optimizer, context, False, device, precision)

    for batch in batches[: WARMUP_STEPS + 1]:  # warm-up and capture
        step(batch)
    replaying = captured is not None and captured.replaying
    times = timed_steps(step, batches[WARMUP_STEPS + 1 : WARMUP_STEPS + 1 + steps], device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        for batch in batches[WARMUP_STEPS + 1 + steps :]:
            step(batch)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    kernels = kernel_table(profiler, device, steps, top)
    with torch.profiler.profile(activities=activities, record_shapes=True) as by_operator:
        for batch in batches[WARMUP_STEPS + 1 : WARMUP_STEPS + 1 + steps]:
            training_step(model, [batch], optimizer, context, False, device, precision)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return {
        "compile": compile,
        "amp": amp,
        "batch_size": batch_size,
        "genes": network.num_genes,
        "sets_per_batch": batches[0].sets.n_sets,
        "replayed": replaying,
        "step_ms": statistics.median(times),
        "floor_ms": product_floor_ms(gears, batches[0], device, amp),
        "kernels": kernels,
        "operators": operator_table(by_operator, device, steps, top),
    }


def operator_table(profiler, device: torch.device, steps: int, top: int) -> list[dict]:
    """The ``top`` operators (with their input shapes) by their own device time per step (on
    a CPU: their own CPU time), and the megabytes their inputs hold at 4 bytes a value."""
    rows = []
    for event in profiler.key_averages(group_by_input_shape=True):
        micros = event.self_device_time_total if device.type == "cuda" else event.self_cpu_time_total
        if micros <= 0 or not event.key.startswith("aten::"):
            continue
        shapes = [list(shape) for shape in event.input_shapes if isinstance(shape, (list, tuple)) and shape]
        values = sum(math.prod(shape) for shape in shapes)
        rows.append(
            {
                "name": event.key,
                "shapes": shapes,
                "calls_per_step": event.count / steps,
                "us_per_step": micros / steps,
                "input_mb": 4 * values / 1e6,
            }
        )
    return top_rows(rows, top)


def top_rows(rows: list[dict], top: int) -> list[dict]:
    """The ``top`` rows by ``us_per_step``, each with its ``share`` of all the rows' time."""
    rows = sorted(rows, key=lambda row: -row["us_per_step"])
    total = sum(row["us_per_step"] for row in rows) or 1.0
    for row in rows:
        row["share"] = row["us_per_step"] / total
    return rows[:top]


def kernel_table(profiler, device: torch.device, steps: int, top: int) -> list[dict]:
    """The ``top`` kernels (on a CPU: operators) by device time per step."""
    cuda = device.type == "cuda"
    rows = []
    for event in profiler.key_averages():
        if cuda:
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            micros = event.self_device_time_total
        else:
            micros = event.self_cpu_time_total
        rows.append({"name": event.key, "calls_per_step": event.count / steps, "us_per_step": micros / steps})
    return top_rows(rows, top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", nargs="+", default=["off"], choices=["off", "on"])
    parser.add_argument("--amp", nargs="+", default=["off"], choices=["off", "bf16", "fp16"])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--top", type=int, default=15)
    add_size_arguments(
        parser, genes=5000, cells_per_condition=350, perturbed_genes=100, combos=130, control_cells=10000
    )
    parser.add_argument("--data-path", default="./data/bench_epoch")
    add_json_argument(parser)
    add_record_argument(parser)
    args = parser.parse_args()
    with recorded(args.record):
        measure(args)


def measure(args) -> None:
    device = torch.device(args.device)
    pert_data = load_synthetic(args.data_path, args)
    print(
        f"data: {pert_data.adata.n_obs} cells x {pert_data.adata.n_vars} genes on {device}; batch "
        f"{args.batch_size}; {args.steps} steps timed, {args.steps} profiled"
    )
    settings = []
    for compile in args.compile:
        for amp in args.amp:
            refusal = compile_refusal("--compile on") if compile == "on" else None
            if refusal:  # as train() refuses it: a step that computes other gradients is not timed
                settings.append({"compile": True, "amp": amp, "failed": f"refused: {refusal}"})
                print(f"\ncompile {compile}, amp {amp}: not measured, {settings[-1]['failed']}")
                write_json(args, device, pert_data, settings)
                continue
            try:
                figures = profile_setting(
                    pert_data, device, args.batch_size, args.steps, compile == "on", amp, args.top
                )
            except torch._dynamo.exc.BackendCompilerFailed as failure:  # recorded; the other settings go on
                reason = str(failure).strip().splitlines()
                settings.append({"compile": True, "amp": amp, "failed": " ".join(reason[:2])})
                print(f"\ncompile {compile}, amp {amp}: torch.compile failed: {settings[-1]['failed']}")
                write_json(args, device, pert_data, settings)
                continue
            settings.append(figures)
            print(
                f"\ncompile {compile}, amp {amp}: {'replayed' if figures['replayed'] else 'eager'} step "
                f"{figures['step_ms']:.3f} ms (median), its matrix products alone {figures['floor_ms']:.3f} ms "
                f"({figures['step_ms'] / figures['floor_ms']:.1f}x); {figures['sets_per_batch']} sets a batch"
            )
            print_table(
                ["kernel" if device.type == "cuda" else "operator", "calls/step", "us/step", "share"],
                [
                    [
                        row["name"][:90],
                        f"{row['calls_per_step']:.1f}",
                        f"{row['us_per_step']:.1f}",
                        f"{row['share']:.1%}",
                    ]
                    for row in figures["kernels"]
                ],
            )
            print_table(
                ["operator, run eagerly", "input shapes", "calls/step", "us/step", "input MB", "share"],
                [
                    [
                        row["name"],
                        " ".join("x".join(map(str, shape)) for shape in row["shapes"])[:60],
                        f"{row['calls_per_step']:.1f}",
                        f"{row['us_per_step']:.1f}",
                        f"{row['input_mb']:.1f}",
                        f"{row['share']:.1%}",
                    ]
                    for row in figures["operators"]
                ],
            )
            write_json(args, device, pert_data, settings)  # after each: a stage cut short keeps what it measured


def write_json(args, device: torch.device, pert_data, settings: list[dict]) -> None:
    """The settings measured so far to ``--json``, if given."""
    if args.json:
        write_figures(
            args.json,
            {
                "device": str(device),
                "cells": pert_data.adata.n_obs,
                "genes": pert_data.adata.n_vars,
                "settings": settings,
            },
        )


if __name__ == "__main__":
    main()
