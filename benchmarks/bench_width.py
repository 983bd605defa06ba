"""gears_ddp and the published GEARS at the width of today's screens (18,000 genes), side by
side on the same raw data: processing, loading, ``model_initialize`` (the gene graphs),
seconds per training step, peak memory, and an epoch's estimated time at the size of the
Virtual Cell Challenge's training file.

    python benchmarks/bench_width.py [--genes 18000 --cells-per-condition 100 --perturbed-genes 60
                                      --combos 30 --control-cells 2000 --modules 60]
                                     [--steps 8] [--data-path /tmp/bench_width] [--skip-reference]
                                     [--device cuda] [--amp off bf16] [--json F] [--record] [--data-only]

The data (generator seed 0, ``make_synthetic_perturb_seq``; by default 11,000 cells x
18,000 genes: 60 single and 30 two-gene perturbations of 100 cells, 2,000 controls) and the
GO files are written once under ``--data-path`` and reused (``--data-only`` writes them and
stops). ``--modules`` sets the
generator's gene modules, whose genes share GO terms: 60 modules give a GO graph about as
dense as a real one (the script prints its edges per gene; Enrichr's GO Biological Process
2021 gene sets give 4.35 million edges over 14,937 genes, 291 per gene); with the
generator's default of 20 modules every gene shares terms with 900 others.

Each package runs in a child process of its own (its peak memory is its own), with all the
machine's cores, and does, timing each stage:

1. processing: ``PertData(folder).new_data_process`` on the raw h5ad;
2. loading: a new ``PertData(folder).load(data_path=...)``, ``prepare_split('simulation',
   seed=1)`` and ``get_dataloader(32, 32)``;
3. ``GEARS(pert_data)`` and ``model_initialize(hidden_size=64)``, with the co-expression
   graph (and gears_ddp's GO graph cache) built from nothing, and the time of each graph;
4. ``--steps`` training steps at batch 32 after one warm-up step, their median. gears_ddp:
   ``training.engine.training_step`` on the training loader's batches with the training
   loop's optimiser (``training.optimization.make_optimizer``), with freed memory
   retained as its training loop does (``runtime.host_memory``), and the page faults a step.
   On a GPU (``--device cuda``) the step is the one training replays
   (``training.cuda_graphs.CapturedStep`` on batches whose perturbation sets are padded as
   the loop pads them): its eager warm-up steps and the captured step come first, untimed,
   then each timed step is waited for (``torch.cuda.synchronize``); the peak GPU memory
   (``torch.cuda.max_memory_allocated``) is reported beside the host's. ``--amp`` times the
   steps once per precision (``engine.Precision.for_mode``: off, bf16, fp16), each with a
   new optimiser, on the same batches; the floor and the estimates below are the first
   precision's. The published GEARS trains in float32.
   The published GEARS: its own ``train(epochs=1)`` on a loader that yields that many
   batches, timed between batches (its epoch-end evaluation runs on those batches and one
   validation batch, outside the timed steps);
5. peak resident memory of the process (``getrusage``) over the stages above; in
   gears_ddp's child it is read before the floors below, whose own tensors (about 0.8 GiB
   at this width) are no part of the workflow.

The floor of a gears_ddp step is measured in its child, after the steps: the six matrix
products of the recovery MLP on the steps' (set, gene) rows (two forward: 64 -> 128 -> 64;
four backward: each Linear's input and weight gradients), on buffers of the mean number of
rows of the steps, the median of as many repeats. The same child times one
elementwise pass (``relu_``) over those rows at width 128, over the whole tensor and a
piece of 4,096 rows at a time (as the fused decoder cuts its passes), to express the
step's time above its floor in such passes. Floors of ``model_initialize``: the time of
the co-expression graph's correlation products alone (its panels' BLAS ``sgemm`` calls) and of reading
the GO edge file alone (``go_essential_all.csv``), from the same calls. An epoch at the
challenge's size is estimated as (221,273 cells x this split's share of cells in training /
32) steps of the measured median.

``--device`` is gears_ddp's (its model, steps and floors); the published GEARS runs on the
CPU, so with another device give ``--skip-reference``. ``--json F`` writes the figures
(``harness.record.write_figures``).
"""

import argparse
import contextlib
import io
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness.child import run_in_child
from harness.machine import load_average
from harness.memory import peak_rss_mib
from harness.published import patch_csr_indexing, reference_available
from harness.record import add_json_argument, add_record_argument, recorded, write_figures
from harness.synthetic import add_size_arguments, synthetic_options, work_folder, write_raw_input
from harness.tables import format_number, print_table
from harness.timing import synchronize

