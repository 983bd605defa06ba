"""The Virtual Cell Challenge workflow end to end, scored by cell-eval.

    python examples/vcc_workflow.py                      # a small VCC-shaped synthetic screen
    python examples/vcc_workflow.py --adata adata_Training.h5ad \\
        --go-gene-sets GO_Biological_Process_2021.gmt.gz --n-top-genes 5000 --epochs 20 --work ./vcc

A screen as the challenge ships it (raw counts, the perturbed gene in obs['target_gene'],
controls 'non-targeting', one cell type, single perturbations) goes through the steps a user
types (docs/vcc.md):

1. gears-ddp process: GEARS's conditions from obs['target_gene'], counts normalised;
2. the split: whole perturbations held out, by the simulation_single split or a custom split
   of the genes given with --test-genes (a pickle, split_config.split_dict_path);
3. gears-ddp train;
4. gears-ddp predict: --cells-per-perturbation predicted cells for each held-out
   perturbation, beside the true cells, both in cell-eval's layout;
5. cell-eval run, then its headline scores per held-out perturbation.

Without --adata it first writes the synthetic screen of preset "vcc" (300 genes, 20
perturbations, 2,500 cells, with its GO files); the whole run takes about a minute on 2 CPU
cores. Each step prints the command it runs, then runs it. Run again, it replaces what it
wrote in --work before (the processed data and the run).
"""

from __future__ import annotations

import argparse
import pickle
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from gears_ddp import PertData
from gears_ddp.cli import main as gears_ddp
from gears_ddp.data.conditions import CONTROL, condition_genes
from gears_ddp.datasets import preset, write_synthetic_screen

HEADLINE = ("pearson_delta", "mse", "mae", "discrimination_score_l1", "overlap_at_N", "precision_at_N")
LOWER_IS_BETTER = ("mse", "mae")
SHOWN = 12  # perturbations named per set when the split is printed
VAL_FRACTION = 0.1  # the custom split's share of the trained perturbations kept for validation


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    screen = parser.add_argument_group("the screen (default: the synthetic screen of preset 'vcc')")
    screen.add_argument("--adata", type=Path, help="a raw-count h5ad, e.g. the challenge's adata_Training.h5ad")
    screen.add_argument("--perturbation-column", default="target_gene")
    screen.add_argument("--control-label", default="non-targeting")
    go = screen.add_mutually_exclusive_group()
    go.add_argument("--go-gene-sets", help="GO gene sets (GMT) to build the GO files from; needed with --adata")
    go.add_argument("--go-annotation", help="or a GO annotation (GAF, or a gene / GO id table)")
    screen.add_argument("--n-top-genes", type=int, help="keep the N highly variable genes (and the perturbed ones)")
    screen.add_argument("--name", default="vcc", help="the dataset's name (its folder under WORK/data)")
    parser.add_argument("--work", type=Path, default=Path("vcc_workflow"), help="where everything is written")
    split = parser.add_argument_group("the held-out perturbations")
    split.add_argument(
        "--test-genes",
        nargs="+",
        metavar="GENE",
        help="hold out these genes' perturbations (a custom split); default: the simulation_single "
        "split, which holds out a quarter of the perturbed genes",
    )
    split.add_argument("--seed", type=int, default=1, help="the split's seed (and the synthetic screen's)")
    train = parser.add_argument_group("training")
    train.add_argument("--epochs", type=int, default=2)
    train.add_argument("--batch-size", type=int, default=32)
    train.add_argument("--hidden-size", type=int, default=32)
    train.add_argument(
        "--cpu-processes",
        type=int,
        help="CPU processes (gloo); default: every GPU when torch sees one, else 1 CPU process",
    )
    scoring = parser.add_argument_group("prediction and cell-eval")
    scoring.add_argument(
        "--cells-per-perturbation", type=int, default=100, help="predicted cells per held-out perturbation"
    )
    scoring.add_argument(
        "--profile",
        default="minimal",
        help="cell-eval's metric profile: minimal (its headline metrics), vcc, full, ...",
    )
    scoring.add_argument("--num-threads", type=int, default=1, help="cell-eval's threads")
    return parser.parse_args()


