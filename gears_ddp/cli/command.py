"""The ``gears-ddp`` command (``python -m gears_ddp`` does the same).

    gears-ddp demo [--data synthetic]               the README's main job, no download
    gears-ddp train --config run.yaml [--set args.epochs=5 ...]
    gears-ddp train --config run.yaml --seeds 1 2 3 4 5 [--split-seeds 1 2 3 4 5]   replicates
    gears-ddp evaluate --run ./runs/my_run [--set split_config.seed=2] [--out scores.json]
    gears-ddp predict --run ./runs/my_run --perturbations FEV FEV+SAMD1 --out predictions.h5ad
    gears-ddp predict --run ./runs/my_run --split test --format cell-eval [--cells-per-perturbation 100] --out test.h5ad
    gears-ddp predict --run ./runs/my_run --split test --format cell-eval --baseline linear --out test.linear.h5ad
    gears-ddp screen --run ./runs/my_run --genes FEV SAMD1 CBL --out screen.csv
    gears-ddp screen --run ./runs/my_replicates --genes FEV SAMD1 CBL --out screen.csv   intervals over models
    gears-ddp check --adata screen.h5ad --data-path ./data [--normalize --go-gene-sets go.gmt --split-seeds 1 2 3]
    gears-ddp check --config run.yaml                 the processed dataset and the splits a run would use
    gears-ddp interactions --run ./runs/my_run --out interactions.csv   observed calls beside predicted ones
    gears-ddp interactions --data-path ./data --name my_screen --out observed.csv   observed calls only
    gears-ddp process --adata screen.h5ad --data-path ./data --name my_screen [--normalize --go-gene-sets go.gmt]

``train`` on one machine starts one worker per GPU (or ``args.cpu_processes`` CPU
processes) as ``train_multi_gpu`` does; under torchrun or srun it runs this process's rank,
with the same configuration. ``--seeds`` (or a ``replicates`` key) trains one run per seed
concurrently over the devices, as ``train_replicates`` does, and summarises them.
``evaluate`` and ``predict`` read a run folder: its
``config.yaml`` says where the data is and how it was split, its model folder holds the
weights; so does ``screen``, which scores every pair of a gene set for genetic
interactions on every GPU (or one process per CPU core), and given replicates (or several
run folders) says how far the models agree on each call. ``check`` reads a screen (or a
processed dataset) as ``process`` and ``train`` would, processes nothing, and lists every
problem at once, each with its fix. Exit status: 0 done (``check``: the screen would
train), 2 a bad configuration, input or path (``check``: a problem stops the screen), 75 stopped by a signal with a checkpoint (continue with ``--set
args.resume_from=auto``; replicates: the same command), 1 anything else (a replicate that
failed included).
"""
from __future__ import annotations

import argparse
import logging
import sys
import textwrap
from pathlib import Path

from gears_ddp._logging import enable_console_logging
from gears_ddp.data.download import DownloadError
from gears_ddp.data.splits import SPLIT_TYPES
from gears_ddp.report.run_folder import CONFIG_FILE, PAGE_FILE
from gears_ddp.distributed.run_config import RunConfigError, option_help, read_run_config, resolve_with_overrides
from gears_ddp.evaluation.baselines import BASELINES, PRETRAINED
from gears_ddp.inference.prediction import CHANGE_MODES, DRAWN_CELLS_CHANGE, EXACT_CHANGE, checked_cell_count
from gears_ddp.runtime.stopping import EXIT_INTERRUPTED, TrainingInterrupted
from gears_ddp.training.finite_loss import NonFiniteLoss

EXIT_FAILED, EXIT_BAD_INPUT = 1, 2
DEMO_RUN_PATH, DEMO_PRESET, DEMO_SYNTHETIC_NAME = "./runs/demo", "norman", "synthetic"
DEMO_DATA_PATHS = {"real": "./data/demo", "synthetic": "./data/demo-synthetic"}
DEMO_DATA = {
    "real": "the real screen of Papalexi et al. (Nature Genetics 2021): CRISPR knockouts in THP-1 cells, single "
            "genes only, its raw counts packaged with gears_ddp (gears_ddp.datasets.papalexi2021)",
    "synthetic": "synthetic data calibrated to the Norman screen, with two-gene combinations "
                 "(gears_ddp.datasets.write_synthetic_dataset, preset 'norman')",
}
DEMO_FINDINGS = {
    "real": ("Measured over 3 seeds in benchmarks/RESULTS.md: on this screen GEARS beats predicting no change on "
             "mse_de at every seed but not clearly on mse, is level with the mean-effect baseline on mse_de, and "
             "stays below it on mse and pearson_delta at every seed. Why, measured beside the published GEARS: "
             "the test knockouts' GO neighbours are genes no training knockout reads; with a GO graph of the "
             "screen's own genes (--set args.default_pert_graph=false) GEARS scores higher, as the published "
             "GEARS does on a graph of the knockouts alone (docs/demo.md)."),
    "synthetic": ("Measured in benchmarks/RESULTS.md: on this Norman-calibrated data GEARS, the published package "
                  "too, beats predicting no change on mse_de but not on mse, and stays below the mean-effect "
                  "baseline's pearson_delta, also when trained with a Norman run's learning budget."),
}
FORMATS = ("anndata", "cell-eval", "csv")