VCC_CELLS = 221_273
BATCH_SIZE = 32
HIDDEN_SIZE = 64


def _timed(function, seconds: list):
    """``function`` that appends the seconds of each call to ``seconds``."""

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds.append(time.perf_counter() - start)

    return timed


def _stage(figures: dict, name: str):
    """A context that stores its wall seconds in ``figures[name]``."""

    @contextlib.contextmanager
    def timing():
        start = time.perf_counter()
        yield
        figures[name] = time.perf_counter() - start

    return timing()


def _train_share(pert_data) -> float:
    """The share of the dataset's cells that the split puts in training."""
    conditions = pert_data.adata.obs["condition"].astype(str)
    return float(conditions.isin(set(pert_data.set2conditions["train"])).mean())


def run_ours(raw: str, folder: str, steps: int, device: str, amps: list[str]) -> dict:
    import anndata
    import torch

    from gears_ddp import GEARS, PertData
    from gears_ddp.data import graphs, pertdata

    figures, graph_s = {}, {"co-expression": [], "GO": []}
    floor_s = {"correlation products": [], "reading the GO edge file": []}
    pertdata.PertData.coexpression_graph = _timed(pertdata.PertData.coexpression_graph, graph_s["co-expression"])
    pertdata.PertData.go_graph = _timed(pertdata.PertData.go_graph, graph_s["GO"])
    graphs._add_panel_products = _timed(graphs._add_panel_products, floor_s["correlation products"])
    read_edge_list = graphs.read_edge_list

    def timed_read(path, *args):
        seconds = floor_s["reading the GO edge file"] if Path(path).name == "go_essential_all.csv" else []
        return _timed(read_edge_list, seconds)(path, *args)

    graphs.read_edge_list = timed_read
    with _stage(figures, "processing_s"):
        PertData(folder).new_data_process("wide", anndata.read_h5ad(raw))
    with _stage(figures, "loading_s"):
        pert_data = PertData(folder)
        pert_data.load(data_path=Path(folder) / "wide")
        pert_data.prepare_split("simulation", seed=1)
        pert_data.get_dataloader(BATCH_SIZE, test_batch_size=BATCH_SIZE)
    torch.manual_seed(0)
    with _stage(figures, "model_initialize_s"):
        gears = GEARS(pert_data, device=device)
        gears.model_initialize(hidden_size=HIDDEN_SIZE)
    figures["graph_s"] = {name: sum(seconds) for name, seconds in graph_s.items()}
    figures["graph_floor_s"] = {name: sum(seconds) for name, seconds in floor_s.items()}
    by_amp = {
        amp: _timed_steps(gears, pert_data.dataloader["train_loader"], steps, torch.device(device), amp) for amp in amps
    }
    figures.update(by_amp[amps[0]])
    figures["step_s_by_amp"] = {amp: statistics.median(timed["step_s"]) for amp, timed in by_amp.items()}
    figures["peak_rss_gib"] = peak_rss_mib() / 1024  # the workflow's: before the floors' own tensors
    figures["floor_s"] = _six_products(int(figures["rows"]), HIDDEN_SIZE, steps, device)
    figures["pass_s"] = _one_pass(int(figures["rows"]), 2 * HIDDEN_SIZE, steps, device)
    figures["train_share"] = _train_share(pert_data)
    go_edges = Path(folder) / "go_essential_all" / "go_essential_all.csv"
    figures["go_edges_per_gene"] = (sum(1 for _ in go_edges.open()) - 1) / len(pert_data.pert_names)
    return figures


