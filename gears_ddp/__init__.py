"""gears_ddp: train GEARS fast on one CPU, one GPU, many GPUs or many nodes."""
from gears_ddp._logging import enable_console_logging
from gears_ddp.data import PertData

__version__ = "0.1.0"
__all__ = ["PertData", "enable_console_logging", "__version__"]