def build_parser() -> argparse.ArgumentParser:
    # no abbreviated options: `train --seed 3` must not be read as `--seeds 3`
    parser = argparse.ArgumentParser(prog="gears-ddp", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = commands.add_parser("train", allow_abbrev=False, help="train from a YAML configuration", epilog=option_help(),
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Train GEARS as train_multi_gpu does, from a YAML file whose top-level "
                                            "keys are train_multi_gpu's parameters: pert_data_path, dataset_name, "
                                            "split_config, args, n_gpus, gpu_ids.")
    train.add_argument("--config", help="the YAML file (a run folder's config.yaml repeats that run)")
    train.add_argument("--seeds", nargs="+", type=int, metavar="SEED",
                       help="replicates: one run per model seed in save_path/seed-N, summarised in save_path "
                            "(replicates.seeds)")
    train.add_argument("--split-seeds", nargs="+", type=int, metavar="SEED",
                       help="replicates: one run per split seed (replicates.split_seeds); with --seeds, the lists "
                            "pair up")
    _add_set(train)

    demo = commands.add_parser("demo", allow_abbrev=False, help="train on a built-in screen (no download) and write a run report",
                               description="Train GEARS with DDP on a screen that ships with gears_ddp: by default "
                                           "the real one (Papalexi et al. 2021, CRISPR knockouts), processed from its "
                                           "raw counts as gears-ddp process does; --data synthetic for the synthetic "
                                           "data calibrated to the Norman screen, which has two-gene combinations.")
    demo.add_argument("--data", choices=list(DEMO_DATA), default="real",
                      help="; ".join(f"{name}: {meaning}" for name, meaning in DEMO_DATA.items()))
    demo.add_argument("--data-path", help="where the dataset is written (default: "
                                          + ", ".join(f"{path} for {name}" for name, path in DEMO_DATA_PATHS.items())
                                          + ")")
    demo.add_argument("--save-path", default=DEMO_RUN_PATH, help="the run folder")
    demo.add_argument("--epochs", type=int, default=10)
    demo.add_argument("--cpu-processes", type=int, default=2, help="CPU processes when no GPU is visible")
    _add_set(demo)

    evaluate = commands.add_parser("evaluate", allow_abbrev=False, help="score a saved model on the test set beside the baselines")
    _add_run(evaluate)
    evaluate.add_argument("--out", help="also write the scores as JSON here")

    predict = commands.add_parser("predict", allow_abbrev=False, help="predict perturbations with a saved model")
    _add_run(predict)
    what = predict.add_mutually_exclusive_group(required=True)
    what.add_argument("--perturbations", nargs="+", metavar="GENES",
                      help="queries: a gene (FEV) or two joined by + (FEV+SAMD1)")
    what.add_argument("--split", choices=("train", "val", "test"),
                      help="every cell of this set of the run's split, with the truth written beside it")
    predict.add_argument("--format", choices=FORMATS, default="anndata",
                         help="anndata: one row per query (mean); cell-eval: cells in cell-eval's layout; "
                              "csv: one row per query")
    predict.add_argument("--cells-per-perturbation", type=int, metavar="N",
                         help="predict N cells per perturbation, from N control cells drawn at random (seed 0): "
                              "with --split, instead of one per cell of the set; with --perturbations, instead of "
                              "300")
    predict.add_argument("--baseline", choices=(*BASELINES, PRETRAINED),
                         help="with --split: that baseline's cells instead of the model's, built the same way, to "
                              "score with cell-eval beside the model's (linear_pretrained: the run's "
                              "args.linear_baseline_screen)")
    predict.add_argument("--out", required=True, help="the file to write (.h5ad, or .csv)")

    screen = commands.add_parser("screen", allow_abbrev=False, help="score every pair of a gene set for genetic interactions",
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=screen_help(),
                                 description="Predict every single and pair of the genes with a saved model and "
                                             "score each pair as GI_predict does; writes the table (--out), its "
                                             "record (.json beside it) and a picture (.png). Given a replicates "
                                             "folder or several run folders, every model screens the pairs and "
                                             "the table says, per pair, how the models agree: mean, sd and 95% "
                                             "interval of every score, and which calls are confident. Run again "
                                             "after an interruption, it continues from the chunks it finished.")
    screen.add_argument("--run", required=True, nargs="+", metavar="RUN",
                        help="a run folder (config.yaml and the saved model); or a replicates folder (gears-ddp train "
                             "--seeds ...) or several run folders: a screen over replicates")
    _add_set(screen)
    genes = screen.add_mutually_exclusive_group(required=True)
    genes.add_argument("--genes", nargs="+", metavar="GENE", help="the genes whose pairs are screened")
    genes.add_argument("--genes-file", help="the genes: one per line, or a .npy array of names")
    genes.add_argument("--all-perturbable", action="store_true",
                       help="every gene of the model's perturbation vocabulary (n genes: n(n-1)/2 pairs)")
    screen.add_argument("--out", required=True, help="the table (.csv), one row per pair; over replicates each "
                                                     "model's table goes to <out>.models/")
    screen.add_argument("--gi-genes-file", help="take the scores on the genes listed here only (GI_predict's "
                                                "GI_genes_file: one per line, or a .npy array)")
    screen.add_argument("--change", choices=list(CHANGE_MODES), default=EXACT_CHANGE,
                        help="; ".join(f"{mode}: {meaning}" for mode, meaning in CHANGE_MODES.items()))
    screen.add_argument("--seed", type=int, nargs="+", metavar="SEED",
                        help=f"seed of the drawn control cells (--change {DRAWN_CELLS_CHANGE} only; default 0); "
                             "over replicates several seeds measure the drawn cells' noise within each model")
    screen.add_argument("--figure", help="the picture (default: --out with .png)")
    screen.add_argument("--changes-out", help="also write the predicted changes (singles and pairs x genes) as "
                                              "AnnData (.h5ad); one run only")
    screen.add_argument("--cpu-processes", type=int, help="CPU worker processes, one thread each (default without "
                                                          "GPUs: one per usable core)")
    screen.add_argument("--gpu-ids", type=int, nargs="+", help="GPUs for the workers (default: every visible GPU)")
    screen.add_argument("--overwrite", action="store_true", help="replace an existing screen at --out")

    interactions = commands.add_parser(
        "interactions", allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        help="score the observed two-gene combinations for genetic interactions, beside a model's calls",
        epilog=interactions_help(),
        description="Score every observed two-gene combination A+B whose singles were observed too from its observed "
                    "changes (its mean expression minus the mean of the control cells), with the scores and "
                    "interaction types of a screen. Given a run folder, the model's predictions of the same pairs "
                    "are scored beside them, and the agreement (per score the correlation and the mean absolute "
                    "difference; per type how many calls agree, with the confusion table) is printed and written "
                    "beside the table (.json); given a replicates folder or several run folders, the models' mean "
                    "scores and majority calls are.")
    source = interactions.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", nargs="+", metavar="RUN", help="a run folder, a replicates folder or several run "
                                                                "folders: their models' calls beside the observed")
    source.add_argument("--data-path", help="with --name: a processed dataset, its observed calls only")
    interactions.add_argument("--name", help="with --data-path: the dataset (the folder under --data-path)")
    interactions.add_argument("--pairs", choices=("test", "all"), default="test",
                              help="with --run: the combinations of the run's test set (default) or every observed "
                                   "one")
    interactions.add_argument("--gi-genes-file", help="take the scores on the genes listed here only (GI_predict's "
                                                      "GI_genes_file: one per line, or a .npy array)")
    interactions.add_argument("--out", required=True, help="the table (.csv), one row per pair")
    _add_set(interactions)

    process = commands.add_parser(
        "process", allow_abbrev=False, help="turn a screen (h5ad) into a GEARS-format dataset folder",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Process a screen into DATA_PATH/NAME/perturb_processed.h5ad, as PertData.new_data_process "
                    "does. The screen may come as screens come: its perturbations in a column of its own, raw "
                    "counts, no cell type; GO files may be built from a GAF annotation or from GMT gene sets.",
        epilog="example (a screen with raw counts, its targets in obs['target_gene'], GO from Enrichr gene sets):\n"
               "  gears-ddp process --adata screen.h5ad --data-path ./data --name my_screen \\\n"
               "      --perturbation-column target_gene --control-label non-targeting --normalize \\\n"
               "      --go-gene-sets GO_Biological_Process_2021.gmt.gz --drop-unannotated")
    process.add_argument("--adata", required=True, help=SCREEN_HELP)
    process.add_argument("--data-path", required=True, help="data folder (GO files, datasets)")
    process.add_argument("--name", required=True, help="dataset name: the folder under --data-path")
    _add_screen_options(process, "build the GO files of --data-path from")
    process.add_argument("--overwrite", action="store_true", help="replace an existing processed dataset")

    check = commands.add_parser(
        "check", allow_abbrev=False, help="check a screen whole before it is processed: every problem, each with "
                                          "its fix", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Read a screen as gears-ddp process would (--adata, with process's options), or a processed dataset as "
            "gears-ddp train would (--data-path and --name, or --config), and process nothing: report its "
            "conditions and their cells, its perturbed genes (measured? with GO terms?), its expression (raw "
            "counts or log-normalised, and what normalisation will do), repeated genes or cells, and the sets of "
            "each split asked for; then every problem at once, each with its fix. Exit status 0 when the screen "
            "would train (its warnings printed), 2 when a problem stops it.", 100),
        epilog="example (the screen of gears-ddp process --help, three split seeds):\n"
               "  gears-ddp check --adata screen.h5ad --data-path ./data \\\n"
               "      --perturbation-column target_gene --control-label non-targeting --normalize \\\n"
               "      --go-gene-sets GO_Biological_Process_2021.gmt.gz --drop-unannotated --split-seeds 1 2 3")
    check.add_argument("--adata", help=SCREEN_HELP + "; without it, the processed dataset DATA_PATH/NAME")
    check.add_argument("--data-path", help="data folder: its GO files, and without --adata the dataset (default: "
                                           "--config's pert_data_path)")
    check.add_argument("--name", help="dataset name (default: --config's dataset_name; with --adata, the file's "
                                      "name): with --adata, the cell type given to a screen without one")
    check.add_argument("--config", help="a run's YAML file (gears-ddp train --config): its dataset, split_config, "
                                        "replicates.split_seeds and args.default_pert_graph")
    _add_screen_options(check, "check as if the GO files of --data-path were built from")
    splits = check.add_argument_group("splits (each type with each seed; default: --config's split_config, else "
                                      "the simulation split with seed 1, as gears-ddp train)")
    splits.add_argument("--split", nargs="+", choices=SPLIT_TYPES, metavar="TYPE",
                        help=f"split types: {', '.join(SPLIT_TYPES)}")
    splits.add_argument("--split-seeds", nargs="+", type=int, metavar="SEED", help="split seeds")
    _add_set(check)
    return parser