def _timed_steps(gears, loader, steps: int, device, amp: str) -> dict:
    """``steps`` training steps in precision ``amp`` on ``device`` after the untimed ones (see
    the module docstring): their seconds, the (set, gene) rows of each, the page faults a
    step and, on a GPU, the peak memory."""
    import torch

    from gears_ddp.runtime.host_memory import retained_host_memory
    from gears_ddp.training.cuda_graphs import WARMUP_STEPS, CapturedStep
    from gears_ddp.training.engine import Precision, training_step
    from gears_ddp.training.optimization import make_optimizer

    optimizer, _ = make_optimizer(gears.model, lr=1e-3, weight_decay=5e-4)
    context, on_gpu, precision = gears.loss_context(), device.type == "cuda", Precision.for_mode(amp, device)
    # on a GPU the step training replays: eager warm-up steps, then one captured
    step, untimed, pad_sets_to = (
        (CapturedStep(device), WARMUP_STEPS + 1, loader.max_sets_per_batch()) if on_gpu else (training_step, 1, None)
    )
    step_s, rows, faults = [], [], []
    with contextlib.nullcontext() if on_gpu else retained_host_memory():  # as the recipe trains on a CPU
        for _, batch in zip(range(steps + untimed), loader.batches(0, pad_sets_to)):
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
            synchronize(device)
            start = time.perf_counter()
            step(gears.model, [batch], optimizer, context, False, device, precision)
            synchronize(device)
            step_s.append(time.perf_counter() - start)
            rows.append(len(batch.sets.counts) * gears.model.num_genes)  # padded sets too: the step computes them
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)
    figures = {
        "step_s": step_s[untimed:],
        "faults_per_step": (faults[-1] - faults[untimed]) / steps,
        "rows": statistics.mean(rows[untimed:]),
        "device": str(device),
    }
    if on_gpu:
        figures["peak_gpu_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    return figures


def _six_products(n_rows: int, hidden: int, repeats: int, device: str) -> float:
    """Median seconds of the recovery MLP's six matrix products on ``n_rows`` rows (see the
    module docstring), on ``device``."""
    import torch

    def randn(*shape):
        return torch.randn(*shape, device=device)

    def empty(*shape):
        return torch.empty(*shape, device=device)

    a0, w1, z1 = randn(n_rows, hidden), randn(2 * hidden, hidden), empty(n_rows, 2 * hidden)
    a1, w2, z2 = randn(n_rows, 2 * hidden), randn(hidden, 2 * hidden), empty(n_rows, hidden)
    grad_z2, grad_a1 = randn(n_rows, hidden), empty(n_rows, 2 * hidden)
    grad_z1, grad_a0 = randn(n_rows, 2 * hidden), empty(n_rows, hidden)
    seconds = []
    for _ in range(repeats + 1):
        synchronize(device)
        start = time.perf_counter()
        torch.mm(a0, w1.T, out=z1)
        torch.mm(a1, w2.T, out=z2)
        torch.mm(grad_z2, w2, out=grad_a1)
        grad_z2.T.mm(a1)
        torch.mm(grad_z1, w1, out=grad_a0)
        grad_z1.T.mm(a0)
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds[1:])


def _one_pass(n_rows: int, width: int, repeats: int, device: str) -> dict:
    """Median seconds of one elementwise pass (``relu_``) over ``n_rows`` rows of ``width``
    float32 values on ``device``: over the whole tensor at once, and a piece of
    ``ROWS_PER_PASS`` rows at a time, as the fused decoder cuts its passes on a CPU (each
    piece small enough for the CPU's caches)."""
    import torch

    from gears_ddp.model.weighted_norm import ROWS_PER_PASS

    rows = torch.randn(n_rows, width, device=device)

    def in_pieces():
        for start in range(0, n_rows, ROWS_PER_PASS):
            rows[start : start + ROWS_PER_PASS].relu_()

    seconds = {"whole": [], "in pieces": []}
    for _ in range(repeats + 1):
        for name, one_pass in (("whole", rows.relu_), ("in pieces", in_pieces)):
            synchronize(device)
            start = time.perf_counter()
            one_pass()
            synchronize(device)
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(values[1:]) for name, values in seconds.items()}


class _TimedBatches:
    """``batches`` as a loader: records the time each batch is handed out in training mode
    (the published training loop; its evaluation iterates the same loader in eval mode)."""

    def __init__(self, batches: list, model, times: list):
        self.batches, self.model, self.times = batches, model, times

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for batch in self.batches:
            if self.model.training:
                self.times.append(time.perf_counter())
            yield batch


