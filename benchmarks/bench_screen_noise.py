"""How far the published ``GI_predict``'s sampling noise moves the genetic-interaction scores,
and the interaction types they imply, over a whole screen.

    python benchmarks/bench_screen_noise.py [--epochs 8] [--seeds 0 1 2] [--processes N] [--screen-genes N]
                                            [--data-path ./data/bench_screen_noise] [--exact-out F.csv]
                                            [--record]

The published ``GI_predict`` scores, for A, B and A+B, the mean prediction over 300 control
cells drawn at random for each minus the mean of all control cells: the change the model
predicts plus, per set, the drawn cells' mean minus the full mean. gears_ddp scores the
change itself (``change='exact'``) and keeps the published one as an option
(``'drawn-cells-minus-control-mean'``, ``inference.prediction``), which this script uses.

Model: the synthetic dataset (``gears_ddp.datasets.write_synthetic_dataset``: 1,000 genes,
60 perturbed genes, 80 combinations of 45 cells; here 3,000 control cells, so that the
drawn 300 are a tenth of them; written once under ``--data-path``), simulation split (seed
1), GEARS with hidden size 64 trained ``--epochs`` epochs (the model of the lowest val
``mse_de`` is kept). Screen: every pair of the 60 perturbed genes (1,770 pairs; of the
first ``--screen-genes`` of them for a quick check), once with the exact change and once
with the published change for each of ``--seeds``, on ``--processes`` CPU worker processes.

Printed:

- the noise itself: per perturbation set, the largest |drawn cells' mean - control mean|
  over genes and the noise's norm against the norm of the set's exact change;
- per score, the median of published - exact over pairs and seeds (a bias: the noise moving
  the score one way), the median, 95th percentile and largest |published - exact|, and
  the same between two seeds of the published change (how far two runs of the published
  GI_predict on the same model disagree);
- per interaction type (``interactions.calls.interaction_types``: synergy / additive /
  suppressor from ``mag``, neomorphic, redundant, epistasis), the share of pairs whose type
  under the published change differs from the exact one, and between two seeds.

For scale: the exact change scores a pair to about 1e-3 in c1 and c2 (Theil-Sen's spatial
median stops at the first step under 1e-3), and to rounding in the distance correlations.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from harness.machine import load_average
from harness.models import perturbed_genes, trained_synthetic_model
from harness.record import add_record_argument, recorded
from harness.settings import HIDDEN_SIZE
from harness.tables import print_table

DATASET = {"n_control_cells": 3000, "seed": 0}  # otherwise the generator's defaults: 1,000 genes, 60 perturbed
SCORES = ("c1", "c2", "mag", "dcor", "dcor_singles", "corr_fit", "dominance", "eq_contr")
TYPES = ("magnitude_type", "neomorphic", "redundant", "epistasis")


def noise_of_sets(gears, genes: list[str], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per perturbation set of the screen (singles, then pairs): the largest |noise| over
    genes, and the noise's norm over the exact change's norm."""
    from gears_ddp.inference.pair_screen_job import pair_sets, single_sets
    from gears_ddp.inference.prediction import DRAWN_CELLS_CHANGE

    job = gears.pair_screen_job(genes)
    import torch

    sets = torch.cat((single_sets(job.gene_sets), pair_sets(job.gene_sets, job.pairs())))
    exact = gears.change_predictor().changes(sets)
    noisy = gears.change_predictor(DRAWN_CELLS_CHANGE, seed).changes(sets)
    noise = (noisy - exact).abs()
    return noise.max(1).values.numpy(), (noise.norm(dim=1) / exact.norm(dim=1)).numpy()


