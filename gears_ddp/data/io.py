"""Files on disk: atomic writes, and reads that fail with a message naming the file and
never run code.

Every file the library writes goes through ``atomic_path``: the content is written to a
temporary file in the destination folder, flushed to disk, and renamed over the destination
only when complete (the folder is flushed too), so neither an interrupted run nor a power
loss leaves a truncated or empty file that a later run would trust. Files that belong
together (a processed dataset and the GO files built for it) go through ``atomic_files``:
all are written to temporary files first, then renamed, so a failure leaves the old set
whole. Files are created with the permissions the umask allows, like any other file the
user writes.

Pickles (the published GEARS's config, split and GO files) are read with ``read_pickle``,
which admits only plain data: builtin containers and scalars, numpy arrays and scalars, and
torch tensors (rebuilt through ``torch.load(..., weights_only=True)``). A pickle naming any
other callable is refused before anything is called, so a downloaded file cannot run code.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import h5py
import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch

from gears_ddp.data import stop_signals

if TYPE_CHECKING:  # anndata is imported by the functions below that read or write h5ad files, not by every
    import anndata  # process that writes a file (a rank imports this module)

PROCESSED_FILE = "perturb_processed.h5ad"
# HDF5 chunk of the sparse arrays of an h5ad file written a block of cells at a time (1 MiB of
# float32): appended data in HDF5's default small chunks makes every later block read (and the
# writing) hold metadata in proportion to the file
CHUNK_VALUES = 2**18
TEMPORARY_TOKEN_BYTES = 6
# the name of a temporary file next to its destination: hidden, the destination's name, a random token
TEMPORARY_NAME = re.compile(rf"\..+\.[0-9a-f]{{{2 * TEMPORARY_TOKEN_BYTES}}}\.tmp")


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike) -> Iterator[Path]:
    """Yield a new temporary path next to ``dest``; when the block succeeds, flush what was
    written there to disk and rename it to ``dest``. The temporary file is removed however the
    block ends, a stop signal included (``stop_signals``)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = None
    try:
        with stop_signals.stops_held():  # made and recorded together, so the finally finds it
            tmp_path = _new_temporary(dest)
        yield tmp_path
        _flush_to_disk(tmp_path)
        os.replace(tmp_path, dest)
        _flush_to_disk(dest.parent)
    finally:
        if tmp_path is not None:
            with stop_signals.stops_held():
                tmp_path.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_files(dests) -> Iterator[list[Path]]:
    """``atomic_path`` for files that belong together (a processed dataset and the GO files
    it was processed with): yield a new temporary path next to each of ``dests``, in order;
    when the block succeeds, flush every one to disk, then rename them all to their
    destinations. Until every file is written nothing of the old ones changes, so a failure
    or a crash while they are written leaves the old files (and, after a failure, no folder
    made for the new ones); a writer that is atomic itself may be given these paths.

    A stop signal under ``stop_signals.stops_raised`` is an exception like any other here,
    but for the renames, which it cannot cut in two: one that comes while they run is raised
    once all are done."""
    dests = [Path(dest) for dest in dests]
    made = missing_folders(dest.parent for dest in dests)
    tmp_paths: list[Path] = []
    renamed = False
    try:
        with stop_signals.stops_held():  # made and recorded together, so the finally finds them
            for dest in dests:
                dest.parent.mkdir(parents=True, exist_ok=True)
            tmp_paths.extend(_new_temporary(dest) for dest in dests)
        yield list(tmp_paths)
        for tmp_path in tmp_paths:
            _flush_to_disk(tmp_path)
        with stop_signals.stops_held():
            for tmp_path, dest in zip(tmp_paths, dests):
                os.replace(tmp_path, dest)
            renamed = True
        for folder in dict.fromkeys(dest.parent for dest in dests):
            _flush_to_disk(folder)
    finally:
        with stop_signals.stops_held():
            for tmp_path in tmp_paths:
                tmp_path.unlink(missing_ok=True)
            if not renamed:
                remove_empty_folders(made)


def missing_folders(folders) -> list[Path]:
    """The folders that do not exist yet among ``folders`` and those above them, the deepest
    first: those that making ``folders`` makes, to be removed (``remove_empty_folders``) when
    what was to go in them is refused or fails, leaving the disk as it was."""
    missing = {folder for path in map(Path, folders) for folder in (path, *path.parents) if not folder.exists()}
    return sorted(missing, key=lambda folder: len(folder.parts), reverse=True)