def run_published(raw: str, folder: str, steps: int) -> dict:
    patch_csr_indexing()
    import anndata
    import gears.gears as published
    import torch
    from gears import GEARS, PertData

    figures, graph_s, batch_times, epoch_ends = {}, {}, [], []
    similarity = published.get_similarity_network

    def timed_similarity(network_type, *args, **kwargs):
        start = time.perf_counter()
        try:
            return similarity(network_type, *args, **kwargs)
        finally:
            graph_s[{"co-express": "co-expression", "go": "GO"}[network_type]] = time.perf_counter() - start

    class TimedStepLR(published.StepLR):
        """Records when the epoch's loop ends (its ``step`` after the loop; not the constructor's)."""

        def step(self, *args, **kwargs):
            if getattr(self, "_constructed", False):
                epoch_ends.append(time.perf_counter())
            self._constructed = True
            return super().step(*args, **kwargs)

    published.get_similarity_network = timed_similarity
    published.StepLR = TimedStepLR
    with _stage(figures, "processing_s"):
        PertData(folder).new_data_process("wide", anndata.read_h5ad(raw))
    with _stage(figures, "loading_s"):
        pert_data = PertData(folder)
        pert_data.load(data_path=str(Path(folder) / "wide"))
        pert_data.prepare_split("simulation", seed=1)
        pert_data.get_dataloader(BATCH_SIZE, test_batch_size=BATCH_SIZE)
    torch.manual_seed(0)
    with _stage(figures, "model_initialize_s"):
        gears = GEARS(pert_data, device="cpu")
        gears.model_initialize(hidden_size=HIDDEN_SIZE)
    figures["graph_s"] = graph_s
    loaders = gears.dataloader
    batches = [batch for _, batch in zip(range(steps + 1), loaders["train_loader"])]
    loaders["train_loader"] = _TimedBatches(batches, gears.model, batch_times)
    loaders["val_loader"] = [next(iter(loaders["val_loader"]))]
    gears.train(epochs=1, lr=1e-3, weight_decay=5e-4)
    ends = batch_times[1:] + epoch_ends[:1]  # a step ends when the next batch is asked for
    figures["step_s"] = [end - begin for begin, end in zip(batch_times, ends)][1:]
    figures["train_share"] = _train_share(pert_data)
    return figures


def measured(package: str, raw: str, steps: int, device: str, amps: list[str]) -> dict:
    """In a child process of its own: one package's stages on ``raw`` (see the module
    docstring), with its peak memory; gears_ddp's on ``device``, its steps in each precision
    of ``amps``."""
    import torch

    torch.set_num_threads(os.cpu_count())
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(work_folder(Path(raw), tmp))
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            figures = (
                run_ours(raw, folder, steps, device, amps)
                if package == "gears_ddp"
                else run_published(raw, folder, steps)
            )
    figures.setdefault("peak_rss_gib", peak_rss_mib() / 1024)
    return figures


def _raw_input(args) -> Path:
    """The raw h5ad and GO files of the size options, written once under ``--data-path``."""
    options = synthetic_options(args)
    options["n_modules"] = args.modules
    folder = Path(args.data_path) / ("width_" + "_".join(f"{key}{value}" for key, value in options.items()))
    raw = folder / "raw.h5ad"
    if not raw.exists():
        write_raw_input(folder, args, n_modules=args.modules)
    return raw


def _ratio(published, ours) -> str:
    return "-" if published is None or ours is None else f"{published / ours:.1f}x"


