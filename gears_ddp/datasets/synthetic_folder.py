"""Write the synthetic dataset as a complete GEARS data folder that ``PertData`` loads.

Layout under ``data_path`` (the same names as the published GEARS downloads, so the
published package can read it too)::

    gene2go_all.pkl                          gene -> GO terms
    essential_all_data_pert_genes.pkl        the perturbation vocabulary
    go_essential_all/go_essential_all.csv    GO Jaccard edge list (> 0.1)
    <name>/perturb_processed.h5ad            processed expression
    <name>/true_means.csv.gz                 noise-free mean profile per condition
    <name>/ground_truth.json                 interaction type per combo, generator parameters

The GO files are shared by every dataset of ``data_path``; a folder that already holds
different GO files (the real ones, say) is refused rather than overwritten.

``write_synthetic_screen`` writes a raw screen instead (``<name>.h5ad``, unprocessed, the
input of ``PertData.new_data_process``), a block of cells at a time, so that screens of
millions of cells can be generated with bounded memory.
"""

from __future__ import annotations

import json
from pathlib import Path

import anndata
import numpy as np
import pandas as pd

from gears_ddp._logging import get_logger
from gears_ddp.data import io, processing
from gears_ddp.data.go_files import write_go_files
from gears_ddp.data.processed_dataset import clear_stale_caches, read_processed_expression, write_processed_dataset
from gears_ddp.datasets.synthetic import GEARS_LAYOUT, make_synthetic_perturb_seq

logger = get_logger(__name__)

TRUE_MEANS_FILE = "true_means.csv.gz"
GROUND_TRUTH_FILE = "ground_truth.json"


def write_synthetic_dataset(data_path, name: str = "synthetic", overwrite: bool = False, **generator_options) -> Path:
    """Generate the synthetic dataset and write it as ``data_path/<name>``; return that folder.

    ``generator_options`` go to ``make_synthetic_perturb_seq`` (sizes, ``seed``). If the
    folder already holds the dataset it is kept as is (pass ``overwrite=True`` to
    regenerate it).
    """
    data_path = Path(data_path)
    if data_path.exists() and not data_path.is_dir():
        raise ValueError(f"data path {data_path} is a file; the synthetic dataset needs a folder")
    if generator_options.get("layout", GEARS_LAYOUT) != GEARS_LAYOUT:
        raise ValueError(
            f"write_synthetic_dataset processes GEARS's layout; layout="
            f"{generator_options['layout']!r} is a screen as it comes: write it with "
            "write_synthetic_screen and process it (gears-ddp process)"
        )
    folder = data_path / name.lower()
    if (folder / io.PROCESSED_FILE).exists() and (folder / TRUE_MEANS_FILE).exists() and not overwrite:
        logger.info("synthetic dataset already at %s", folder)
        return folder
    data_path.mkdir(parents=True, exist_ok=True)
    synthetic = make_synthetic_perturb_seq(**generator_options)
    adata = synthetic.adata
    if adata is None:  # an ``expression_to`` among the options wrote the expression elsewhere
        raise ValueError("write_synthetic_dataset writes the expression itself; it takes no expression_to")
    write_go_files(data_path, synthetic.gene2go, synthetic.pert_genes, overwrite)
    source = f"synthetic dataset {name!r}"
    processing.validate_annotations(adata, source)
    write_processed_dataset(adata, folder / io.PROCESSED_FILE, read_processed_expression(adata, source=source))
    clear_stale_caches(adata, folder)
    with io.atomic_path(folder / TRUE_MEANS_FILE) as tmp:
        synthetic.true_means.to_csv(tmp, compression="gzip")
    ground_truth = {"interaction_types": synthetic.interaction_types, "params": synthetic.params}
    with io.atomic_path(folder / GROUND_TRUTH_FILE) as tmp:
        tmp.write_text(json.dumps(ground_truth, indent=1))
    logger.info("wrote synthetic dataset %s: %d cells x %d genes", folder, *adata.shape)
    return folder


def write_synthetic_screen(data_path, name: str = "screen", overwrite: bool = False, **generator_options) -> Path:
    """Generate a synthetic screen and write it, unprocessed, as ``data_path/<name>.h5ad``
    (CSR expression appended a block of cells at a time), with the GO files in
    ``data_path``; returns the h5ad's path. ``generator_options`` go to
    ``make_synthetic_perturb_seq``. Process it with ``PertData(data_path).new_data_process(
    name, anndata.read_h5ad(path, backed='r'))``, which also reads it a block at a time; a
    screen in the ``"screen"`` layout (raw counts, ``obs['target_gene']``) with ``gears-ddp
    process --perturbation-column target_gene --control-label non-targeting --normalize``."""
    data_path = Path(data_path)
    data_path.mkdir(parents=True, exist_ok=True)
    path = data_path / f"{name}.h5ad"
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True to replace it")

    def to_file(obs: pd.DataFrame, var: pd.DataFrame, blocks) -> None:
        with io.h5ad_by_blocks(path, anndata.AnnData(obs=obs, var=var), np.float32) as expression:
            for block in blocks:
                expression.append(block)

    synthetic = make_synthetic_perturb_seq(**generator_options, expression_to=to_file)
    write_go_files(data_path, synthetic.gene2go, synthetic.pert_genes, overwrite)
    logger.info(
        "wrote synthetic screen %s: %d cells x %d genes", path, synthetic.params["n_cells"], synthetic.params["n_genes"]
    )
    return path


def read_true_means(dataset_folder) -> pd.DataFrame:
    """The noise-free mean profile per condition (rows) and gene (columns) of a synthetic dataset."""
    return pd.read_csv(Path(dataset_folder) / TRUE_MEANS_FILE, index_col=0, compression="gzip")


def read_ground_truth(dataset_folder) -> dict:
    """What a synthetic dataset was made with: ``interaction_types`` (each combination's
    planted type: additive, synergy, buffering or epistasis) and the generator's ``params``."""
    path = Path(dataset_folder) / GROUND_TRUTH_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: {dataset_folder} is not a synthetic dataset folder "
            "(write_synthetic_dataset writes one)"
        )
    return json.loads(path.read_text())
