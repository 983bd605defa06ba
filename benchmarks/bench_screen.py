"""In-silico combinatorial screen benchmark: pairs per second of a whole screen (prediction
included) and of the genetic-interaction (GI) scoring alone, the published per-pair
``GI_predict`` loop against gears_ddp, side by side in one run.

    python benchmarks/bench_screen.py [--parts screen scoring] [--genes 5045] [--json F] [--record]
                                      [--data-only]
        screen:  [--screen-genes 102] [--published-screen-pairs 3] [--processes N | --gpu-ids 0]
                 [--larger-screen-genes N [--larger-screen-limit-s 30]]
                 [--train-steps 20] [--data-path ./data/bench_screen]
        scoring: [--published-pairs 3] [--pairs 64] [--device cpu] [--threads 1 2] [--seed 0]

**screen** (issue 25's targets). A Norman-size model: the synthetic dataset
(``gears_ddp.datasets.write_synthetic_dataset``) with ``--genes`` genes (5,045, Norman's, by
default) and 102 perturbed genes (131 combinations, 20 cells each, 2,000 control cells;
written once under ``--data-path``; ``--data-only`` writes it and stops), GEARS with hidden
size 64 trained ``--train-steps``
optimiser steps on the CPU (the timings hardly depend on the weights). Then:

- gears_ddp: ``gears_ddp.distributed.pair_screen_workers.pair_screen_on_devices`` over every pair of the
  ``--screen-genes`` first genes the data perturbs (102: 5,151 pairs), written to a table as
  ``gears-ddp screen`` writes it, with ``--processes`` single-thread CPU worker processes
  (default: every usable core), or on the GPUs ``--gpu-ids`` names (one GPU: in this
  process). Timed from the call to the table: the Theil-Sen subsets' draw, every
  prediction, starting the workers, the scores and the merge.
- published: ``GEARS.GI_predict`` of the published package, unchanged, on the same weights
  (``harness.published.published_gears``: its ``predict`` and ``GI_predict`` bound to
  our data and its ``GEARS_Model``), over the first ``--published-screen-pairs`` pairs in
  screen order, each a prediction of the double over 300 control cells and the scores. Its
  singles are predicted first, apart (a screen predicts each single once: 102 against
  5,151 doubles), and counted in its estimate of the whole screen. ``--published-screen-pairs
  0`` runs gears_ddp alone.
- ``--larger-screen-genes N``: then gears_ddp's screen of every pair of the first ``N``
  genes, on the same model, if the first screen's pairs per second say it ends within
  ``--larger-screen-limit-s`` seconds (else its pairs and why, ``larger`` in the figures):
  a device check with a fixed time measures the whole Norman screen where it fits.

**scoring** (the floor). Random change vectors (pairs x genes; two singles and their
double, rounded to float32 as predictions are), over 5,045 genes by default, Norman's gene
count:

- published: ``gears.utils.get_GI_params`` called pair after pair, as ``GI_predict`` does
  (scikit-learn's ``TheilSenRegressor`` over 100,000 gene pairs, then four ``dcor``
  distance correlations), on the first ``--published-pairs`` pairs.
- gears_ddp: ``gears_ddp.interactions.scores.interaction_scores`` on all
  ``--pairs`` pairs at once, on ``--device``, with each of the ``--threads`` torch thread
  counts (default: 1 and every usable core; the published loop runs with every core, as
  scikit-learn and dcor choose). The Theil-Sen subsets are drawn once per gene count
  (seconds, then cached); that draw is timed apart and left out of the pairs per second.

Then each part of gears_ddp's scores is timed alone on the same pairs, with the first
thread count (Theil-Sen, the three 1-D distance correlations, the one of the two-column
singles matrix), to show where the floor is, and the scores of the pairs both scored are
compared (largest absolute difference per score).

Seconds are wall-clock (``time.perf_counter``); on a shared CPU they move with the load of
the machine, which is printed (the 1-minute load average, as ``uptime`` shows it) before
and after each part. CPU seconds (``time.process_time``, all threads of the process; for
the screen, of the worker processes too) move less for one thread, but count the time
threads spin waiting for each other.

Issue 25's targets for the whole screen, prediction included: at least 100x the published
loop's pairs per second, and Norman's 5,151 pairs in under 15 minutes on 2 CPU cores.

``--json F`` writes each part's figures (``harness.record.write_figures``).
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from harness.machine import load_average
from harness.models import perturbed_genes, trained_synthetic_model
from harness.published import published_gears
from harness.record import add_json_argument, add_record_argument, recorded, write_figures
from harness.settings import HIDDEN_SIZE
from harness.tables import print_table
from harness.timing import Stopwatch

NORMAN_GENES = 5045
NORMAN_PERTURBED = 102
NORMAN_PAIRS = 5151  # all pairs of Norman's 102 perturbed genes
NORMAN_SIZE = {
    "n_perturbed_genes": NORMAN_PERTURBED,
    "n_combos": 131,
    "cells_per_condition": 20,
    "n_control_cells": 2000,
    "seed": 0,
}  # and the genes, --genes
TARGET_SPEEDUP = 100.0
TARGET_SCREEN_SECONDS = 15 * 60


@dataclass
class Timing:
    """One row of the table: what was timed, over how many pairs, in how many seconds (wall
    clock) and CPU seconds of this process (all its threads)."""

    what: str
    pairs: int
    seconds: float
    cpu_seconds: float

    @classmethod
    def of(cls, what: str, pairs: int, watch: Stopwatch) -> "Timing":
        return cls(what, pairs, watch.seconds, watch.cpu_seconds)

    @property
    def pairs_per_second(self) -> float:
        return self.pairs / self.seconds


def random_changes(n_pairs: int, n_genes: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pairs x genes) changes of two singles and their double with an interaction term."""
    rng = np.random.default_rng(seed)
    first, second, noise = rng.normal(0.0, 1.0, (3, n_pairs, n_genes))
    weight_first, weight_second = rng.uniform(0.2, 2.0, (2, n_pairs, 1))
    double = weight_first * first + weight_second * second + 0.3 * first * second + 0.3 * noise
    # predictions are float32
    return (
        first.astype(np.float32).astype(float),
        second.astype(np.float32).astype(float),
        double.astype(np.float32).astype(float),
    )