def step(title: str, command: list[str]) -> None:
    """Print a step's title and its command as a user types it."""
    print(f"\n== {title}\n$ {shlex.join(command)}", flush=True)


def run_gears_ddp(title: str, argv: list[str]) -> None:
    """Run one gears-ddp command in this process (the same argv as on the command line)."""
    step(title, ["gears-ddp", *argv])
    status = gears_ddp(argv)
    if status != 0:
        sys.exit(f"gears-ddp {argv[0]} failed (exit status {status}); the lines above say why")


def synthetic_screen(data: Path, seed: int) -> Path:
    """The synthetic screen of preset 'vcc', with its GO files in ``data``."""
    path = write_synthetic_screen(data, "vcc_screen", overwrite=True, **{**preset("vcc"), "seed": seed})
    print(f"wrote the synthetic VCC-shaped screen {path} and its GO files in {data}")
    return path


def process(args, adata: Path, data: Path) -> None:
    argv = [
        "process",
        "--adata",
        str(adata),
        "--data-path",
        str(data),
        "--name",
        args.name,
        "--perturbation-column",
        args.perturbation_column,
        "--control-label",
        args.control_label,
        "--normalize",
        "--drop-unannotated",
        "--overwrite",
    ]
    if args.n_top_genes is not None:
        argv += ["--n-top-genes", str(args.n_top_genes)]
    if args.go_gene_sets:
        argv += ["--go-gene-sets", args.go_gene_sets]
    if args.go_annotation:
        argv += ["--go-annotation", args.go_annotation]
    run_gears_ddp("1. process the screen", argv)


def custom_split(conditions: list[str], test_genes: list[str], seed: int) -> dict[str, list[str]]:
    """A split of whole perturbations: the given genes' conditions in test, a seeded
    ``VAL_FRACTION`` of the others (at least one) in val, the rest and the controls in train."""
    test = [c for c in conditions if c != CONTROL and set(condition_genes(c)) & set(test_genes)]
    absent = sorted(set(test_genes) - {g for c in test for g in condition_genes(c)})
    if absent:
        sys.exit(
            f"--test-genes: no perturbation of {', '.join(absent)} in the processed screen (the perturbations "
            "of genes without GO terms are dropped by processing)"
        )
    others = [c for c in conditions if c != CONTROL and c not in test]
    if len(others) < 2:
        sys.exit(
            f"--test-genes holds out {len(test)} of {len(test) + len(others)} perturbations: leave at least two "
            "to train and validate on"
        )
    drawn = np.random.default_rng(seed).choice(len(others), max(1, round(VAL_FRACTION * len(others))), replace=False)
    val = [others[i] for i in sorted(drawn)]
    return {"train": [c for c in conditions if c not in test and c not in val], "val": val, "test": test}


def split(args, data: Path) -> list[str]:
    """The ``--set`` options of the split; prints which perturbations are trained on and held out."""
    pert_data = PertData(data)
    pert_data.load(data_path=str(data / args.name))
    if args.test_genes:
        path = args.work / "split.pkl"
        with open(path, "wb") as handle:
            pickle.dump(custom_split(pert_data.cells.conditions, args.test_genes, args.seed), handle)
        settings = {"split": "custom", "split_dict_path": str(path)}
        print(f"\n== 2. the split: custom, written to {path}")
    else:
        settings = {"split": "simulation_single", "seed": args.seed}
        print(f"\n== 2. the split: simulation_single, seed {args.seed}")
    pert_data.prepare_split(**settings)
    for name in ("train", "val", "test"):
        genes = sorted("+".join(condition_genes(c)) for c in pert_data.set2conditions[name] if c != CONTROL)
        print(
            f"{name:>5}: {len(genes)} perturbations: {', '.join(genes[:SHOWN])}"
            + (f" and {len(genes) - SHOWN} more" if len(genes) > SHOWN else "")
        )
    return [option for key, value in settings.items() for option in ("--set", f"split_config.{key}={value}")]