def remove_empty_folders(folders: list[Path]) -> None:
    """Remove each of ``folders`` (``missing_folders``: the deepest first) that is empty or
    gone; one another process has written into meanwhile is kept."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


def _new_temporary(dest: Path) -> Path:
    """A new empty file next to ``dest`` (hidden, with a random name) to write it in."""
    tmp_path = dest.parent / f".{dest.name}.{secrets.token_hex(TEMPORARY_TOKEN_BYTES)}.tmp"
    os.close(os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # mode as the umask allows
    return tmp_path


def left_temporaries(folder: str | os.PathLike) -> list[Path]:
    """The temporary files of ``atomic_path`` and ``atomic_files`` in ``folder`` (not below
    it). A process killed outright (SIGKILL, the out-of-memory killer, a power loss) runs no
    ``finally`` and leaves them; one that holds the folder alone may remove them, as no
    writer of them is alive."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(path for path in folder.iterdir() if TEMPORARY_NAME.fullmatch(path.name) and path.is_file())


def file_in_the_way(folder: str | os.PathLike) -> Path | None:
    """The file that stands where ``folder`` or one of the folders above it would have to be
    (so nothing can be written in it), if any; None when the folder exists or can be made."""
    folder = Path(folder)
    for candidate in (folder, *folder.parents):
        if candidate.exists():
            return None if candidate.is_dir() else candidate
    return None


def make_folder(folder: str | os.PathLike, named: str, advice: str) -> Path:
    """Make ``folder`` (and the folders above it) if need be and return it; a file standing
    where it or a folder above it would go is refused, before any work, as ``named`` (how the
    user gave the folder, e.g. ``'save_path /runs/x'``) followed by what is in the way and
    ``advice``."""
    folder = Path(folder)
    blocker = file_in_the_way(folder)
    if blocker is not None:
        where = "is a file" if blocker == folder else f"cannot be made: {blocker} is a file"
        raise FileExistsError(f"{named} {where}, not a folder; {advice}")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _flush_to_disk(path: Path) -> None:
    """fsync a file, or a folder (which makes a rename in it durable; not possible on Windows)."""
    if path.is_dir() and os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on the file ``path`` (created, with its folder, if need be)
    while the block runs, so that processes which would build the same files at the same
    moment take turns. Where the filesystem offers no lock (or Windows), the block runs unlocked: every file
    is written atomically, so the cost is work done twice, never a damaged file."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a")
    except OSError:  # a folder this process may read but not write: nothing will be built here
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError:
            pass
        yield


def write_yaml(value, dest: str | os.PathLike) -> None:
    """``value`` (plain data) as YAML at ``dest``, atomically, keys in their order."""
    import yaml

    with atomic_path(dest) as tmp:
        Path(tmp).write_text(yaml.safe_dump(value, sort_keys=False), encoding="utf-8")


def write_pickle(obj: Any, dest: str | os.PathLike) -> None:
    """Pickle ``obj`` to ``dest`` atomically."""
    with atomic_path(dest) as tmp, open(tmp, "wb") as handle:
        pickle.dump(obj, handle)


class RefusedPickle(pickle.UnpicklingError):
    """A pickle asked for a callable that plain data never needs."""


def _tensor_storage(data: bytes):
    """What ``torch.storage._load_from_bytes`` does, without running code from the file."""
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


PLAIN_DATA = {
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("builtins", "slice"): slice,
    ("builtins", "bytearray"): bytearray,
    ("collections", "OrderedDict"): None,
    ("_codecs", "encode"): None,
    ("numpy", "ndarray"): None,
    ("numpy", "dtype"): None,
    ("numpy.core.multiarray", "_reconstruct"): None,
    ("numpy._core.multiarray", "_reconstruct"): None,
    ("numpy.core.multiarray", "scalar"): None,
    ("numpy._core.multiarray", "scalar"): None,
    ("torch._utils", "_rebuild_tensor_v2"): None,
    ("torch._utils", "_rebuild_tensor"): None,
    ("torch.storage", "_load_from_bytes"): _tensor_storage,
}


class _PlainDataUnpickler(pickle.Unpickler):
    """Unpickles plain data only (``PLAIN_DATA``); any other global is refused by name."""

    def find_class(self, module: str, name: str):
        module = {"__builtin__": "builtins"}.get(module, module)  # pickles of protocol 2 and older
        if (module, name) not in PLAIN_DATA:
            raise RefusedPickle(f"{module}.{name}")
        replacement = PLAIN_DATA[(module, name)]
        return replacement if replacement is not None else super().find_class(module, name)