def published_scoring(first, second, double) -> tuple[Timing, list[dict]]:
    """The published loop: ``get_GI_params`` pair after pair."""
    from gears.utils import get_GI_params

    scores = []
    with Stopwatch() as watch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for pair in range(len(first)):
            predictions = {"A": first[pair], "B": second[pair], "A_B": double[pair]}
            scores.append(get_GI_params(predictions, ["A", "B"]))
    return Timing.of("published get_GI_params, pair by pair", len(first), watch), scores


def subsets_draw(n_genes: int) -> Timing:
    """The one-time draw of the Theil-Sen subsets for this gene count."""
    from gears_ddp.interactions.scores import theil_sen_subsets

    theil_sen_subsets.cache_clear()
    with Stopwatch() as watch:
        theil_sen_subsets(n_genes)
    return Timing.of(f"Theil-Sen subsets for {n_genes:,} genes (once per gene count)", 0, watch)


def batched_scoring(first, second, double, device: str, threads: int) -> tuple[Timing, dict]:
    """gears_ddp's batched scores with ``threads`` torch threads (subsets drawn before)."""
    import torch

    from gears_ddp.interactions.scores import interaction_scores

    torch.set_num_threads(threads)
    with Stopwatch(device) as watch:
        scores = interaction_scores(first, second, double, device=device)
    return Timing.of(
        f"gears_ddp interaction_scores, batched on {device}, {threads} thread(s)", len(first), watch
    ), scores