SCREEN_HELP = "the screen (h5ad): X log-normalised, or raw counts with --normalize; var['gene_name'] the gene symbols"


def _add_screen_options(parser, go_meaning: str) -> None:
    """The options that say how a screen is read (gears-ddp process and check); a GO file's
    ``go_meaning`` (what the command does with it)."""
    columns = parser.add_argument_group("the screen's perturbations (default: obs['condition'] written 'ctrl', "
                                        "'A+ctrl', 'A+B'; without obs['cell_type'], one cell type is given)")
    columns.add_argument("--perturbation-column", metavar="COLUMN",
                         help="the obs column naming each cell's perturbed gene(s), e.g. target_gene")
    columns.add_argument("--control-label", metavar="LABEL", help="its label of control cells, e.g. non-targeting")
    columns.add_argument("--combination-separator", metavar="TEXT",
                         help="the text joining two genes in its labels, e.g. + or _ (default: one gene per label)")
    counts = parser.add_argument_group("raw counts")
    counts.add_argument("--normalize", action="store_true",
                        help="X holds raw counts: normalise each cell to 1e4 counts, then log1p (scanpy's "
                             "normalize_total and log1p); counts without it are refused")
    counts.add_argument("--n-top-genes", type=int, metavar="N",
                        help="with --normalize: keep the N highly variable genes (scanpy, flavor seurat_v3, on the "
                             "counts) and every perturbed gene")
    go = parser.add_argument_group("Gene Ontology (perturbed genes without GO terms are named and refused unless "
                                   "--drop-unannotated)")
    go_source = go.add_mutually_exclusive_group()
    go_source.add_argument("--go-annotation", metavar="FILE",
                           help=f"{go_meaning} this gene-to-GO annotation (a GAF file, or a two-column table gene, "
                                "GO id)")
    go_source.add_argument("--go-gene-sets", metavar="FILE",
                           help=f"{go_meaning} gene sets (GMT: name, description, genes; tab-separated; .gmt or "
                                ".gmt.gz, as Enrichr and MSigDB publish them)")
    go.add_argument("--drop-unannotated", action="store_true",
                    help="drop the cells of perturbed genes without GO terms (the published GEARS drops them)")


