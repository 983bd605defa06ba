"""A dataset's expression matrix as one file that every process maps read-only.

``perturb_processed.h5ad`` stays the dataset's source of truth; beside it,
``perturb_processed.expression.<dtype>.npy`` holds the expression of the cells the dataset
uses (the cells whose perturbations the vocabulary covers), dense, float32 or float16, and
``perturb_processed.expression.<dtype>.json`` records what it was built from: the h5ad's
size and modification time, which cells, the dtype and the shape. It is built the first time a
dataset is processed or loaded, a block of cells at a time, and again whenever the h5ad or
the choice of cells changes.

Why a ``.npy`` file mapped with ``numpy.load(mmap_mode='r')``: a read-only shared mapping
puts the values in the operating system's page cache once per machine, so every process
that maps the file (the workers ``train_multi_gpu`` spawns, torchrun or srun ranks, ranks on
other machines over a shared filesystem, each with its own cache) reads the same pages and
holds no private copy; a batch is a gather of rows, which the cache serves at memory speed
once warm; the file can be larger than memory; and the format is numpy's own (a short
header, then the values in row order), which any tool reads. The alternatives were weighed:
anndata's backed mode and zarr read through their own chunk caches and decompression in
every process (private copies, and row gathers that cost a read call each); ``torch.from_file``
maps the file writable; shared memory (``/dev/shm``) is one copy per machine only for
processes that one parent starts, and must fit in memory.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import torch

from gears_ddp._logging import get_logger
from gears_ddp.data import io
from gears_ddp.data.grouped import row_blocks
from gears_ddp.data.processing import ExpressionCheck

logger = get_logger(__name__)

DTYPES = {"float32": np.float32, "float16": np.float16}
FORMAT_VERSION = 1


def map_file(folder, dtype: str = "float32") -> Path:
    return Path(folder) / f"perturb_processed.expression.{dtype}.npy"


def record_file(folder, dtype: str = "float32") -> Path:
    return Path(folder) / f"perturb_processed.expression.{dtype}.json"


def wanted_record(h5ad: Path, keep: np.ndarray, n_genes: int, dtype: str) -> dict:
    """What a current map of ``h5ad``'s cells ``keep`` must have been built from."""
    status = h5ad.stat()
    return {"format": FORMAT_VERSION, "source": {"file": h5ad.name, "size": status.st_size,
                                                 "mtime_ns": status.st_mtime_ns},
            "cells": hashlib.blake2b(np.packbits(keep).tobytes(), digest_size=16).hexdigest(),
            "dtype": dtype, "shape": [int(np.count_nonzero(keep)), int(n_genes)]}


def mapped_expression(folder, matrix, keep: np.ndarray, dtype: str = "float32") -> tuple[np.ndarray, Path]:
    """The rows ``keep`` of ``matrix`` (the expression of ``folder/perturb_processed.h5ad``:
    in memory, or its backed ``X``) as a read-only map, built first if it is missing or
    stale; returns the mapped array and the file's path.

    Processes that build it at the same time (torchrun ranks) take turns on a lock file, so
    one builds and the others map the result.
    """
    if dtype not in DTYPES:
        raise ValueError(f"expression dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    folder = Path(folder)
    path, record = map_file(folder, dtype), record_file(folder, dtype)
    wanted = wanted_record(folder / io.PROCESSED_FILE, keep, matrix.shape[1], dtype)
    if not _current(path, record, wanted):
        try:
            with _lock(folder / f".{path.name}.lock"):
                if not _current(path, record, wanted):
                    _write_map(path, matrix, keep, DTYPES[dtype], folder / io.PROCESSED_FILE)
                    with io.atomic_path(record) as tmp:
                        tmp.write_text(json.dumps(wanted, indent=1))
        except PermissionError as err:
            raise PermissionError(f"cannot write the expression map of {folder} ({err}); make the folder writable "
                                  "once, or keep the expression in memory (PertData(..., "
                                  "expression_storage='memory'))") from None
    return open_map(path), path


def _current(path: Path, record: Path, wanted: dict) -> bool:
    return path.is_file() and _read_record(record) == wanted


def open_map(path) -> np.ndarray:
    """A built map, read-only."""
    return np.load(path, mmap_mode="r")


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor over ``array`` without a copy (a read-only map too: nothing writes expression)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def _write_map(path: Path, matrix, keep: np.ndarray, dtype, source: Path) -> None:
    """Write the rows ``keep`` of ``matrix`` block by block, checking the values on the way."""
    check = ExpressionCheck()
    shape = (int(np.count_nonzero(keep)), matrix.shape[1])
    logger.info("writing the expression map %s (%d cells x %d genes, %s)", path, *shape, np.dtype(dtype).name)
    with io.atomic_path(path) as tmp:
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
        row = 0
        for start, block in row_blocks(matrix, block_elements=2**22):
            check.add(block)
            block = block[keep[start:start + len(block)]]
            out[row:row + len(block)] = block
            row += len(block)
        out.flush()
        del out
        check.finish(str(source))


def _read_record(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _lock(path: Path):
    """An exclusive lock on ``path`` between processes, where the filesystem offers one."""
    try:
        import fcntl
    except ImportError:  # Windows: processes may build the map twice; each write is atomic
        yield
        return
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:  # a filesystem without locks: as above
            pass
        yield