def scoring_parts(first, second, double, device: str) -> list[Timing]:
    """Each part of the batched scores alone, in the batches ``interaction_scores`` uses."""
    import torch

    from gears_ddp.interactions import scores

    first, second, double = (torch.tensor(values, device=device) for values in (first, second, double))
    batch = scores.CPU_BATCH_SIZE if torch.device(device).type == "cpu" else scores.GPU_BATCH_SIZE
    block = scores.CPU_DISTANCES_PER_BLOCK if torch.device(device).type == "cpu" else scores.GPU_DISTANCES_PER_BLOCK
    parts = {
        "Theil-Sen (100,000 subsets, spatial median)": lambda f, s, d: scores.theil_sen_coefficients(f, s, d),
        "three 1-D distance correlations, O(genes log genes)": lambda f, s, d: scores.distance_correlation(
            torch.cat((f, s, f)), torch.cat((d, d, s))
        ),
        "distance correlation of [first, second], O(genes^2)": lambda f, s, d: scores.distance_correlation(
            torch.stack((f, s), dim=-1), d, block
        ),
    }
    timings = []
    for what, part in parts.items():
        with Stopwatch(device) as watch:
            for begin in range(0, len(first), batch):
                part(first[begin : begin + batch], second[begin : begin + batch], double[begin : begin + batch])
        timings.append(Timing.of(what, len(first), watch))
    return timings


def largest_differences(batched: dict, published: list[dict]) -> dict[str, float]:
    """Largest |gears_ddp - published| per score over the pairs both scored."""
    from gears_ddp.interactions.scores import GI_SCORE_NAMES

    return {
        name: max(abs(float(batched[name][pair]) - float(reference[name])) for pair, reference in enumerate(published))
        for name in GI_SCORE_NAMES
    }


# ----------------------------------------------------------------------------- the whole screen


def screen_dataset(args) -> tuple[str, dict]:
    """The name and ``write_synthetic_dataset`` options of the screen's dataset."""
    return f"norman_size_{args.genes}_genes", {**NORMAN_SIZE, "n_genes": args.genes}


def our_pair_screen(gears, genes: list[str], processes: int | None, gpu_ids: list[int] | None) -> tuple[Timing, object]:
    """The whole screen as ``gears-ddp screen`` runs it, subsets drawn afresh, on the GPUs
    ``gpu_ids`` or else ``processes`` CPU processes."""
    from gears_ddp.distributed.pair_screen_workers import pair_screen_on_devices
    from gears_ddp.interactions.scores import theil_sen_subsets

    theil_sen_subsets.cache_clear()
    devices = {"gpu_ids": gpu_ids} if gpu_ids else {"cpu_processes": processes}
    on = f"GPU(s) {', '.join(map(str, gpu_ids))}" if gpu_ids else f"{processes} single-thread CPU process(es)"
    with tempfile.TemporaryDirectory() as folder:
        with Stopwatch(gpu_ids and f"cuda:{gpu_ids[0]}", cpu_of="self and children") as watch:
            table = pair_screen_on_devices(gears, genes, out=Path(folder) / "screen.csv", **devices)
    return Timing.of(f"gears_ddp screen on {on}, all {len(table):,} pairs", len(table), watch), table


def published_pair_screen(gears, genes: list[str], n_pairs: int) -> tuple[Timing, Timing, list[dict]]:
    """The published ``GI_predict`` over the first ``n_pairs`` pairs in screen order, its
    singles predicted before (timed apart, per single)."""
    published = published_gears(gears)
    pairs = list(itertools.islice(itertools.combinations(genes, 2), n_pairs))
    singles = sorted({gene for pair in pairs for gene in pair}, key=genes.index)
    with Stopwatch() as watch:
        published.predict([[gene] for gene in singles])
    single_timing = Timing.of("published predict of one single (300 control cells)", len(singles), watch)
    scores = []
    with Stopwatch() as watch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for pair in pairs:
            scores.append(published.GI_predict(list(pair), GI_genes_file=None))
    return (
        Timing.of("published GI_predict loop (the double predicted, then scored)", n_pairs, watch),
        single_timing,
        scores,
    )