def quantiles(values: np.ndarray) -> list[str]:
    """The median, 95th percentile and largest of the finite values."""
    values = values[np.isfinite(values)]
    return [f"{np.median(values):.3g}", f"{np.quantile(values, 0.95):.3g}", f"{values.max():.3g}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--processes", type=int, help="CPU worker processes (default: usable cores)")
    parser.add_argument("--data-path", default="./data/bench_screen_noise")
    parser.add_argument(
        "--screen-genes", type=int, help="screen every pair of this many of the perturbed genes (default: all 60)"
    )
    parser.add_argument("--exact-out", help="also write the exact screen there, as gears-ddp screen writes it (.csv)")
    add_record_argument(parser)
    args = parser.parse_args()
    if len(args.seeds) < 2:
        parser.error("give at least 2 seeds: two published runs are compared too")
    if args.screen_genes is not None and args.screen_genes < 2:
        parser.error("--screen-genes must be at least 2 (one pair)")

    from gears_ddp.distributed.pair_screen_workers import pair_screen_on_devices
    from gears_ddp.inference.prediction import DRAWN_CELLS_CHANGE
    from gears_ddp.runtime.threads import usable_cores

    processes = args.processes or usable_cores()
    gears, report = trained_synthetic_model(Path(args.data_path), "noise", DATASET, epochs=args.epochs)
    genes = perturbed_genes(gears)[: args.screen_genes]
    exact = pair_screen_on_devices(gears, genes, out=args.exact_out, overwrite=True, cpu_processes=processes)
    published = {
        seed: pair_screen_on_devices(gears, genes, cpu_processes=processes, change=DRAWN_CELLS_CHANGE, seeds=[seed])
        for seed in args.seeds
    }
    largest, relative = zip(*(noise_of_sets(gears, genes, seed) for seed in args.seeds))
    largest, relative = np.concatenate(largest), np.concatenate(relative)
    first, second = args.seeds[:2]

    with recorded(args.record):
        print(
            f"\nPublished sampling noise over a screen: synthetic data, {gears.num_genes:,} genes, "
            f"{len(gears.pert_data.cells.control_cells()):,} control cells; GEARS hidden {HIDDEN_SIZE}, "
            f"{args.epochs} epochs "
            f"(best epoch {report['best_epoch']}, test pearson_delta {report['model']['test_pearson_delta']:.3f}); "
            f"every pair of the {len(genes)} perturbed genes ({len(exact):,} pairs); published change with seeds "
            f"{args.seeds}; load average {load_average()}\n"
        )
        print_table(
            ["the noise, per perturbation set (singles and pairs, all seeds)", "median", "95th percentile", "largest"],
            [
                ["largest \\|drawn cells' mean - control mean\\| over genes", *quantiles(largest)],
                ["noise norm / exact change norm", *quantiles(relative)],
            ],
        )
        rows = []
        for name in SCORES:
            against_exact = np.concatenate([(table[name] - exact[name]).to_numpy() for table in published.values()])
            between = np.abs(published[first][name] - published[second][name]).to_numpy()
            rows.append(
                [name, f"{np.nanmedian(against_exact):.3g}", *quantiles(np.abs(against_exact)), *quantiles(between)]
            )
        print()
        print_table(
            [
                "score",
                "published - exact: median",
                "\\|published - exact\\|: median",
                "95th pct",
                "largest",
                f"\\|seed {first} - seed {second}\\|: median",
                "95th pct",
                "largest",
            ],
            rows,
        )
        rows = []
        for name in TYPES:
            differs = np.mean([(table[name] != exact[name]).mean() for table in published.values()])
            between = (published[first][name] != published[second][name]).mean()
            rows.append(
                [name, held_types(exact[name]), held_types(published[first][name]), f"{differs:.1%}", f"{between:.1%}"]
            )
        print()
        print_table(
            [
                "interaction type",
                "pairs of the type, exact",
                f"published, seed {first}",
                "published type differs from exact",
                f"seed {first} and seed {second} differ",
            ],
            rows,
        )


def held_types(column) -> str:
    """How many pairs hold a type: per magnitude type, else the count of True."""
    if column.dtype == bool:
        return str(int(column.sum()))
    counts = column.value_counts()
    return ", ".join(f"{kind} {counts.get(kind, 0)}" for kind in ("synergy", "additive", "suppressor"))


if __name__ == "__main__":
    main()