def loads_plain_data(data: bytes) -> Any:
    """Unpickle bytes that may hold only plain data (see ``PLAIN_DATA``)."""
    return _PlainDataUnpickler(io.BytesIO(data)).load()


def read_pickle(path: str | os.PathLike, what: str) -> Any:
    """Unpickle ``path``, admitting plain data only; ``what`` says what the file should
    hold, for the error message."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file not found: {path}")
    try:
        return loads_plain_data(path.read_bytes())
    except RefusedPickle as err:
        raise ValueError(
            f"refused to read {what} from {path}: it asks to call {err}, which plain data never "
            "needs (a pickle can run code when it is read); only builtin containers, numbers, "
            "strings, numpy arrays and torch tensors are read"
        ) from None
    except Exception as err:  # any other unpickling failure means the file is unusable
        raise ValueError(
            f"cannot read {what} from {path}: {type(err).__name__}: {err}; "
            "the file is corrupt or not a pickle, replace it"
        ) from err


def read_torch_file(path: str | os.PathLike, what: str) -> Any:
    """``torch.load`` of ``path`` admitting plain data and tensors only (``weights_only``:
    nothing in the file runs), with errors that name the file and say what is wrong in one
    line: a file asking for code, or one that ``torch.save`` did not write (or damaged)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for damaged or refused files
        text = str(err)
        refused = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        if refused:
            raise ValueError(
                f"cannot read {what} {path}: refused, since it asks to call {refused.group(1)}, which "
                "saved weights and checkpoints never need (a pickle can run code when it is read)"
            ) from None
        reason = re.search(r"WeightsUnpickler error: (.+?)(?:\n\s*\n|$)", text, re.S)
        detail = (reason.group(1) if reason else text).strip().splitlines()[0] if text.strip() else ""
        raise ValueError(
            f"cannot read {what} {path}: {type(err).__name__}: {detail}; the file is damaged, or "
            "not one that torch.save wrote"
        ) from None


def write_h5ad(adata: anndata.AnnData, dest: str | os.PathLike) -> None:
    """Write an AnnData file atomically. A backed AnnData's file is copied and its ``obs``,
    ``var`` and ``uns`` replaced, so its expression is never read into memory."""
    from anndata.io import write_elem

    with atomic_path(dest) as tmp:
        if not adata.isbacked:
            adata.write_h5ad(tmp)
            return
        shutil.copyfile(adata.filename, tmp)
        with h5py.File(tmp, "r+") as handle:
            for key, value in (("obs", adata.obs), ("var", adata.var), ("uns", dict(adata.uns))):
                if key in handle:
                    del handle[key]
                write_elem(handle, key, value)


class CsrRows:
    """A CSR matrix in an h5ad file that grows a block of rows at a time (anndata's
    ``sparse_dataset(...).append``). Its row pointers are int32 while the values they count
    fit, as scipy makes them for a matrix in memory, and are widened to int64 when a block
    would pass that (anndata's ``append`` refuses to)."""

    INT32_VALUES = np.iinfo(np.int32).max  # the values int32 row pointers can count

    def __init__(self, group: h5py.Group, key: str, n_columns: int, dtype):
        from anndata.io import sparse_dataset, write_elem

        write_elem(group, key, sp.csr_matrix((0, n_columns), dtype=dtype), dataset_kwargs={"chunks": (CHUNK_VALUES,)})
        self.group = group[key]
        self.matrix = sparse_dataset(self.group)

    @property
    def n_rows(self) -> int:
        return int(self.group.attrs["shape"][0])

    def append(self, block: sp.csr_matrix) -> None:
        """Add the rows of ``block`` (CSR) below the others."""
        from anndata.io import sparse_dataset

        indptr = self.group["indptr"]
        if indptr.dtype == np.int32 and self.group["indices"].shape[0] + block.nnz >= self.INT32_VALUES:
            values = indptr[:].astype(np.int64)
            del self.group["indptr"]
            self.group.create_dataset("indptr", data=values, maxshape=(None,), chunks=(CHUNK_VALUES,))
            self.matrix = sparse_dataset(self.group)
        self.matrix.append(block)