def screen_part(args) -> dict:
    """The whole screen, printed; its figures returned."""
    from gears_ddp.runtime.threads import usable_cores

    processes = args.processes or usable_cores()
    load_before = load_average()
    gears, _ = trained_synthetic_model(Path(args.data_path), *screen_dataset(args), max_steps=args.train_steps)
    genes = perturbed_genes(gears)[: args.screen_genes]
    published = None
    if args.published_screen_pairs:
        published, single, published_scores = published_pair_screen(gears, genes, args.published_screen_pairs)
    load_between = load_average()
    ours, table = our_pair_screen(gears, genes, processes, args.gpu_ids)
    load_after = load_average()
    n_pairs = len(table)
    print(
        f"\nWhole screen on a Norman-size model: {gears.num_genes:,} genes, {len(perturbed_genes(gears))} "
        f"perturbed in the data, hidden {HIDDEN_SIZE}, trained {args.train_steps} steps; {len(genes)} of them "
        f"screened ({n_pairs:,} pairs); "
        f"{usable_cores()} usable cores; load average {load_before} before, {load_between} between the two, "
        f"{load_after} after\n"
    )
    figures = {
        "genes": gears.num_genes,
        "screened_genes": len(genes),
        "pairs": n_pairs,
        "seconds": ours.seconds,
        "pairs_per_s": ours.pairs_per_second,
        "on": ours.what,
    }
    reference_rate = published.pairs_per_second if published else None
    print_table(
        ["screen", "pairs", "seconds", "s / pair", "pairs / s", "vs published", "CPU s / pair"],
        [
            [
                row.what,
                f"{row.pairs:,}",
                f"{row.seconds:.1f}",
                f"{row.seconds / row.pairs:.3f}",
                f"{row.pairs_per_second:.3f}",
                f"{row.pairs_per_second / reference_rate:.0f}x" if reference_rate else "-",
                f"{row.cpu_seconds / row.pairs:.3f}",
            ]
            for row in (published, ours)
            if row
        ],
    )
    if args.larger_screen_genes:
        figures["larger"] = larger_screen(gears, ours, args, processes)
    target = "met" if ours.seconds < TARGET_SCREEN_SECONDS else "not met"
    if published is None:
        print(
            f"\ngears_ddp: {n_pairs:,} pairs in {ours.seconds / 60:.1f} min, prediction included (target: under "
            f"{TARGET_SCREEN_SECONDS / 60:.0f} min on 2 CPU cores: {target}); the published loop not run"
        )
        return figures
    published_pair_screen_s = n_pairs / published.pairs_per_second + len(genes) * single.seconds / single.pairs
    speedup = ours.pairs_per_second / published.pairs_per_second
    print(
        f"\npublished predict of one single: {single.seconds / single.pairs:.2f} s "
        f"({single.pairs} singles, predicted before its loop)"
    )
    print(
        f"published loop over all {n_pairs:,} pairs at this rate, with its {len(genes)} singles: "
        f"{published_pair_screen_s / 3600:.1f} h"
    )
    print(
        f"gears_ddp: {n_pairs:,} pairs in {ours.seconds / 60:.1f} min, prediction included (target: under "
        f"{TARGET_SCREEN_SECONDS / 60:.0f} min on 2 CPU cores: {target}); "
        f"{speedup:.0f}x the published loop's pairs per second (target {TARGET_SPEEDUP:.0f}x: "
        f"{'met' if speedup >= TARGET_SPEEDUP else 'not met'})"
    )
    exact = table.iloc[: len(published_scores)]
    differences = {
        name: max(
            abs(float(row[name]) - float(reference[name]))
            for (_, row), reference in zip(exact.iterrows(), published_scores)
        )
        for name in ("c1", "c2", "mag", "dcor")
    }
    print(
        "largest |gears_ddp - published| over those pairs (gears_ddp scores the exact change, the published its "
        "change over 300 drawn control cells: sampling noise, see docs/screens.md): "
        + ", ".join(f"{name} {value:.2g}" for name, value in differences.items())
    )
    return {**figures, "published_pairs_per_s": published.pairs_per_second, "speedup": speedup}


