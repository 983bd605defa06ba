"""The data pipeline end to end on the built-in synthetic dataset (no download).

    python examples/data_pipeline.py [--data-path ./data] [--world-size 2]

Writes the synthetic dataset, loads it, splits it as the published GEARS does, builds both
gene graphs and iterates one epoch of the loaders every rank of a distributed run would
get, then prints what a user checks before training.
"""

import argparse
import time

import torch

from gears_ddp import PertData, enable_console_logging
from gears_ddp.datasets import write_synthetic_dataset


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-path", default="./data")
    parser.add_argument("--split", default="simulation")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--world-size", type=int, default=2, help="ranks to build loaders for")
    args = parser.parse_args()
    enable_console_logging()

    start = time.perf_counter()
    folder = write_synthetic_dataset(args.data_path)
    pert_data = PertData(args.data_path)
    pert_data.load(data_path=folder)
    pert_data.prepare_split(split=args.split, seed=args.seed)
    coexpression, go = pert_data.coexpression_graph(), pert_data.go_graph()
    ready = time.perf_counter() - start

    print(
        f"\ndataset      {folder}: {pert_data.adata.n_obs} cells x {pert_data.adata.n_vars} genes, "
        f"{len(pert_data.cells.conditions)} conditions"
    )
    print(
        f"split        {args.split} (seed {args.seed}): "
        + ", ".join(f"{k} {len(v)} conditions" for k, v in pert_data.set2conditions.items())
    )
    if pert_data.subgroup:
        print("test groups  " + ", ".join(f"{k} {len(v)}" for k, v in pert_data.subgroup["test_subgroup"].items()))
    print(
        f"graphs       co-expression {coexpression.num_edges} edges over {pert_data.adata.n_vars} genes; "
        f"GO {go.num_edges} edges over {len(pert_data.pert_names)} perturbable genes"
    )
    for rank in range(args.world_size):
        loaders = pert_data.get_dataloader_distributed(args.batch_size, world_size=args.world_size, rank=rank)
        tick = time.perf_counter()
        cells = {name: sum(len(b) for b in loader) for name, loader in loaders.items()}
        batch = next(iter(loaders["train_loader"]))
        print(
            f"rank {rank}/{args.world_size}   "
            + ", ".join(f"{k} {v} cells" for k, v in cells.items())
            + f" in {1000 * (time.perf_counter() - tick):.1f} ms; batch x {tuple(batch.x.shape)}, "
            f"pert_idx {tuple(batch.pert_idx.shape)}, de_idx {tuple(batch.de_idx.shape)}"
        )
    print(
        f"ready in     {ready:.1f} s (expression tensor {pert_data.cells.expression.nbytes / 2**20:.0f} MiB, "
        f"{torch.get_num_threads()} threads)"
    )


if __name__ == "__main__":
    main()
