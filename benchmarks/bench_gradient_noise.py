"""Which parameters' gradients are rounding noise: each parameter's largest gradient in
float64 beside the error of the float32 gradient, on the same padded batch.

    python benchmarks/bench_gradient_noise.py [--hidden 64] [--batch-size 32]
                                              [--genes 1000 ...] [--data-path ./data/bench_gradient_noise]
                                              [--record]

Why it matters: two runs whose sums add in different orders (a GPU's atomic additions, a
replayed CUDA graph against eager steps) differ by rounding in every gradient. Where a
gradient is mathematically zero (a Linear's bias followed by a BatchNorm, which subtracts
any constant per feature), its float32 value is that rounding alone, and Adam divides it by
its own running size, so each step moves the parameter by about the learning rate, in the
direction the rounding gives. No tolerance between two such runs holds for these parameters;
they do not change what the network computes. ``tests/test_cuda_graphs.py`` compares a
replayed and an eager run on a GPU with that in mind.

The data are the built-in synthetic dataset (``write_synthetic_dataset``, seed 0);
``torch.manual_seed(0)``, ``model_initialize(hidden_size)``, the plain decoder (the fused one
computes the same function), and the first training batch with its perturbation sets padded
as for a CUDA graph. The float64 gradient is the same network cast to float64.
"""

import argparse
import copy
import dataclasses

import torch
from harness.models import new_model
from harness.record import add_record_argument, recorded
from harness.synthetic import add_size_arguments, load_synthetic
from harness.tables import print_table

from gears_ddp.training.engine import batch_loss


def gradients(network, batch, context) -> dict[str, torch.Tensor]:
    network.zero_grad(set_to_none=True)
    batch_loss(network, batch, context, False).backward()
    return {name: p.grad.double() for name, p in network.named_parameters() if p.grad is not None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    add_size_arguments(parser)
    parser.add_argument("--data-path", default="./data/bench_gradient_noise")
    add_record_argument(parser)
    args = parser.parse_args()
    pert_data = load_synthetic(args.data_path, args)
    pert_data.get_dataloader(batch_size=args.batch_size, test_batch_size=256)
    gears = new_model(pert_data, hidden_size=args.hidden)
    loader = pert_data.dataloader["train_loader"]
    loader.set_epoch(0)
    batch = next(iter(loader.batches(0, loader.max_sets_per_batch())))
    network = gears.model.train()
    network.fused_decoder = False
    context = gears.loss_context()
    single = gradients(copy.deepcopy(network), batch, context)
    context64 = dataclasses.replace(context, ctrl_mean=context.ctrl_mean.double())
    batch64 = dataclasses.replace(batch, x=batch.x.double(), y=batch.y.double())
    double = gradients(copy.deepcopy(network).double(), batch64, context64)
    rows = sorted(
        ((float(double[name].abs().max()), float((single[name] - double[name]).abs().max()), name) for name in double)
    )
    largest = rows[-1][0]
    with recorded(args.record):
        print(
            f"data: {pert_data.adata.n_obs} cells x {pert_data.adata.n_vars} genes; hidden {args.hidden}; one "
            f"padded batch of {args.batch_size} ({batch.sets.n_sets} sets)\n"
        )
        print_table(
            ["parameter", "largest |gradient|, float64", "float32's error", "noise"],
            [[name, f"{value:.3e}", f"{error:.3e}", "yes" if error >= value else ""] for value, error, name in rows],
        )
        noise = [name for value, error, name in rows if error >= value]
        print(
            f"\n{len(noise)} of {len(rows)} parameters have a float32 gradient that is rounding noise (its error at "
            f"least its float64 value); the largest float64 gradient of any parameter is {largest:.3e}."
        )


if __name__ == "__main__":
    main()
