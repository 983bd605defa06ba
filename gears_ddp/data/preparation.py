"""Preparing a dataset for training, once per machine: load it (a published one by name, or
a processed folder), prepare its split and build (cache) the gene graphs the model will ask
for, so that the ranks that then read it find everything built.
"""

from __future__ import annotations

from pathlib import Path

from gears_ddp.data import download
from gears_ddp.data.io import file_lock
from gears_ddp.data.pertdata import PertData


def load_dataset(pert_data_path, dataset_name: str, **pert_data_options) -> PertData:
    """A published dataset by name (downloaded if absent) or ``pert_data_path/dataset_name``,
    loaded by ``PertData(pert_data_path, **pert_data_options)``."""
    folder = local_dataset_folder(pert_data_path, dataset_name)
    pert_data = PertData(pert_data_path, **pert_data_options)
    if folder is None:
        pert_data.load(data_name=dataset_name)
    else:
        pert_data.load(data_path=folder)
    return pert_data


def local_dataset_folder(pert_data_path, dataset_name: str) -> Path | None:
    """The folder of dataset ``dataset_name`` in ``pert_data_path``; None for a published
    dataset's name (downloaded there if absent). A name that is neither is refused before
    anything is made or downloaded there (a mistyped data path would otherwise receive the
    GO files), naming the folder looked for."""
    if dataset_name in download.DATASET_FILE_IDS:
        return None
    folder = Path(pert_data_path) / dataset_name
    if not folder.is_dir():
        lower = folder.with_name(dataset_name.lower())
        hint = f" (processing names the folder in lower case: {lower} exists)" if lower.is_dir() else ""
        raise ValueError(
            f"dataset {dataset_name!r}: there is no folder {folder}{hint}, and {dataset_name!r} is none of the "
            f"published datasets ({', '.join(sorted(download.DATASET_FILE_IDS))}): give the pert_data_path "
            "that holds the dataset's folder (the --data-path gears-ddp process wrote it into) and its name"
        )
    return folder


def prepare_data(
    pert_data_path, dataset_name: str, split_options: dict, model_options: dict, **pert_data_options
) -> PertData:
    """Load the data, prepare the split (``PertData.prepare_split``'s ``split_options``) and
    build (cache) the graphs that ``model_initialize`` with ``model_options`` will ask for,
    once, for all workers.

    Processes that prepare the same dataset at the same moment (the torchrun or srun ranks
    of one machine, or jobs sharing a data folder) take turns on a lock file beside the
    dataset: the first downloads, maps and builds what is missing, the others find it built
    and only read it, so a fresh folder costs one build per machine, not one per rank.
    """
    local_dataset_folder(pert_data_path, dataset_name)  # before the lock file is made beside it
    dataset = Path(pert_data_path) / dataset_name
    with file_lock(dataset.parent / f".{dataset.name}.prepare.lock"):
        pert_data = load_dataset(pert_data_path, dataset_name, **pert_data_options)
        pert_data.prepare_split(**split_options)
        pert_data.coexpression_graph(
            model_options["coexpress_threshold"], model_options["num_similar_genes_co_express_graph"]
        )
        pert_data.go_graph(model_options["num_similar_genes_go_graph"])
    pert_data.require_data().identity()  # values in memory are hashed here, once, not in every spawned worker
    return pert_data