def train(args, data: Path, run: Path, split_options: list[str]) -> None:
    processes = args.cpu_processes if args.cpu_processes or torch.cuda.is_available() else 1
    argv = [
        "train",
        "--set",
        f"pert_data_path={data}",
        "--set",
        f"dataset_name={args.name}",
        *split_options,
        "--set",
        f"args.epochs={args.epochs}",
        "--set",
        f"args.batch_size={args.batch_size}",
        "--set",
        f"args.model_config.hidden_size={args.hidden_size}",
        "--set",
        f"args.save_path={run}",
        "--overwrite",  # WORK is the example's: a run of it before is replaced, as processing replaces its data
    ]
    if processes:
        argv += ["--set", f"args.cpu_processes={processes}"]
    run_gears_ddp("3. train, the held-out perturbations unseen", argv)


def predict(args, run: Path, predicted: Path) -> None:
    run_gears_ddp(
        "4. predict the held-out perturbations, cell by cell",
        [
            "predict",
            "--run",
            str(run),
            "--split",
            "test",
            "--format",
            "cell-eval",
            "--cells-per-perturbation",
            str(args.cells_per_perturbation),
            "--out",
            str(predicted),
        ],
    )


def score(args, predicted: Path, truth: Path, scores: Path) -> pd.DataFrame:
    """Run ``cell-eval run`` on the two files; its per-perturbation results."""
    argv = [
        "run",
        "-ap",
        str(predicted),
        "-ar",
        str(truth),
        "-o",
        str(scores),
        "--profile",
        args.profile,
        "--num-threads",
        str(args.num_threads),
    ]
    step("5. score with cell-eval", ["cell-eval", *argv])
    done = subprocess.run([sys.executable, "-m", "cell_eval", *argv], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(
            f"cell-eval failed (exit status {done.returncode}; pip install cell-eval if it is missing):\n"
            + done.stderr[-3000:]
        )
    return pd.read_csv(scores / "results.csv", index_col="perturbation")


def show(results: pd.DataFrame, predicted_cells: int, scores: Path) -> None:
    """cell-eval's headline metrics per held-out perturbation, and their mean."""
    table = results[[name for name in HEADLINE if name in results.columns]]
    table = pd.concat([table, table.mean().to_frame("mean").T]).rename_axis("perturbation").reset_index()
    lower = [name for name in LOWER_IS_BETTER if name in table.columns]
    print(
        f"\ncell-eval's scores of the {len(results)} held-out perturbations ({predicted_cells} predicted cells "
        f"each; higher is better, but for {' and '.join(lower)}):"
    )
    print(table.to_string(index=False, float_format=lambda value: f"{value:.4f}"))
    print(
        f"all of cell-eval's metrics: {scores / 'results.csv'} (per perturbation), "
        f"{scores / 'agg_results.csv'} (summaries)"
    )


def main() -> None:
    args = options()
    args.work.mkdir(parents=True, exist_ok=True)
    data, run = args.work / "data", args.work / "run"
    predicted = args.work / "predictions" / "test.h5ad"
    truth, scores = predicted.with_name("test.truth.h5ad"), args.work / "cell-eval"
    predicted.parent.mkdir(exist_ok=True)
    if args.adata is None:
        adata = synthetic_screen(data, args.seed)
    elif args.go_gene_sets or args.go_annotation or (data / "gene2go_all.pkl").exists():
        adata = args.adata
    else:
        sys.exit(
            f"--adata needs GO terms for its genes: give --go-gene-sets FILE.gmt or --go-annotation FILE "
            f"(or put GO files in {data})"
        )
    process(args, adata, data)
    split_options = split(args, data)
    train(args, data, run, split_options)
    predict(args, run, predicted)
    show(score(args, predicted, truth, scores), args.cells_per_perturbation, scores)


if __name__ == "__main__":  # the training step spawns worker processes
    main()
