"""What one training step and one evaluation pass ask of the device, counted on any machine:
aten operators per optimiser step (each a kernel launch on a GPU, or a view the dispatcher
still walks through) and host synchronisations (each a stall of the GPU's queue).

    python benchmarks/bench_dispatch.py [--batch-sizes 32 256] [--hidden 64] [--steps 5]
                                        [--genes 1000 ...] [--data-path ./data/bench_dispatch]

The data are the built-in synthetic dataset (``write_synthetic_dataset``, seed 0; 1,000 genes
by default), ``prepare_split('simulation', seed=1)``. For each batch size: ``torch.manual_seed(0)``,
``model_initialize(hidden_size)``, the published optimiser, one uncounted optimiser step, then
``--steps`` steps counted by ``gears_ddp.runtime.dispatch_count.DispatchCount`` on batches
gathered beforehand (the loaders' work is the host's). The fused decoder cuts its rows into
pieces by device (``model.weighted_norm.rows_per_pass``): each row is counted with a CPU's
pieces and with a GPU's (one piece up to about a million rows, and the graph convolutions as
gathers, not a CPU's sparse products), the count a GPU launches.
Each is counted for three steps: ``eager`` (batches as a CPU trains on them), ``padded``
(the batches' perturbation sets padded to a fixed number, as for a CUDA graph), and
``replayed``: a step replayed from a CUDA graph (``training.cuda_graphs.CapturedStep``),
counted with a stand-in graph that launches nothing, so the count is what the step
dispatches besides the graph's one launch (the batch's copies into the graph's tensors, the
learning rate, the loss). Then one evaluation pass over the val set (the model in evaluation mode), with its
synchronisations (those at its end: the conditions seen, the result read back).

The counts depend on the code, not on the machine's speed; they run on a 2-core CPU as on a
GPU machine. ``--record`` appends the output to ``benchmarks/RESULTS.md``.
"""

import argparse
import subprocess
from pathlib import Path

import torch
from harness.models import new_model
from harness.record import add_record_argument, recorded
from harness.settings import LR, WEIGHT_DECAY
from harness.synthetic import add_size_arguments, load_synthetic
from harness.tables import StreamedTable
from harness.timing import Stopwatch

import gears_ddp
from gears_ddp import PertData
from gears_ddp.model import weighted_norm
from gears_ddp.runtime.dispatch_count import DispatchCount
from gears_ddp.training.cuda_graphs import CapturedStep
from gears_ddp.training.engine import evaluate, training_step
from gears_ddp.training.optimization import make_optimizer

PIECES = {"CPU": weighted_norm.ROWS_PER_PASS, "GPU": weighted_norm.ROWS_PER_PASS_ACCELERATOR}
STEPS = ("eager", "padded", "replayed")


class GraphLaunch:
    """Stands in for ``cuda_graphs.CudaGraph`` when counting a replayed step: its capture
    records nothing and its replay launches nothing, so what is counted is the step's work
    outside the graph (a GPU adds the graph's one launch)."""

    def capture(self, step, shares_pool_with=None):
        return torch.zeros(())

    def replay(self) -> None:
        pass


