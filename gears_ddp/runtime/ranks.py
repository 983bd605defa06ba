"""The ranks of a training run, as the recipe sees them.

Training is written once, for any number of processes. Everything it needs from the other
processes goes through one object: the world size and this process's rank, whether this
process is the main one (which logs and writes files), a sum over ranks, the sum of
evaluation states, the main rank's initial weights given to every rank, the average of the
gradients of an optimiser step (``gradient_average``: one flat all-reduce), the broadcast of
BatchNorm running statistics, a barrier, a gather of small objects, and the largest of an
integer over ranks (a stop request).

``SingleProcess`` is one process: every operation is the identity. ``ProcessGroupRanks``
is the member of a ``torch.distributed`` process group that the current process already
joined (``launching.process_group.setup_ddp``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from gears_ddp.runtime.gradient_average import NO_AVERAGE, FlatGradientAverage, GradientAverage


class SingleProcess:
    """One process, alone: the identity for every cross-rank operation."""

    world_size = 1
    rank = 0

    @property
    def is_main(self) -> bool:
        """Whether this process logs, writes files and reports (rank 0)."""
        return self.rank == 0

    def share_parameters(self, network: nn.Module) -> None:
        """Give every rank the main rank's parameters (before training starts)."""

    def gradient_average(self, network: nn.Module) -> GradientAverage:
        """What makes each rank's gradients of ``network`` the mean over ranks, once per
        optimiser step (``gradient_average.GradientAverage``)."""
        return NO_AVERAGE

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over ranks (in place; returned)."""
        return tensor

    def merge_evaluation(self, state: dict) -> dict:
        """An evaluation accumulator's ``state()`` (named tensors of sums) summed over ranks,
        in place."""
        return state

    def broadcast_buffers(self, network: nn.Module) -> None:
        """Give every rank the main rank's checkpointed buffers (BatchNorm running statistics)."""

    def barrier(self) -> None:
        """Wait until every rank arrives here."""

    def gather(self, value) -> list:
        """Every rank's ``value`` (a small picklable object), in rank order."""
        return [value]

    def largest(self, value: int) -> int:
        """The largest of every rank's ``value``, on the host (no device synchronisation)."""
        return value


SINGLE_PROCESS = SingleProcess()


class ProcessGroupRanks(SingleProcess):
    """This process's place in the default ``torch.distributed`` process group."""

    def __init__(self):
        if not dist.is_initialized():
            raise RuntimeError("ProcessGroupRanks needs a process group: call setup_ddp(...) first")
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        # host-side agreement goes through gloo, so that it never waits for a GPU stream
        self._host_group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")

    def share_parameters(self, network: nn.Module) -> None:
        """Every parameter from the main rank, as ``DistributedDataParallel`` does when it is
        built. Buffers are not sent: the running statistics are broadcast before each
        evaluation instead (``broadcast_buffers``)."""
        with torch.no_grad():
            for parameter in network.parameters():
                dist.broadcast(parameter, src=0)

    def gradient_average(self, network: nn.Module) -> GradientAverage:
        """One flat all-reduce of the gradients per optimiser step; nothing with one rank."""
        if self.world_size == 1:
            return NO_AVERAGE
        return FlatGradientAverage(network.parameters(), self.world_size, dist.all_reduce)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if dist.get_backend() == "nccl" and tensor.device.type != "cuda":
            on_device = tensor.to(torch.device("cuda", torch.cuda.current_device()))
            dist.all_reduce(on_device)
            return tensor.copy_(on_device)
        dist.all_reduce(tensor)
        return tensor

    def merge_evaluation(self, state: dict) -> dict:
        return {name: self.sum(tensor) for name, tensor in state.items()}

    def broadcast_buffers(self, network: nn.Module) -> None:
        checkpointed = network.state_dict(keep_vars=True)
        for name, buffer in network.named_buffers():
            if name in checkpointed:
                dist.broadcast(buffer, src=0)

    def barrier(self) -> None:
        dist.barrier()

    def gather(self, value) -> list:
        values = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def largest(self, value: int) -> int:
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self._host_group)
        return int(tensor)