@contextlib.contextmanager
def h5ad_by_blocks(dest: str | os.PathLike, annotations: anndata.AnnData, dtype) -> Iterator[CsrRows]:
    """Write an h5ad file atomically whose expression arrives a block of cells at a time, so
    that it never is in memory whole: ``annotations`` (an AnnData without ``X``) is written
    first, as ``AnnData.write_h5ad`` writes it; the caller appends CSR blocks of cells to the
    yielded ``X`` (values of ``dtype``); when the block ends, ``X`` must have every cell, and
    the ``uns`` that ``annotations`` holds then replaces the one written at the start (the
    caller may compute it from the blocks)."""
    from anndata.io import write_elem

    with atomic_path(dest) as tmp:
        annotations.write_h5ad(tmp)
        with h5py.File(tmp, "r+") as handle:
            expression = CsrRows(handle, "X", annotations.n_vars, dtype)
            yield expression
            if expression.n_rows != annotations.n_obs:
                raise RuntimeError(
                    f"{expression.n_rows} cells were written to {dest}, which annotates {annotations.n_obs}"
                )
            del handle["uns"]
            write_elem(handle, "uns", dict(annotations.uns))


@dataclass
class H5adParts:
    """An h5ad file's annotations with its expression left on disk: ``obs`` (some columns,
    with a positional index: no per-cell name strings), ``var``, ``uns``, and ``X``, which
    is read a block of cells at a time (``grouped.row_blocks``) while the file is open."""

    obs: pd.DataFrame
    var: pd.DataFrame
    uns: dict
    X: Any
    n_obs: int

    @property
    def var_names(self) -> pd.Index:
        return self.var.index


@contextlib.contextmanager
def h5ad_parts(path: str | os.PathLike, obs_columns) -> Iterator[H5adParts]:
    """Open an h5ad file for ``H5adParts`` (the ``obs_columns`` it has), with clear errors
    for a missing, truncated or corrupt file."""
    from anndata.io import read_elem, sparse_dataset

    path = _existing_file(path)
    try:
        handle = h5py.File(path, "r")
        obs_group = handle["obs"]
        obs = pd.DataFrame({c: read_elem(obs_group[c]) for c in obs_columns if c in obs_group})
        matrix = handle["X"]
        parts = H5adParts(
            obs,
            read_elem(handle["var"]),
            read_elem(handle["uns"]) if "uns" in handle else {},
            sparse_dataset(matrix) if isinstance(matrix, h5py.Group) else matrix,
            int(matrix.attrs["shape"][0]) if isinstance(matrix, h5py.Group) else matrix.shape[0],
        )
    except Exception as err:  # h5py/anndata raise many types for damaged files
        raise unreadable_h5ad(path, err, "download it again or re-run PertData.new_data_process") from err
    try:
        yield parts
    finally:
        handle.close()


def read_obs(path: str | os.PathLike) -> pd.DataFrame:
    """The whole ``obs`` table of an h5ad file (cell names included)."""
    from anndata.io import read_elem

    with h5py.File(path, "r") as handle:
        return read_elem(handle["obs"])


def read_h5ad(path: str | os.PathLike, backed: bool = False) -> anndata.AnnData:
    """Read an h5ad file (``backed``: all but the expression, which stays on disk), turning
    a missing, truncated or corrupt file, or one that is no h5ad at all, into a clear error."""
    import anndata

    path = _existing_file(path)
    try:
        return anndata.read_h5ad(path, backed="r" if backed else None)
    except Exception as err:  # h5py/anndata raise many types for damaged files
        raise unreadable_h5ad(path, err, "write it again from its source") from err


def _existing_file(path: str | os.PathLike) -> Path:
    """``path``, which must be a file (not missing, not a folder)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not an h5ad file")
    if not path.is_file():
        raise FileNotFoundError(f"no {path.name} at {path}")
    return path


def unreadable_h5ad(path: Path, err: Exception, advice: str) -> ValueError:
    """The error for an h5ad file that cannot be read: one that is no HDF5 file at all (a
    text file, a web page saved in its place), or a damaged one, with ``advice``."""
    if not h5py.is_hdf5(path):
        return ValueError(
            f"{path} is not an h5ad file: h5ad files are HDF5, and it does not start with HDF5's "
            "signature (a text file, a web page, or another format under this name?)"
        )
    return ValueError(f"cannot read {path}: {type(err).__name__}: {err}; the file is truncated or corrupt: {advice}")
