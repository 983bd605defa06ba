"""gears_ddp: train GEARS fast on one CPU, one GPU, many GPUs or many nodes."""
from gears_ddp._logging import enable_console_logging
from gears_ddp.data import PertData
from gears_ddp.gears import GEARS
from gears_ddp.train_distributed import train_multi_gpu

__version__ = "0.1.0"
__all__ = ["GEARS", "PertData", "enable_console_logging", "train_multi_gpu", "__version__"]