def code_version() -> str:
    """Where the measured package lives, and its commit when it is a git checkout."""
    folder = Path(gears_ddp.__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "not a git checkout"
    return f"{folder} (commit {commit})"


def count_steps(
    pert_data: PertData, batch_size: int, hidden: int, steps: int, rows_per_pass: int, step_kind: str
) -> dict:
    """Operators and synchronisations per optimiser step of ``step_kind`` (``STEPS``; see the
    module docstring)."""
    weighted_norm.ROWS_PER_PASS = rows_per_pass  # a GPU's pieces bring its gathers (graph_conv.uses_sparse_product)
    pert_data.get_dataloader(batch_size=batch_size, test_batch_size=256)
    gears = new_model(pert_data, hidden_size=hidden)
    optimizer, _ = make_optimizer(gears.model, LR, WEIGHT_DECAY)
    context, device = gears.loss_context(), torch.device("cpu")
    loader = pert_data.dataloader["train_loader"]
    padded = step_kind != "eager"
    batches = [
        batch for _, batch in zip(range(steps + 1), loader.batches(0, loader.max_sets_per_batch() if padded else None))
    ]
    step = CapturedStep(device, warmup_steps=0, graph_factory=GraphLaunch) if step_kind == "replayed" else training_step
    gears.model.train()
    step(gears.model, batches[:1], optimizer, context, False, device)  # (the replayed step: its capture)
    with DispatchCount() as count:
        for batch in batches[1:]:
            step(gears.model, [batch], optimizer, context, False, device)
    n = len(batches) - 1
    return {
        "operators": count.total_operators / n,
        "views": count.total_views / n,
        "distinct": len(count.operators),
        "syncs": count.total_synchronisations / n,
        "top": count.operators.most_common(8),
        "n": n,
    }


def count_evaluation(pert_data: PertData, hidden: int) -> dict:
    """Operators and synchronisations of one evaluation pass over the val set."""
    pert_data.get_dataloader(batch_size=32, test_batch_size=256)
    gears = new_model(pert_data, hidden_size=hidden)
    loader = pert_data.dataloader["val_loader"]
    batches = list(loader)  # gathered beforehand, as for the steps

    class Gathered:
        def __iter__(self):
            return iter(batches)

    with DispatchCount() as count:
        evaluate(gears.model, Gathered(), gears.new_accumulator(), False, torch.device("cpu"))
    return {"batches": len(batches), "operators": count.total_operators, "syncs": dict(count.synchronisations)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    add_size_arguments(parser)
    parser.add_argument("--data-path", default="./data/bench_dispatch")
    add_record_argument(parser)
    args = parser.parse_args()
    with recorded(args.record):
        measure(args)


def measure(args) -> None:
    with Stopwatch() as loading:
        pert_data = load_synthetic(args.data_path, args)
    print(f"code: {code_version()}")
    print(
        f"data: {pert_data.adata.n_obs} cells x {pert_data.adata.n_vars} genes, ready in "
        f"{loading.seconds:.0f} s; hidden {args.hidden}; each figure per optimiser step, the mean "
        f"of {args.steps} steps after one"
    )
    print()
    table = StreamedTable(
        ["batch", "step", "row pieces", "operators", "of which views", "kernels", "distinct", "host syncs"], left=3
    )
    tops = []
    for batch_size in args.batch_sizes:
        for step_kind in STEPS:
            for pieces, rows in PIECES.items():
                r = count_steps(pert_data, batch_size, args.hidden, args.steps, rows, step_kind)
                table.add(
                    [
                        batch_size,
                        step_kind,
                        f"{pieces} ({rows:,} rows)",
                        f"{r['operators']:,.0f}",
                        f"{r['views']:,.0f}",
                        f"{r['operators'] - r['views']:,.0f}",
                        r["distinct"],
                        f"{r['syncs']:g}",
                    ]
                )
                if step_kind == "eager":
                    tops.append((batch_size, pieces, r))
    weighted_norm.ROWS_PER_PASS = PIECES["CPU"]
    print()
    for batch_size, pieces, r in tops:
        if pieces == "GPU":
            common = ", ".join(f"{name.removeprefix('aten.')} {count / r['n']:.0f}" for name, count in r["top"])
            print(f"most frequent at batch {batch_size}, GPU pieces: {common}")
    e = count_evaluation(pert_data, args.hidden)
    syncs = ", ".join(f"{name} {count}" for name, count in sorted(e["syncs"].items())) or "none"
    print(
        f"evaluation pass over val ({e['batches']} batches of up to 256 cells): {e['operators']:,} operators; "
        f"host syncs: {syncs}"
    )


if __name__ == "__main__":
    main()
