"""Data layer: PertData, on-disk formats, downloads, splits, graphs and batches."""
from gears_ddp.data.cells import CellTable, PertBatch
from gears_ddp.data.graphs import GeneGraph
from gears_ddp.data.pertdata import PertData

__all__ = ["CellTable", "GeneGraph", "PertBatch", "PertData"]