def print_tables(ours: dict, published: dict | None, args) -> None:
    def figure(result, key):
        return None if result is None else result[key]

    def step(result):
        return None if result is None else statistics.median(result["step_s"])

    rows = []
    for label, key in (
        ("processing: raw h5ad -> processed folder (s)", "processing_s"),
        ("loading: load, split, loaders (s)", "loading_s"),
        ("model_initialize (s)", "model_initialize_s"),
    ):
        rows.append(
            [
                label,
                format_number(figure(published, key), ".2f"),
                format_number(ours[key], ".2f"),
                _ratio(figure(published, key), ours[key]),
            ]
        )
    for graph in ("co-expression", "GO"):
        theirs = None if published is None else published["graph_s"].get(graph)
        rows.append(
            [
                f"  of which the {graph} graph (s)",
                format_number(theirs, ".2f"),
                format_number(ours["graph_s"][graph], ".2f"),
                _ratio(theirs, ours["graph_s"][graph]),
            ]
        )
    first_amp, *other_amps = args.amp
    precision = "" if first_amp == "off" else f", {first_amp}"
    rows.append(
        [
            f"training step, batch 32, median{precision} (s)",
            format_number(step(published), ".3f"),
            format_number(step(ours), ".3f"),
            _ratio(step(published), step(ours)),
        ]
    )
    for amp in other_amps:
        rows.append(
            [f"training step, batch 32, median, {amp} (s)", "-", format_number(ours["step_s_by_amp"][amp], ".3f"), "-"]
        )
    rows.append(
        [
            "peak resident memory (GiB)",
            format_number(figure(published, "peak_rss_gib"), ".2f"),
            format_number(ours["peak_rss_gib"], ".2f"),
            _ratio(figure(published, "peak_rss_gib"), ours["peak_rss_gib"]),
        ]
    )
    if "peak_gpu_gib" in ours:
        rows.append(["peak GPU memory (GiB)", "-", format_number(ours["peak_gpu_gib"], ".2f"), "-"])
    vcc_steps = VCC_CELLS * ours["train_share"] / BATCH_SIZE
    rows.append(
        [
            f"an epoch at the challenge's size, estimated ({vcc_steps:,.0f} steps; min)",
            format_number(None if published is None else vcc_steps * step(published) / 60, ".0f"),
            format_number(vcc_steps * step(ours) / 60, ".0f"),
            _ratio(step(published), step(ours)),
        ]
    )
    print_table(["", "published GEARS", "gears_ddp", "published / gears_ddp"], rows)
    print(
        f"\ngears_ddp on {ours['device']}; its step against its floor: {step(ours) * 1e3:.0f} ms a step, "
        f"{ours['floor_s'] * 1e3:.0f} ms for the recovery MLP's six matrix products on the steps' "
        f"{ours['rows']:,.0f} (set, gene) rows: {step(ours) / ours['floor_s']:.2f}x the floor."
    )
    print(f"Page faults a step (minor, after the warm-up step): {ours['faults_per_step']:,.0f}.")
    passes = ours["pass_s"]
    print(
        f"One elementwise pass (relu_) over those rows x {2 * HIDDEN_SIZE} float32: {passes['whole'] * 1e3:.1f} ms "
        f"over the whole tensor, {passes['in pieces'] * 1e3:.1f} ms a piece of rows at a time; the step's time "
        f"above the floor is {(step(ours) - ours['floor_s']) / passes['whole']:.0f} such passes."
    )
    floors = ours["graph_floor_s"]
    print(
        f"Floors of model_initialize: the co-expression graph's correlation products (BLAS sgemm over the "
        f"training cells) {floors['correlation products']:.2f} s of its {ours['graph_s']['co-expression']:.2f} s; "
        f"reading the GO edge file (go_essential_all.csv) {floors['reading the GO edge file']:.2f} s of the GO "
        f"graph's {ours['graph_s']['GO']:.2f} s."
    )
    print(
        f"Steps timed: {len(ours['step_s'])} per package after a warm-up step; GO graph "
        f"{ours['go_edges_per_gene']:.0f} edges per gene ({args.modules} gene modules); load average at the end "
        f"{load_average()}."
    )


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_size_arguments(parser, genes=18000, cells_per_condition=100, perturbed_genes=60, combos=30, control_cells=2000)
    parser.add_argument("--modules", type=int, default=60, help="the generator's gene modules (default 60)")
    parser.add_argument("--steps", type=int, default=8, help="training steps timed after a warm-up step")
    parser.add_argument("--data-path", default="/tmp/bench_width", help="where the raw data is written, once")
    parser.add_argument("--data-only", action="store_true", help="write the raw data and stop")
    parser.add_argument("--skip-reference", action="store_true", help="gears_ddp only")
    parser.add_argument("--device", default="cpu", help="gears_ddp's device (the published GEARS runs on the CPU)")
    parser.add_argument(
        "--amp",
        nargs="+",
        default=["off"],
        choices=["off", "bf16", "fp16"],
        help="gears_ddp's step precisions, timed in turn (the first: the floor and the estimates)",
    )
    add_json_argument(parser)
    add_record_argument(parser)
    args = parser.parse_args()
    if args.device != "cpu" and not args.skip_reference:
        parser.error("the published GEARS runs on the CPU here: with --device other than cpu, give --skip-reference")
    raw = _raw_input(args)
    if args.data_only:
        print(f"raw data at {raw}")
        return
    ours = run_in_child(
        __file__, "measured", "gears_ddp", str(raw), args.steps, args.device, args.amp, label="gears_ddp"
    )
    published = None
    if not args.skip_reference and reference_available():
        published = run_in_child(
            __file__, "measured", "published", str(raw), args.steps, "cpu", ["off"], label="published GEARS"
        )
    if ours is None:
        sys.exit(1)
    with recorded(args.record):
        print_tables(ours, published, args)
    if args.json:
        vcc_steps = VCC_CELLS * ours["train_share"] / BATCH_SIZE
        write_figures(
            args.json,
            {
                "device": args.device,
                "genes": synthetic_options(args)["n_genes"],
                "step_s": ours["step_s_by_amp"],
                "vcc_epoch_s": {amp: vcc_steps * s for amp, s in ours["step_s_by_amp"].items()},
                "gears_ddp": ours,
                "published": published,
            },
        )


if __name__ == "__main__":
    main()
