"""A dataset's processed folder: found, opened, and written from a screen.

A dataset is a folder holding ``perturb_processed.h5ad`` (the published GEARS format): one
of the paper's, downloaded by name, or a local one. ``dataset_folder`` finds it and
``opened_dataset`` opens its file with the expression left on disk. ``processed_dataset``
runs the processing of ``PertData.new_data_process`` once the screen has passed its checks
(``screen_check``): the expression read a block of cells at a time (normalised from raw
counts, or taken as it is), checked, summed for the DE genes and written, with the GO files
of an annotation when one is given, the split and graph caches of earlier data removed,
and all renamed into place together or none.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from gears_ddp._logging import get_logger
from gears_ddp.data import cache_settings, download, go_files, io, normalization, processing
from gears_ddp.data.conditions import coded_conditions, genes_of_conditions

if TYPE_CHECKING:  # the annotations' type only: every process that loads a dataset imports this module
    import anndata

logger = get_logger(__name__)

PROCESSED_OBS_COLUMNS = ("condition", "cell_type", "condition_name")  # the obs columns a loaded dataset reads


def dataset_folder(data_name: str | None, data_path, root, archive=None) -> Path:
    """The folder of the dataset to load: one of the paper's by ``data_name`` (downloaded
    into ``root`` if absent, or extracted from the local ``archive``, which makes any name
    valid), else the existing folder ``data_path``; a clear error when it is neither."""
    if data_name is not None and (data_name in download.DATASET_FILE_IDS or archive is not None):
        return download.ensure_dataset(data_name, root, archive)
    if data_path is not None and Path(data_path).is_dir():
        return Path(data_path)
    raise ValueError(
        f"nothing to load: data_name must be one of {sorted(download.DATASET_FILE_IDS)} "
        f"(got {data_name!r}) or come with an archive, or data_path must be an existing "
        f"folder (got {data_path!r})"
    )


@contextlib.contextmanager
def opened_dataset(folder: Path, check_values: bool) -> Iterator[io.H5adParts]:
    """The parts of ``folder``'s processed file, its columns and conditions checked, and,
    with ``check_values``, its expression (read whole once; a new expression map checks the
    values it copies). ``X`` stays on disk, read a block at a time if need be."""
    h5ad = folder / io.PROCESSED_FILE
    with io.h5ad_parts(h5ad, PROCESSED_OBS_COLUMNS) as parts:
        processing.check_columns(parts, str(h5ad), obs_columns=PROCESSED_OBS_COLUMNS)
        coded_conditions(parts.obs["condition"], f"{h5ad} obs['condition']")
        if check_values:
            processing.check_expression(parts.X, str(h5ad))
        yield parts


def folder_to_process(data_path, dataset_name: str, overwrite: bool) -> Path:
    """The folder ``new_data_process`` writes dataset ``dataset_name`` into; an existing
    processed file there is refused unless ``overwrite``, and so is a name that is no plain
    folder name (empty, ``.``, ``..`` or holding a path separator), which would write
    elsewhere than in ``data_path``."""
    if dataset_name in ("", ".", "..") or any(separator in dataset_name for separator in ("/", "\\")):
        raise ValueError(
            f"dataset name {dataset_name!r} is not a plain folder name: the dataset is written to the "
            f"folder of that name in the data folder {data_path}, so give a name without path "
            "separators, not '.' or '..' (gears-ddp process --name my_screen)"
        )
    folder = Path(data_path) / dataset_name.lower()
    target = folder / io.PROCESSED_FILE
    if target.exists() and not overwrite:
        raise FileExistsError(
            f"{target} already exists; load it with PertData.load(data_path="
            f"'{folder}') (gears-ddp train --set pert_data_path={data_path} --set dataset_name="
            f"{folder.name}), or replace it (overwrite=True; gears-ddp process --overwrite)"
        )
    return folder


@contextlib.contextmanager
def processed_dataset(
    adata: anndata.AnnData,
    folder: Path,
    *,
    normalize: bool,
    n_top_genes: int | None,
    de: bool,
    go_annotation: dict | None,
    data_path,
    cells_to_keep: Callable[[anndata.AnnData], np.ndarray],
    source: str,
) -> Iterator[tuple[object, anndata.AnnData, np.ndarray]]:
    """Process the checked screen ``adata`` (GEARS's columns added) into ``folder``, and
    yield what to load: the processed data (``adata`` itself, or the parts of the file
    written from its normalised counts), its annotations, and which cells to keep
    (``cells_to_keep`` of the screen, asked once its cheap checks have passed and before
    anything is written).

    Without ``normalize``, ``adata`` gains the processed columns in place; with it, ``adata``
    keeps its counts, and its cells are normalised a block at a time as the processed file
    is written. Either way the expression is read a block of cells at a time, from memory or
    from the file of a backed ``adata`` (``anndata.read_h5ad(path, backed='r')``), so a screen
    larger than memory can be processed. Every check that can refuse the screen runs before a
    file is written, but those of raw counts (with ``normalize``), which are read once, as
    they are written; the files written are renamed into place together once all are
    complete (``io.atomic_files``), so a refused screen, or one interrupted, leaves the disk
    as it was, but for the split and graph caches of earlier data in the folder, which are
    removed once the new files are complete, just before the renames.

    ``normalize``: ``adata`` holds raw counts, normalised a block at a time as the file is
    written, and checked then (``n_top_genes``: keep that many highly variable genes and
    the perturbed ones); else ``adata`` gains the processed columns in place and its
    expression is read, so checked, before anything is written. ``de``: compute the DE
    genes. ``go_annotation``: the GO files of ``data_path`` are built from it and written
    with the processed file, all or none."""
    target = folder / io.PROCESSED_FILE
    if normalize:
        perturbed = genes_of_conditions(adata.obs["condition"].astype(str).unique())
        annotations, genes = normalization.normalized_annotations(adata, n_top_genes, perturbed, source)
        keep = cells_to_keep(adata)
        with _files_of_dataset(target, data_path, go_annotation) as processed_path:
            write_normalized_dataset(
                annotations,
                processed_path,
                normalization.normalized_blocks(adata.X, genes, source, check_counts=genes is None),
                normalization.normalized_dtype(adata.X),
                de,
                source,
                processing.unranked_conditions(annotations.obs, keep),
            )
            removed = remove_stale_caches(folder)
        _log_written(folder, annotations, removed)
        with io.h5ad_parts(target, PROCESSED_OBS_COLUMNS) as parts:
            yield parts, annotations, keep
    else:
        keep = cells_to_keep(adata)
        reading = read_processed_expression(adata, de, source, processing.unranked_conditions(adata.obs, keep))
        with _files_of_dataset(target, data_path, go_annotation) as processed_path:
            write_processed_dataset(adata, processed_path, reading)
            removed = remove_stale_caches(folder)
        _log_written(folder, adata, removed)
        yield adata, adata, keep


@contextlib.contextmanager
def _files_of_dataset(target: Path, data_path, go_annotation: dict | None) -> Iterator[Path]:
    """Yield the path to write the processed file ``target`` at; with ``go_annotation``,
    the GO files of ``data_path`` built from it are written first, and all are renamed into
    place together when the block succeeds (``io.atomic_files``), else none."""
    paths = [target] + (go_files.go_file_paths(data_path) if go_annotation is not None else [])
    with io.atomic_files(paths) as (processed_path, *go_paths):
        if go_annotation is not None:
            go_files.write_go_files_to(go_paths, go_annotation)
        yield processed_path


def read_processed_expression(
    adata: anndata.AnnData, de: bool = True, source: str = "the AnnData", unranked: frozenset[str] = frozenset()
) -> processing.ExpressionReading:
    """Add the processed columns to the validated ``adata`` (``processing.validate_annotations``)
    and read its expression, a block of cells at a time: checked, and, with ``de``, summed for
    the DE ranking and the gene sets of every condition but those ``unranked``
    (``processing.unranked_conditions``; ``write_processed_dataset`` writes them)."""
    processing.prepare_for_reading(adata, de, unranked)
    return processing.read_expression(adata, source, de, unranked)


def write_processed_dataset(adata: anndata.AnnData, path: Path, reading: processing.ExpressionReading) -> None:
    """Add the DE ranking and the gene sets of ``reading`` (``read_processed_expression`` of
    ``adata``) and write ``adata`` as the processed file ``path`` (atomically; a backed one
    by copying its file, never reading its expression into memory)."""
    processing.add_de_entries(adata, reading)
    io.write_h5ad(adata, path)


def write_normalized_dataset(
    annotations: anndata.AnnData,
    path: Path,
    blocks,
    dtype,
    de: bool = True,
    source: str = "the AnnData",
    unranked: frozenset[str] = frozenset(),
) -> None:
    """Process and write the processed file ``path`` from a screen's ``annotations`` (an
    AnnData without ``X``, validated) and its expression, which ``blocks`` gives a block of
    cells at a time (``(first cell, CSR block)``: ``normalization.normalized_blocks``), as
    values of ``dtype``.

    The blocks are read once: checked, summed for the DE ranking and the gene sets (``de``;
    of every condition but those ``unranked``: ``processing.unranked_conditions``) and
    appended to the file as they come, so the expression is never in memory whole. The file
    is written atomically: nothing is left of it when a check fails."""
    processing.prepare_for_reading(annotations, de, unranked)
    reading = processing.ExpressionReading(annotations.obs, annotations.n_vars, de, unranked)
    with io.h5ad_by_blocks(path, annotations, dtype) as expression:
        for start, block in blocks:
            reading.add(start, block)
            expression.append(block)
        reading.check.finish(source)
        processing.add_de_entries(annotations, reading)


def clear_stale_caches(adata: anndata.AnnData, folder: Path) -> None:
    """Delete the split and graph caches of an earlier version of the dataset just written
    to ``folder`` (``adata``: its cells and genes, logged)."""
    _log_written(folder, adata, remove_stale_caches(folder))


def remove_stale_caches(folder: Path) -> int:
    """Delete the split and graph caches of an earlier version of the dataset in ``folder``;
    how many. ``processed_dataset`` calls it once the new processed file is written, before
    it is renamed into place, so a stop in between costs caches that are built again, never
    leaves caches of other data beside the new file."""
    splits = folder / "splits"
    stale = (
        list(splits.glob("*.pkl"))
        + list(splits.glob(f"*{cache_settings.SUFFIX}"))
        + list(folder.glob("*_co_expression_network*"))
        + list(folder.glob("go_essential_*.csv"))
    )
    for path in stale:
        path.unlink()
    return len(stale)


def _log_written(folder: Path, adata: anndata.AnnData, removed: int) -> None:
    """Log the processed file written to ``folder`` (``adata``: its cells and genes) and the
    ``removed`` caches of earlier data."""
    logger.info(
        "wrote %s (%d cells x %d genes)%s",
        folder / io.PROCESSED_FILE,
        adata.n_obs,
        adata.n_vars,
        f"; removed {removed} cached split/graph files of earlier data" if removed else "",
    )
