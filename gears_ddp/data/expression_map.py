"""A dataset's expression matrix as one file that every process maps read-only.

``perturb_processed.h5ad`` stays the dataset's source of truth; beside it,
``perturb_processed.expression.<dtype>.npy`` holds the expression of the cells the dataset
uses (the cells whose perturbations the vocabulary covers), dense, float32 or float16, and
``perturb_processed.expression.<dtype>.json`` records what it was built from (the h5ad's
size and modification time, which cells, the dtype and the shape) and a digest of the values
it holds. It is built the first time a dataset is processed or loaded, a block of cells at a
time, and again whenever the h5ad or the choice of cells changes (size and time are the cheap
test of a stale map; a copied file gets a new time, so its map is built once more).

The digest identifies the data by content: two copies of a dataset, in any folder and with
any file times, give the same digest, and ranks compare it before training
(``launching.rank_training.check_same_data``) without reading the values again. It is computed
while the map is written, over the bytes of the values in the storage dtype in cell order,
which is also what ``values_digest`` computes from expression held in memory.

A ``.npy`` file mapped read-only (``numpy.load(mmap_mode='r')``) puts the values in the
operating system's page cache once per machine, however many processes map it, and can be
larger than memory; docs/million-cells.md says why this format and not the alternatives.
"""

from __future__ import annotations

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
FORMAT_VERSION = 2
DIGEST_KEY = "values_blake2b"  # the record's digest of the values


def map_file(folder, dtype: str = "float32") -> Path:
    return Path(folder) / f"perturb_processed.expression.{dtype}.npy"


def record_file(folder, dtype: str = "float32") -> Path:
    return Path(folder) / f"perturb_processed.expression.{dtype}.json"


def wanted_record(h5ad: Path, keep: np.ndarray, n_genes: int, dtype: str) -> dict:
    """What a current map of ``h5ad``'s cells ``keep`` must have been built from."""
    status = h5ad.stat()
    return {
        "format": FORMAT_VERSION,
        "source": {"file": h5ad.name, "size": status.st_size, "mtime_ns": status.st_mtime_ns},
        "cells": hashlib.blake2b(np.packbits(keep).tobytes(), digest_size=16).hexdigest(),
        "dtype": dtype,
        "shape": [int(np.count_nonzero(keep)), int(n_genes)],
    }


def values_digest(values) -> str:
    """The digest of an array's values: blake2b of its bytes in row order (dtype as stored)."""
    digest = hashlib.blake2b(digest_size=16)
    for _, block in row_blocks(values, block_elements=2**22):
        digest.update(np.ascontiguousarray(block).data)
    return digest.hexdigest()


def mapped_expression(folder, matrix, keep: np.ndarray, dtype: str = "float32") -> tuple[np.ndarray, Path, str]:
    """The rows ``keep`` of ``matrix`` (the expression of ``folder/perturb_processed.h5ad``:
    in memory, or its backed ``X``) as a read-only map, built first if it is missing or
    stale; returns the mapped array, the file's path and the digest of its values
    (``values_digest``, read from the record).

    Processes that build it at the same time (torchrun ranks) take turns on a lock file, so
    one builds and the others map the result.
    """
    if dtype not in DTYPES:
        raise ValueError(f"expression dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    folder = Path(folder)
    path, record = map_file(folder, dtype), record_file(folder, dtype)
    wanted = wanted_record(folder / io.PROCESSED_FILE, keep, matrix.shape[1], dtype)
    current = _current(path, record, wanted)
    if current is None:
        try:
            with io.file_lock(folder / f".{path.name}.lock"):
                current = _current(path, record, wanted)
                if current is None:
                    digest = _write_map(path, matrix, keep, DTYPES[dtype], folder / io.PROCESSED_FILE)
                    with io.atomic_path(record) as tmp:
                        tmp.write_text(json.dumps({**wanted, DIGEST_KEY: digest}, indent=1))
                    current = open_map(path), digest
        except PermissionError as err:
            raise PermissionError(
                f"cannot write the expression map of {folder} ({err}); make the folder writable "
                "once, or keep the expression in memory (PertData(..., "
                "expression_storage='memory'))"
            ) from None
    values, digest = current
    return values, path, digest


def _current(path: Path, record: Path, wanted: dict) -> tuple[np.ndarray, str] | None:
    """The map at ``path`` and the digest of its values, if its record says it was built from
    what ``wanted`` describes and the file opens as an array of that shape and dtype (a
    damaged file is built again)."""
    found = _read_record(record) if path.is_file() else None
    if (
        found is None
        or not isinstance(found.get(DIGEST_KEY), str)
        or {key: value for key, value in found.items() if key != DIGEST_KEY} != wanted
    ):
        return None
    try:
        values = open_map(path)
    except (OSError, ValueError):  # not a .npy file (numpy refuses pickled contents with a ValueError)
        return None
    if list(values.shape) != wanted["shape"] or values.dtype != DTYPES[wanted["dtype"]]:
        return None
    return values, found[DIGEST_KEY]


def open_map(path) -> np.ndarray:
    """A built map, read-only."""
    return np.load(path, mmap_mode="r")


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor over ``array`` without a copy (a read-only map too: nothing writes expression)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def _write_map(path: Path, matrix, keep: np.ndarray, dtype, source: Path) -> str:
    """Write the rows ``keep`` of ``matrix`` block by block, checking the values on the way;
    returns their ``values_digest``."""
    check, digest = ExpressionCheck(), hashlib.blake2b(digest_size=16)
    shape = (int(np.count_nonzero(keep)), matrix.shape[1])
    logger.info("writing the expression map %s (%d cells x %d genes, %s)", path, *shape, np.dtype(dtype).name)
    with io.atomic_path(path) as tmp, open(tmp, "wb") as out:
        # written, not mapped: pages written through a map count in the writer's resident memory
        np.lib.format.write_array_header_1_0(
            out, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
        )
        for start, block in row_blocks(matrix, block_elements=2**22):
            check.add(block)
            block = np.ascontiguousarray(block[keep[start : start + len(block)]], dtype=dtype)
            digest.update(block.data)
            out.write(block.data)
        out.flush()
        check.finish(str(source))
    return digest.hexdigest()


def _read_record(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
