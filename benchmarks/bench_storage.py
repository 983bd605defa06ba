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
import math
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_data import add_size_arguments, synthetic_options  # noqa: E402
from bench_model import HIDDEN_SIZE, LR, WEIGHT_DECAY  # noqa: E402
from results import add_record_argument, recorded  # noqa: E402

METRICS = ("test_mse_de", "test_pearson_delta", "test_pearson_delta_de", "test_frac_opposite_direction_top20_non_dropout",
           "test_mse_top20_de_non_dropout")
LOWER_IS_BETTER = {"test_mse_de", "test_frac_opposite_direction_top20_non_dropout", "test_mse_top20_de_non_dropout"}


def run(data_path: Path, dtype: str, seed: int, epochs: int) -> dict:
    import torch

    from gears_ddp import PertData
    from gears_ddp.gears import GEARS

    pert_data = PertData(data_path, expression_dtype=dtype)
    pert_data.load(data_path=data_path / "synthetic")
    pert_data.prepare_split(split="simulation", seed=seed)
    pert_data.get_dataloader(batch_size=32, test_batch_size=256, seed=seed)
    torch.manual_seed(seed)
    gears = GEARS(pert_data)
    gears.model_initialize(hidden_size=HIDDEN_SIZE)
    return gears.train(epochs=epochs, lr=LR, weight_decay=WEIGHT_DECAY)["model"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--epochs", type=int, default=5)
    add_size_arguments(parser, genes=1000, cells_per_condition=45, perturbed_genes=60, combos=80, control_cells=1000)
    add_record_argument(parser)
    args = parser.parse_args()
    from gears_ddp.datasets import write_synthetic_dataset

    with tempfile.TemporaryDirectory() as tmp:
        write_synthetic_dataset(tmp, **synthetic_options(args))
        runs = {seed: {dtype: run(Path(tmp), dtype, seed, args.epochs) for dtype in ("float32", "float16")}
                for seed in args.seeds}
    with recorded(args.record):
        print(f"\ntest metrics of the best model after {args.epochs} epochs, float32 vs float16 expression storage, "
              f"seeds {' '.join(map(str, args.seeds))}\n")
        print("| metric | " + " | ".join(f"seed {s} (32 / 16)" for s in args.seeds) + " | 16 - 32 | verdict |")
        print("|---|" + "---:|" * len(args.seeds) + "---:|---|")
        for metric in METRICS:
            values = [(runs[s]["float32"][metric], runs[s]["float16"][metric]) for s in args.seeds]
            differences = [b - a for a, b in values]
            mean = statistics.fmean(differences)
            error = statistics.stdev(differences) / math.sqrt(len(differences)) if len(differences) > 1 else math.nan
            verdict = "within noise" if abs(mean) <= 2 * error else (
                "float16 better" if (mean < 0) == (metric in LOWER_IS_BETTER) else "float32 better")
            cells = " | ".join(f"{a:.4f} / {b:.4f}" for a, b in values)
            print(f"| {metric} | {cells} | {mean:+.4f} +- {error:.4f} | {verdict} |")


if __name__ == "__main__":
    main()
