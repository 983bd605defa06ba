"""gears_ddp: train GEARS fast on one CPU, one GPU, many GPUs or many nodes."""

from gears_ddp._logging import enable_console_logging
from gears_ddp._version import __version__
from gears_ddp.data import PertData
from gears_ddp.distributed.replicates import train_replicates
from gears_ddp.gears import GEARS
from gears_ddp.runtime.threads import single_threaded_forks
from gears_ddp.sweeps.train_sweep import train_sweep
from gears_ddp.train_distributed import train_multi_gpu

single_threaded_forks()  # a forked child (a Pool of GI_predict calls) would wait for torch's threads for ever

__all__ = [
    "GEARS",
    "PertData",
    "enable_console_logging",
    "train_multi_gpu",
    "train_replicates",
    "train_sweep",
    "__version__",
]
