"""Train GEARS with DistributedDataParallel on the built-in synthetic dataset (no download),
one process per device, and check that the saved model works in the single-process API.

    python examples/train_ddp_example.py [--data-path ./data/demo-synthetic] [--epochs 10] [--batch-size 32]
                                         [--gpus N | --cpu-processes 2] [--amp off|fp16|bf16]
                                         [--grad-accum-steps 1] [--lr-scaling none|linear|sqrt]
                                         [--save-path ./runs/gears_ddp_synthetic] [--overwrite]

On a machine with GPUs it trains on all of them (or the first ``--gpus N``), one process
each with NCCL; without GPUs it runs ``--cpu-processes`` processes (default 2) with gloo,
which is how the distributed path is exercised on a laptop or CI. The dataset is the
demo's: the synthetic preset calibrated to the Norman screen (``gears_ddp.datasets.preset``).
``--batch-size`` is per process, so the effective batch is batch size x processes x
``--grad-accum-steps``; ``--lr-scaling linear`` (or ``sqrt``) scales the learning rate with
it. ``--amp fp16`` (with its gradient scaler) and ``bf16`` run on CPU and GPU.

The parent process writes the dataset, loads it once, shares the expression matrix with the
workers and waits; rank 0 saves the best model (published checkpoint format). At the end
the script prints the run's summary and test metrics beside the baselines, then reloads
the saved model with ``GEARS(pert_data).load_pretrained(path)`` in this process and
predicts one test condition. For several machines use ``gears-ddp train --config`` under
torchrun or Slurm (``examples/torchrun_two_nodes.sh``, ``examples/slurm_train.sbatch``).
"""

import argparse
import time

import torch

from gears_ddp import GEARS, PertData, enable_console_logging, train_multi_gpu
from gears_ddp.datasets import preset, write_synthetic_dataset
from gears_ddp.report.verdicts import compare, summary_verdicts, verdict_table

SPLIT = {"split": "simulation", "seed": 1}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-path", default="./data/demo-synthetic")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    parser.add_argument("--save-path", default="./runs/gears_ddp_synthetic")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier run in --save-path")
    parser.add_argument("--gpus", type=int, default=None, help="number of GPUs (default: all visible)")
    parser.add_argument("--cpu-processes", type=int, default=2, help="gloo processes when no GPU is visible")
    parser.add_argument("--amp", choices=["off", "fp16", "bf16"], default="off")
    parser.add_argument("--grad-accum-steps", type=int, default=1)
    parser.add_argument("--lr-scaling", choices=["none", "linear", "sqrt"], default="none")
    args = parser.parse_args()
    enable_console_logging()

    write_synthetic_dataset(args.data_path, **preset("norman"))
    use_gpus = torch.cuda.is_available() and torch.cuda.device_count() > 0
    options = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "save_path": args.save_path,
        "overwrite_save_path": args.overwrite,
        "amp": args.amp,
        "grad_accum_steps": args.grad_accum_steps,
        "lr_scaling": args.lr_scaling,
    }
    if not use_gpus:
        options["cpu_processes"] = args.cpu_processes
    start = time.perf_counter()
    report = train_multi_gpu(args.data_path, "synthetic", SPLIT, options, n_gpus=args.gpus if use_gpus else None)
    seconds = time.perf_counter() - start

    print(
        f"\ntrained {args.epochs} epochs on {report['world_size']} {'GPU' if use_gpus else 'CPU (gloo)'} "
        f"process(es) in {seconds:.0f} s (data loading and process start included); best epoch "
        f"{report['best_epoch']}; model saved to {report['model_path']}\n"
    )
    print(verdict_table(summary_verdicts(compare(report), report["model"])))
    print("\n" + reload_and_predict(args.data_path, report["model_path"], args.batch_size))


def reload_and_predict(data_path, model_path, batch_size: int) -> str:
    """Load the saved model in this (single) process, as a user would, and predict the first
    test condition; returns a one-line confirmation."""
    pert_data = PertData(data_path)
    pert_data.load(data_path=f"{data_path}/synthetic")
    pert_data.prepare_split(**SPLIT)
    pert_data.get_dataloader(batch_size=batch_size)
    gears = GEARS(pert_data, device="cpu")
    gears.load_pretrained(model_path)
    condition = pert_data.set2conditions["test"][0]
    genes = [g for g in condition.split("+") if g != "ctrl"]
    predicted = gears.predict([genes], return_type="dataframe")
    return (
        f"saved model reloaded in a single process: OK (predicted {predicted.shape[1]} genes' expression "
        f"for {condition})"
    )


if __name__ == "__main__":
    main()
