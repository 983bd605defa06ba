"""Data layer: PertData, on-disk formats, downloads, splits, gene graphs and batches.

May import: nothing of gears_ddp but ``_logging``. Every other layer reads data through it.
"""

from gears_ddp.data.cells import CellTable, PertBatch
from gears_ddp.data.graphs import GeneGraph
from gears_ddp.data.pertdata import PertData

__all__ = ["CellTable", "GeneGraph", "PertBatch", "PertData"]
