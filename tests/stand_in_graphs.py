"""Stand-ins for ``training.cuda_graphs.CudaGraph`` on a CPU, where no CUDA graph exists: what
surrounds a graph (warm-up, static batches, the learning rate read from a tensor, the
all-reduce between two graphs) is checked by graphs that replay by running the captured step
again, and collectives record whether they ran inside one."""

import torch
import torch.distributed as dist

INSIDE_GRAPH = [False]  # whether a ReplayingGraph of this process is replaying now
REPLAYS = [0]  # the replays of every ReplayingGraph of this process
COLLECTIVES: list[tuple[str, bool]] = []  # (name, inside a graph) of each watched collective


class ReplayingGraph:
    """Capture records the step without running it, as a capture does; a replay runs it again
    on the same static tensors, with ``INSIDE_GRAPH`` set meanwhile."""

    def __init__(self):
        self.step, self.shares_pool_with, self.output, self.replays = None, None, torch.zeros(()), 0

    def capture(self, step, shares_pool_with=None):
        self.step, self.shares_pool_with = step, shares_pool_with
        return self.output

    def replay(self):
        self.replays += 1
        REPLAYS[0] += 1
        INSIDE_GRAPH[0] = True
        try:
            output = self.step()
        finally:
            INSIDE_GRAPH[0] = False
        if output is not None:
            self.output.copy_(output)


class FailingGraph(ReplayingGraph):
    """A graph whose capture fails: the steps run eagerly from then on, on the same padded batches."""

    def capture(self, step, shares_pool_with=None):
        raise RuntimeError("operation not permitted when stream is capturing")


WATCHED = ("all_reduce", "broadcast", "all_gather", "all_gather_object", "reduce_scatter", "barrier")


def watch_collectives() -> dict:
    """Replace ``torch.distributed``'s collectives with ones that append to ``COLLECTIVES``
    first; returns the originals (``restore_collectives`` puts them back)."""
    originals = {}
    for name in WATCHED:
        original = getattr(dist, name)

        def watched(*args, _original=original, _name=name, **kwargs):
            COLLECTIVES.append((_name, INSIDE_GRAPH[0]))
            return _original(*args, **kwargs)

        originals[name] = original
        setattr(dist, name, watched)
    return originals


def restore_collectives(originals: dict) -> None:
    for name, original in originals.items():
        setattr(dist, name, original)