def larger_screen(gears, first: Timing, args, processes: int) -> dict:
    """Every pair of the first ``--larger-screen-genes`` perturbed genes, screened after the
    first screen on the same model when that screen's rate says it takes at most
    ``--larger-screen-limit-s`` seconds (a device check's time is fixed: a screen that could
    not end in it is left out, saying why); its figures, or the pairs and why not."""
    genes = perturbed_genes(gears)[: args.larger_screen_genes]
    n_pairs = len(genes) * (len(genes) - 1) // 2
    projected = n_pairs / first.pairs_per_second
    if projected > args.larger_screen_limit_s:
        skipped = (
            f"{n_pairs:,} pairs not screened: about {projected:.0f} s at the first screen's "
            f"{first.pairs_per_second:.0f} pairs/s, above --larger-screen-limit-s {args.larger_screen_limit_s:g}"
        )
        print(f"\nlarger screen: {skipped}")
        return {"screened_genes": len(genes), "pairs": n_pairs, "projected_seconds": projected, "skipped": skipped}
    timing, table = our_pair_screen(gears, genes, processes, args.gpu_ids)
    print(
        f"\nlarger screen: {len(genes)} genes, {len(table):,} pairs in {timing.seconds:.1f} s, "
        f"{timing.pairs_per_second:.1f} pairs/s ({timing.what}; projected from the first: {projected:.1f} s)"
    )
    return {
        "screened_genes": len(genes),
        "pairs": len(table),
        "seconds": timing.seconds,
        "pairs_per_s": timing.pairs_per_second,
        "projected_seconds": projected,
    }


# ----------------------------------------------------------------------------- the scores alone


