"""float16 expression storage against float32: does storing the expression in half
precision change the trained model's test metrics beyond seed-to-seed noise?

    python benchmarks/bench_storage.py [--seeds 1 2 3 4 5] [--epochs 5] [--genes 1000 ...] [--record]

The synthetic data of ``bench_model.py`` (7,300 cells x 1,000 genes by default) is written
once; for each seed S, two single-process runs differ only in
``PertData(expression_dtype=...)``: the split (``prepare_split('simulation', seed=S)``),
loaders (``seed=S``), initial weights (``torch.manual_seed(S)``) and hyperparameters (batch
32, hidden 64, lr 1e-3, weight decay 5e-4) are the same. For each test metric it prints
the per-seed values, and the mean of the per-seed differences (float16 - float32) with its
standard error; "within noise" means that mean is within two standard errors of zero.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from harness.models import trained_model
from harness.record import add_record_argument, recorded
from harness.spread import paired_difference
from harness.synthetic import add_size_arguments, load_dataset, synthetic_options
from harness.tables import print_table

METRICS = (
    "test_mse_de",
    "test_pearson_delta",
    "test_pearson_delta_de",
    "test_frac_opposite_direction_top20_non_dropout",
    "test_mse_top20_de_non_dropout",
)
LOWER_IS_BETTER = {"test_mse_de", "test_frac_opposite_direction_top20_non_dropout", "test_mse_top20_de_non_dropout"}


def run(data_path: Path, dtype: str, seed: int, epochs: int) -> dict:
    """The test metrics of the best model of one run (seed ``seed``, expression stored as ``dtype``)."""
    pert_data = load_dataset(data_path, data_path / "synthetic", seed, expression_dtype=dtype)
    _, report = trained_model(pert_data, epochs, seed=seed, loader_seed=seed)
    return report["model"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--epochs", type=int, default=5)
    add_size_arguments(parser)
    add_record_argument(parser)
    args = parser.parse_args()
    from gears_ddp.datasets import write_synthetic_dataset

    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic_dataset(tmp, **synthetic_options(args))
        runs = {
            seed: {dtype: run(Path(tmp), dtype, seed, args.epochs) for dtype in ("float32", "float16")}
            for seed in args.seeds
        }
    with recorded(args.record):
        print(
            f"\ntest metrics of the best model after {args.epochs} epochs, float32 vs float16 expression storage, "
            f"seeds {' '.join(map(str, args.seeds))}\n"
        )
        rows = []
        for metric in METRICS:
            values = [(runs[s]["float32"][metric], runs[s]["float16"][metric]) for s in args.seeds]
            _, difference, verdict = paired_difference(
                [b for _, b in values], [a for a, _ in values], metric not in LOWER_IS_BETTER, ("float16", "float32")
            )
            rows.append([metric, *(f"{a:.4f} / {b:.4f}" for a, b in values), difference, verdict])
        print_table(["metric", *(f"seed {s} (32 / 16)" for s in args.seeds), "16 - 32", "verdict"], rows)


if __name__ == "__main__":
    main()