def _add_set(parser) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one value, e.g. args.epochs=5 or args.model_config.hidden_size=32")


def _add_run(parser) -> None:
    parser.add_argument("--run", required=True, help="a run folder (config.yaml and the saved model)")
    _add_set(parser)


def main(argv=None) -> int:
    options = build_parser().parse_args(argv)
    enable_console_logging(logging.WARNING if options.command == "check" else logging.INFO)  # check: its report
    command = {"train": train, "demo": demo, "evaluate": evaluate, "predict": predict, "screen": screen,
               "interactions": interactions, "process": process, "check": check}
    try:
        return command[options.command](options) or 0
    except (RunConfigError, FileNotFoundError, FileExistsError, PermissionError, ValueError, DownloadError) as err:
        print(f"gears-ddp {options.command}: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except TrainingInterrupted as stop:
        print(f"gears-ddp {options.command}: {stop}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except NonFiniteLoss as diverged:
        print(f"gears-ddp {options.command}: {diverged}", file=sys.stderr)
        return EXIT_FAILED


# ----------------------------------------------------------------------------- commands


def train(options) -> int:
    if options.config is None and not options.overrides:
        raise RunConfigError("give --config run.yaml (or at least --set pert_data_path=... --set dataset_name=...)")
    overrides = list(options.overrides)
    for key, seeds in (("seeds", options.seeds), ("split_seeds", options.split_seeds)):
        if seeds is not None:
            overrides.append(f"replicates.{key}={seeds}")
    config = read_run_config(options.config, overrides) if options.config else \
        resolve_with_overrides({}, overrides, "--set")
    return _train(config)


def demo(options) -> int:
    """The main job: a built-in screen (the real one, or the synthetic data calibrated to the
    Norman screen), 2 CPU processes (or every GPU), a run report, and whether the model learned.
    Its configuration is checked before the data is written."""
    from gears_ddp.datasets import preset, write_papalexi2021_dataset, write_synthetic_dataset
    from gears_ddp.datasets.real_screen import NAME as REAL_SCREEN_NAME
    from gears_ddp.runtime.devices import cuda_or_cpu

    data_path = options.data_path or DEMO_DATA_PATHS[options.data]
    args = {"epochs": options.epochs, "save_path": options.save_path}
    if cuda_or_cpu().type == "cpu":
        args["cpu_processes"] = options.cpu_processes
    config = {"pert_data_path": data_path,
              "dataset_name": REAL_SCREEN_NAME if options.data == "real" else DEMO_SYNTHETIC_NAME,
              "split_config": {"split": "simulation", "seed": 1}, "args": args}
    config = resolve_with_overrides(config, options.overrides, "its options")
    if options.data == "real":
        folder = write_papalexi2021_dataset(data_path)
    else:
        folder = write_synthetic_dataset(data_path, name=DEMO_SYNTHETIC_NAME, **preset(DEMO_PRESET))
    print(f"Data: {DEMO_DATA[options.data]}, in {folder}.")
    return _train(config, note=DEMO_FINDINGS[options.data])


def _train(config: dict, note: str | None = None) -> int:
    """Train with a resolved configuration: spawned workers, or this rank under a launcher."""
    from gears_ddp.distributed.launch_environment import launch_environment

    environment = launch_environment()
    if config.get("replicates") is not None:
        if environment is not None:
            raise RunConfigError(f"replicates run on one machine, started by gears-ddp train itself, not under "
                                 f"{environment.source}: start it without the launcher")
        return _train_replicates(config)
    if environment is not None:
        from gears_ddp.distributed.launch import run_launched_rank

        report = run_launched_rank(config["pert_data_path"], config["dataset_name"], config["split_config"],
                                   config["args"], environment)
        if report is not None:
            _print_summary(report, note)
        return 0
    from gears_ddp.train_distributed import train_multi_gpu

    report = train_multi_gpu(**config)
    _print_summary(report, note)
    return 0


def _train_replicates(config: dict) -> int:
    """Train the replicates and print their summary; 1 when some did not finish."""
    from gears_ddp.distributed.replicates import ReplicatesFailed, train_replicates
    from gears_ddp.report.replicate_summary import replicate_table

    try:
        summary, status = train_replicates(**config), 0
    except ReplicatesFailed as failure:
        print(f"gears-ddp train: {failure}", file=sys.stderr)
        summary, status = failure.summary, EXIT_FAILED
    print(f"\n{summary['finished']} of {len(summary['replicates'])} replicates finished")
    overall = [record for record in summary["metrics"] if record["subgroup"] is None]
    if overall:
        print(replicate_table(overall))
    print(f"\nsummary with every subgroup, plots and each replicate's report: {summary['report_path']}")
    return status


def _print_summary(report: dict, note: str | None = None) -> None:
    from gears_ddp.report.learning import learning_checks

    print(f"\nbest epoch {report['best_epoch']} of {len(report['history'])}, {report['world_size']} process(es)")
    if "model" in report:  # the log above shows the test table, once
        run = Path(report.get("model_path", "."))
        print(f"The test verdicts above come from one seed; for 95% intervals over seeds: gears-ddp train --config "
              f"{run / CONFIG_FILE} --seeds 1 2 3 4 5 --set args.save_path={run}-replicates")
    print("\n" + "\n".join(learning_checks(report) + ([note] if note else [])))
    if "model_path" in report:
        print(f"\nmodel and run report in {report['model_path']} (open {Path(report['model_path']) / PAGE_FILE})")


def evaluate(options) -> int:
    from gears_ddp.runs.saved_runs import load_run
    from gears_ddp.report.run_folder import write_json

    gears = load_run(options.run, options.overrides)
    if "test_loader" not in gears.dataloader:
        raise ValueError(f"the split of {options.run} has no test set to score")
    scores = gears.test(linear_baseline_screen=_linear_baseline_screen(options))  # logs the verdicts
    if options.out:
        write_json(options.out, scores)
        print(f"scores written to {options.out}")
    return 0


def _linear_baseline_screen(options) -> str | None:
    """The run's ``args.linear_baseline_screen`` (with the ``--set`` overrides)."""
    return read_run_config(Path(options.run) / CONFIG_FILE, options.overrides)["args"].get("linear_baseline_screen")


def predict(options) -> int:
    from gears_ddp.runs.saved_runs import load_run

    if options.cells_per_perturbation is not None:
        checked_cell_count(options.cells_per_perturbation)  # before the run is loaded
    if options.baseline is not None and options.split is None:
        raise ValueError("--baseline writes a baseline's cells of a split: give --split too")
    gears = load_run(options.run, options.overrides)
    out = Path(options.out)
    if options.split is not None:
        if options.format == "csv":
            raise ValueError("--split writes cells: use --format cell-eval or anndata")
        baseline = {} if options.baseline is None else {"baseline": options.baseline,
                                                        "linear_baseline_screen": _linear_baseline_screen(options)}
        predicted, real = gears.predict_split(options.split, cells_per_perturbation=options.cells_per_perturbation,
                                              **baseline)
        truth = out.with_name(out.name.replace(".h5ad", "") + ".truth.h5ad")
        predicted.write_h5ad(out)
        real.write_h5ad(truth)
        n_cells = options.cells_per_perturbation
        what = f"{predicted.n_obs} cells" if n_cells is None else \
            f"{predicted.obs['condition'].nunique() - 1} perturbations ({n_cells} cells each) and the control cells"
        print(f"predictions for the {what} of the {options.split} set written to {out}, their true expression to "
              f"{truth}")
        return 0
    queries = [[gene for gene in query.split("+") if gene != "ctrl"] for query in options.perturbations]
    drawn = {} if options.cells_per_perturbation is None else {"cells_per_perturbation": options.cells_per_perturbation}
    if options.format == "csv":
        gears.predict(queries, return_type="anndata", **drawn).to_df().to_csv(out)
    else:
        gears.predict(queries, return_type=options.format, **drawn).write_h5ad(out)
    print(f"predictions for {len(queries)} perturbation(s) written to {out}")
    return 0


def screen_help() -> str:
    """The meaning of every column of a screen's table, for ``gears-ddp screen --help``."""
    from gears_ddp.interactions.scores import GI_SCORE_MEANINGS
    from gears_ddp.interactions.calls import INTERACTION_TYPE_MEANINGS
    from gears_ddp.inference.pair_screen import PAIR_SCREEN_COLUMN_MEANINGS as SCREEN_COLUMN_MEANINGS
    from gears_ddp.inference.pair_screen_statistics import SUMMARY_COLUMN_MEANINGS

    sections = (("the table, one row per pair", SCREEN_COLUMN_MEANINGS),
                ("its scores (A, B, AB: the changes over control of the singles and the double, one value per gene; "
                 "docs/screens.md reads an example)", GI_SCORE_MEANINGS),
                ("the interaction types they imply (the published analysis's thresholds)", INTERACTION_TYPE_MEANINGS),
                ("a screen over replicates: the pair's columns, then for each score (<score>) and each type "
                 "(<type>)", SUMMARY_COLUMN_MEANINGS))
    return "\n\n".join(meanings_text(title, meanings) for title, meanings in sections)


def meanings_text(title: str, meanings: dict[str, str]) -> str:
    """``title:`` then one line per name, its meaning wrapped beside it (a command's epilog)."""
    lines = textwrap.wrap(f"{title}:", 100, break_on_hyphens=False)
    width = max(map(len, meanings)) + 2
    for name, meaning in meanings.items():
        wrapped = textwrap.wrap(meaning, 100 - width - 2, break_on_hyphens=False)
        lines += [f"  {name:<{width}}{wrapped[0]}", *(" " * (width + 2) + line for line in wrapped[1:])]
    return "\n".join(lines)


def screen(options) -> int:
    from gears_ddp.data.io import write_h5ad
    from gears_ddp.runs.saved_runs import is_replicates_folder, load_run
    from gears_ddp.distributed.pair_screen import screen_on_devices
    from gears_ddp.inference.figures import plot_screen
    from gears_ddp.interactions.calls import read_gene_list
    from gears_ddp.inference.replicate_pair_screen import ReplicatePairScreenFolder as ReplicateScreenFolder
    from gears_ddp.inference.pair_screen import PairScreenFolder as ScreenFolder, checked_output_file, \
        pair_screen_changes as screen_changes

    replicates = len(options.run) > 1 or is_replicates_folder(options.run[0])
    # bad names fail before the runs are loaded
    out = (ReplicateScreenFolder if replicates else ScreenFolder)(options.out).table
    figure = checked_output_file(options.figure or out.with_suffix(".png"), "--figure", "a picture",
                                 figure_suffixes())
    if options.changes_out is not None:
        if replicates:
            raise ValueError("--changes-out writes the changes one model predicts: give it with one run folder "
                             "(e.g. one replicate's)")
        checked_output_file(options.changes_out, "--changes-out", "AnnData", (".h5ad",))
    if options.seed is not None and options.change == EXACT_CHANGE:
        raise ValueError(f"--seed draws control cells for --change {DRAWN_CELLS_CHANGE} only; the exact change (the "
                         "default) draws none")
    seeds = options.seed or [0]
    if len(seeds) > 1 and not replicates:
        raise ValueError(f"several --seed values ({seeds}) measure the drawn cells' noise within the models of a "
                         "screen over replicates; a screen of one run takes one")
    genes = read_gene_list(options.genes_file) if options.genes_file else options.genes
    if replicates:
        return _screen_replicates(options, None if options.all_perturbable else genes, out, figure, seeds)
    gears = load_run(options.run[0], options.overrides)
    genes = gears.pert_list if options.all_perturbable else genes
    choice = {"GI_genes_file": options.gi_genes_file, "change": options.change, "seed": seeds[0]}
    table = screen_on_devices(gears, genes, out, options.overwrite, options.cpu_processes, options.gpu_ids, **choice)
    plot_screen(table, figure)
    print(f"screen of {len(genes)} genes: {len(table)} pairs written to {out} (its record: "
          f"{out.with_suffix('.json')}), the picture to {figure}")
    if options.changes_out:
        write_h5ad(screen_changes(gears.screen_job(genes, **choice), gears.gene_list), options.changes_out)
        print(f"predicted changes of {len(genes)} singles and {len(table)} pairs written to {options.changes_out}")
    for title, row in (("highest mag", table["mag"].idxmax()), ("lowest mag", table["mag"].idxmin())):
        print(f"{title}: {table.at[row, 'pair']} (mag {table.at[row, 'mag']:.3f}, {table.at[row, 'magnitude_type']})")
    return 0


def _screen_replicates(options, genes, out: Path, figure: Path, seeds: list[int]) -> int:
    """A screen over replicates, its picture, and how many calls are confident."""
    from gears_ddp.runs.pair_screens import screen_replicates
    from gears_ddp.inference.figures import plot_replicate_screen
    from gears_ddp.inference.pair_screen_statistics import confident_counts

    summary = screen_replicates(options.run, genes, out, options.overwrite, options.cpu_processes, options.gpu_ids,
                                options.gi_genes_file, options.change, seeds, overrides=options.overrides)
    plot_replicate_screen(summary, figure)
    models = int(summary["models"].iloc[0])
    print(f"screen over {models} models: {len(summary)} pairs summarised in {out} (its record: "
          f"{out.with_suffix('.json')}; each model's table in {out.with_suffix('.models')}), the picture to {figure}")
    print(f"confident calls (every model agrees and the 95% interval over the models lies on the call's side), of "
          f"{len(summary)} pairs:")
    for kind, counts in confident_counts(summary).items():
        print(f"  {kind}: " + ", ".join(f"{call} {count}" for call, count in counts.items()))
    return 0


def interactions_help() -> str:
    """The columns of ``gears-ddp interactions``'s table, for its ``--help``."""
    from gears_ddp.interactions.observed import OBSERVED_COLUMN_MEANINGS

    return meanings_text("the table, one row per observed pair (with --run, observed_<name> beside "
                         "predicted_<name>)", OBSERVED_COLUMN_MEANINGS)


def interactions(options) -> int:
    from gears_ddp.data.pertdata import PertData
    from gears_ddp.runs.interaction_check import check_saved_runs
    from gears_ddp.interactions.agreement import CALL_NAMES, agreement_lines
    from gears_ddp.interactions.observed import observed_interactions
    from gears_ddp.interactions.calls import CALL_ORDER
    from gears_ddp.inference.pair_screen import checked_output_file, write_record, write_table

    out = checked_output_file(options.out, "--out", "CSV", (".csv",))
    if options.data_path is not None:
        if options.name is None:
            raise ValueError("--data-path needs --name: the dataset's folder under it")
        pert_data = PertData(options.data_path)
        pert_data.load(data_path=str(Path(options.data_path) / options.name))
        table = observed_interactions(pert_data, None, options.gi_genes_file)
        write_table(table, out)
        print(f"{len(table)} observed pairs of {options.name} scored, written to {out}")
        for kind in CALL_ORDER:
            counts = table[kind].value_counts()
            print(f"  {kind}: " + ", ".join(f"{CALL_NAMES.get(call, call)} {counts.get(call, 0)}"
                                            for call in CALL_ORDER[kind]))
        return 0
    if options.name is not None:
        raise ValueError("--name goes with --data-path; a run folder says its dataset itself")
    table, agreement = check_saved_runs(options.run, None if options.pairs == "all" else "test",
                                        options.gi_genes_file, options.overrides)
    write_table(table, out)
    write_record(out.with_suffix(".json"), agreement)
    print(f"observed and predicted calls written to {out}, their agreement to {out.with_suffix('.json')}")
    print("\n".join(agreement_lines(agreement)))
    return 0


def figure_suffixes() -> tuple[str, ...]:
    """The file suffixes matplotlib writes pictures as (.png, .pdf, .svg, ...)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return tuple(f".{suffix}" for suffix in FigureCanvasBase.get_supported_filetypes())


def process(options) -> int:
    """Process a screen; the GO files of --go-annotation or --go-gene-sets are checked with it
    and written with it, all or none, so a refused screen leaves the data folder as it was."""
    from gears_ddp.data.conditions import genes_of_conditions
    from gears_ddp.data.io import read_h5ad
    from gears_ddp.data.pertdata import PertData

    source = Path(options.adata)
    if not source.exists():
        raise FileNotFoundError(f"--adata {source} does not exist")
    # a file that is no h5ad fails here, before anything is written; its expression stays on
    # disk, read a block of cells at a time
    adata = read_h5ad(source, backed=True)
    gene2go, origin = _go_annotation(options) or (None, "")
    pert_data = PertData(options.data_path)
    pert_data.new_data_process(options.name, adata, overwrite=options.overwrite, **_screen_options(options),
                               drop_unannotated=options.drop_unannotated, go_annotation=gene2go,
                               go_annotation_origin=str(origin))
    if gene2go is not None:
        print(f"GO files built from {origin} ({len(gene2go)} genes) in {options.data_path}")
    perturbed = genes_of_conditions(adata.obs["condition"].astype(str).unique())
    dropped = [gene for gene in perturbed if gene not in pert_data.node_map_pert]
    print(f"dataset {options.name}: {pert_data.cells.n_cells} cells x {len(pert_data.var)} genes, "
          f"{len(pert_data.cells.conditions)} conditions, written to {pert_data.dataset_path}; "
          f"{len(perturbed) - len(dropped)} of {len(perturbed)} perturbed genes have GO terms"
          + (f" (cells dropped: {', '.join(dropped)})" if dropped else ""))
    return 0


def _screen_options(options) -> dict:
    """How the screen is read: ``new_data_process``'s options from the command line."""
    return {"perturbation_column": options.perturbation_column, "control_label": options.control_label,
            "combination_separator": options.combination_separator, "normalize": options.normalize,
            "n_top_genes": options.n_top_genes}


def _go_annotation(options) -> tuple[dict, str] | None:
    """The GO annotation (gene -> GO terms) of --go-annotation or --go-gene-sets and its file, or None."""
    from gears_ddp.data.gene_sets import read_gene_sets
    from gears_ddp.data.go_files import read_annotation

    path = options.go_annotation or options.go_gene_sets
    if path is None:
        return None
    return (read_annotation(path) if options.go_annotation else read_gene_sets(path)), path


def check(options) -> int:
    """Report everything a screen (``--adata``) or processed dataset holds that matters to
    processing and training it, and every problem; 0 when it would train, else 2."""
    from gears_ddp.data.pertdata import PertData

    config, data_path, name = _check_config(options)
    adata, screen = _screen_to_check(options, data_path, name)
    gene2go, origin = _go_annotation(options) or (None, "")
    seeds = options.split_seeds or (config.get("replicates") or {}).get("split_seeds") or \
        [config["split_config"]["seed"]]
    splits = [{**config["split_config"], "split": split, "seed": seed}
              for split in options.split or [config["split_config"]["split"]] for seed in seeds]
    pert_data = PertData(data_path, default_pert_graph=config["args"]["default_pert_graph"])
    report = pert_data.check_screen(adata, name, **screen, splits=splits, go_annotation=gene2go,
                                    go_annotation_origin=origin)
    print(report)
    return 0 if report.would_train else EXIT_BAD_INPUT


def _check_config(options) -> tuple[dict, str, str]:
    """The run configuration a check reads (``--config``, or one of ``--set`` alone), the
    data folder and the dataset's name."""
    if options.config is None and options.data_path is None:
        raise ValueError("give the data folder (--data-path: its GO files) or a run's configuration (--config)")
    if options.config is not None:
        config = read_run_config(options.config, options.overrides)
        return config, options.data_path or config["pert_data_path"], options.name or config["dataset_name"]
    if options.adata is None and options.name is None:
        raise ValueError("give the screen (--adata), or name the processed dataset of --data-path (--name)")
    name = options.name or Path(options.adata).stem
    config = resolve_with_overrides({"pert_data_path": options.data_path, "dataset_name": name}, options.overrides,
                                    "--set")
    return config, options.data_path, name


def _screen_to_check(options, data_path: str, name: str) -> tuple:
    """The screen to check (backed: its expression read a block at a time) and
    ``PertData.check_screen``'s options for it: the screen of ``--adata`` as ``gears-ddp
    process`` reads it, or the processed dataset ``data_path/name`` as ``PertData.load`` does."""
    from gears_ddp.data.download import DATASET_FILE_IDS
    from gears_ddp.data.io import PROCESSED_FILE, read_h5ad

    screen = _screen_options(options)
    if options.adata is not None:
        return read_h5ad(options.adata, backed=True), {**screen, "drop_unannotated": options.drop_unannotated}
    given = [f"--{key.replace('_', '-')}" for key, value in screen.items() if value not in (None, False)]
    if given:
        raise ValueError(f"{', '.join(given)} read a screen as it comes: give it with --adata")
    processed = Path(data_path) / name / PROCESSED_FILE
    if not processed.is_file():
        raise FileNotFoundError(f"no processed dataset at {processed}: check the screen itself (--adata), or process "
                                "it first (gears-ddp process)" + (f"; {name!r} is a published dataset, which "
                                                                  "gears-ddp train downloads"
                                                                  if name in DATASET_FILE_IDS else ""))
    return read_h5ad(processed, backed=True), {"skip_calc_de": True}


if __name__ == "__main__":
    sys.exit(main())