def scoring_part(args) -> dict:
    """The scores alone, printed; their figures returned."""
    import torch

    from gears_ddp.runtime.threads import usable_cores

    thread_counts = args.threads or sorted({1, usable_cores()})
    load_before = load_average()
    first, second, double = random_changes(args.pairs, args.genes, args.seed)
    published, published_scores = published_scoring(*(v[: args.published_pairs] for v in (first, second, double)))
    subsets = subsets_draw(args.genes)
    runs = [batched_scoring(first, second, double, args.device, threads) for threads in thread_counts]
    torch.set_num_threads(thread_counts[0])
    parts = scoring_parts(first, second, double, args.device)
    differences = largest_differences(runs[0][1], published_scores)
    fastest = max((timing for timing, _ in runs), key=lambda timing: timing.pairs_per_second)

    print(
        f"\nGI scoring alone, of random change vectors over {args.genes:,} genes; {usable_cores()} usable cores; "
        f"gears_ddp on {args.device}; load average {load_before} before, {load_average()} after\n"
    )
    print_table(
        ["scoring", "pairs", "seconds", "ms / pair", "pairs / s", "vs published", "CPU ms / pair", "vs published, CPU"],
        [
            [
                row.what,
                row.pairs,
                f"{row.seconds:.2f}",
                f"{1e3 / row.pairs_per_second:.1f}",
                f"{row.pairs_per_second:.3f}",
                f"{row.pairs_per_second / published.pairs_per_second:.0f}x",
                f"{1e3 * row.cpu_seconds / row.pairs:.1f}",
                f"{published.cpu_seconds / published.pairs / (row.cpu_seconds / row.pairs):.0f}x",
            ]
            for row in (published, *(timing for timing, _ in runs))
        ],
    )
    print(f"\n{subsets.what}: {subsets.seconds:.1f} s\n")
    total = sum(part.seconds for part in parts)
    print_table(
        [f"part of gears_ddp's scores, {thread_counts[0]} thread(s)", "ms / pair", "CPU ms / pair", "share"],
        [
            [
                part.what,
                f"{1e3 * part.seconds / part.pairs:.1f}",
                f"{1e3 * part.cpu_seconds / part.pairs:.1f}",
                f"{part.seconds / total:.0%}",
            ]
            for part in parts
        ],
    )
    print(
        f"\nlargest |gears_ddp - published| over {args.published_pairs} pairs: "
        + ", ".join(f"{name} {value:.1e}" for name, value in differences.items())
    )
    speedup = fastest.pairs_per_second / published.pairs_per_second
    print(f"\nscoring speed-up over the published loop, fastest setting: {speedup:.0f}x")
    return {
        "genes": args.genes,
        "pairs": args.pairs,
        "fastest": fastest.what,
        "pairs_per_s": fastest.pairs_per_second,
        "speedup": speedup,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=("screen", "scoring"), default=["screen", "scoring"])
    parser.add_argument(
        "--screen-genes",
        type=int,
        default=NORMAN_PERTURBED,
        help="screen every pair of this many of the genes the data perturbs (102: 5,151 pairs)",
    )
    parser.add_argument(
        "--published-screen-pairs",
        type=int,
        default=3,
        help="pairs the published GI_predict loop runs (about 15 s each at 5,045 genes; 0: none)",
    )
    devices = parser.add_mutually_exclusive_group()
    devices.add_argument("--processes", type=int, help="gears_ddp's CPU worker processes (default: usable cores)")
    devices.add_argument("--gpu-ids", type=int, nargs="+", help="screen on these GPUs instead of CPU processes")
    parser.add_argument(
        "--larger-screen-genes",
        type=int,
        help="then screen every pair of this many genes too (102: Norman's 5,151 pairs), on the same model, "
        "if the first screen's rate says it takes at most --larger-screen-limit-s",
    )
    parser.add_argument("--larger-screen-limit-s", type=float, default=30.0)
    parser.add_argument("--train-steps", type=int, default=20)
    parser.add_argument("--data-path", default="./data/bench_screen")
    parser.add_argument("--data-only", action="store_true", help="write the screen's dataset and stop")
    parser.add_argument(
        "--genes",
        type=int,
        default=NORMAN_GENES,
        help="genes of the screen's model and of the scored change vectors (default: Norman's)",
    )
    parser.add_argument(
        "--published-pairs",
        type=int,
        default=3,
        help="pairs the published loop scores (about 10 s each at 5,045 genes on a CPU core)",
    )
    parser.add_argument("--pairs", type=int, default=64, help="pairs gears_ddp scores")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--threads", type=int, nargs="+", help="torch thread counts for gears_ddp (default: 1 and every usable core)"
    )
    parser.add_argument("--seed", type=int, default=0)
    add_json_argument(parser)
    add_record_argument(parser)
    args = parser.parse_args()
    if not 1 <= args.published_pairs <= args.pairs:
        parser.error("--published-pairs must be between 1 and --pairs")
    if not 2 <= args.screen_genes <= NORMAN_PERTURBED or args.published_screen_pairs < 0:
        parser.error(f"--screen-genes must be between 2 and {NORMAN_PERTURBED}, --published-screen-pairs at least 0")
    if args.larger_screen_genes is not None and not args.screen_genes < args.larger_screen_genes <= NORMAN_PERTURBED:
        parser.error(f"--larger-screen-genes must be above --screen-genes and at most {NORMAN_PERTURBED}")

    if args.data_only:
        from gears_ddp.datasets import write_synthetic_dataset

        name, options = screen_dataset(args)
        print(f"dataset at {write_synthetic_dataset(args.data_path, name=name, **options)}")
        return
    figures = {}
    with recorded(args.record):
        if "screen" in args.parts:
            figures["screen"] = screen_part(args)
        if "scoring" in args.parts:
            figures["scoring"] = scoring_part(args)
    if args.json:
        write_figures(args.json, figures)


if __name__ == "__main__":
    main()
