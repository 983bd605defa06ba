"""Files on disk: atomic writes and reads that fail with a message naming the file.

Every file the library writes goes through ``atomic_path``: the content is written to a
temporary file in the destination folder and renamed over the destination only when
complete, so an interrupted run never leaves a truncated file that a later run would
trust.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any, Iterator

import anndata

PROCESSED_FILE = "perturb_processed.h5ad"


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``dest``; rename it to ``dest`` if the block succeeds."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, dest)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_pickle(obj: Any, dest: str | os.PathLike) -> None:
    """Pickle ``obj`` to ``dest`` atomically."""
    with atomic_path(dest) as tmp, open(tmp, "wb") as handle:
        pickle.dump(obj, handle)


def read_pickle(path: str | os.PathLike, what: str) -> Any:
    """Unpickle ``path``; ``what`` says what the file should hold, for the error message."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file not found: {path}")
    try:
        with open(path, "rb") as handle:
            return pickle.load(handle)
    except Exception as err:  # any unpickling failure means the file is unusable
        raise ValueError(f"cannot read {what} from {path}: {type(err).__name__}: {err}; "
                         "the file is corrupt or not a pickle, replace it") from err


def write_h5ad(adata: anndata.AnnData, dest: str | os.PathLike) -> None:
    """Write an AnnData file atomically."""
    with atomic_path(dest) as tmp:
        adata.write_h5ad(tmp)


def read_h5ad(path: str | os.PathLike) -> anndata.AnnData:
    """Read an h5ad file, turning a missing, truncated or corrupt file into a clear error."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {path.name} at {path}")
    try:
        return anndata.read_h5ad(path)
    except Exception as err:  # h5py/anndata raise many types for damaged files
        raise ValueError(f"cannot read {path}: {type(err).__name__}: {err}; the file is truncated "
                         "or corrupt: download it again or re-run PertData.new_data_process") from err
