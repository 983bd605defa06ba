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
    pert_data = PertData(pert_data_path, **pert_data_options)
    if dataset_name in download.DATASET_FILE_IDS:
        pert_data.load(data_name=dataset_name)
    else:
        pert_data.load(data_path=Path(pert_data_path) / dataset_name)
    return pert_data


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
