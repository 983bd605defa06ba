"""A real Perturb-seq screen shipped with the package, so GEARS trains on real data with no download.

Papalexi et al., Nature Genetics 2021: THP-1 cells (a human monocytic line) stimulated with
IFN-gamma, CRISPR knockouts of 25 genes of the IFN-gamma / PD-L1 pathway at low MOI, one
knockout per cell, 299 measured genes, raw UMI counts; as the R data package
``sceptredata`` publishes it (MIT licence). Beside it, the GO Biological Process 2021 gene
sets (Enrichr's, as GSEApy's test data hold them) restricted to the genes its GEARS model
reads (``go_neighbourhood``). ``papalexi2021/NOTICE.md`` names the sources, licences and
citations.

- ``papalexi2021()``: the screen as a user would have it: raw counts in ``X``, each cell's
  knocked-out gene in ``obs['target_gene']`` (``'non-targeting'`` for controls), its gRNA
  and biological replicate, ``var['gene_name']``; no ``condition`` or ``cell_type``.
- ``papalexi2021_go_gene_sets()``: the packaged GMT file.
- ``write_papalexi2021_dataset(data_path)``: the GO files built from those gene sets, and
  the screen processed as any screen is (``PertData.new_data_process`` with its own columns
  and ``normalize=True``; the cells of knockouts without GO terms left out).
- ``write_papalexi2021_go_gene_sets(full, out)``: how the packaged GMT was derived from the
  full one.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import anndata

from gears_ddp._logging import get_logger
from gears_ddp.data import io
from gears_ddp.data.gene_sets import read_gene_sets
from gears_ddp.data.go_files import write_go_files
from gears_ddp.data.pertdata import PertData
from gears_ddp.datasets.go_neighbourhood import go_neighbourhood, restrict_gene_sets

logger = get_logger(__name__)

NAME = "papalexi2021"
SCREEN_FILE = "papalexi2021_thp1_raw.h5ad"
GENE_SETS_FILE = "go_biological_process_2021_papalexi2021.gmt.gz"
NOTICE_FILE = "NOTICE.md"
PERTURBATION_COLUMN, CONTROL_LABEL = "target_gene", "non-targeting"
# the GO graph the packaged gene sets reproduce at the knocked-out genes: the published
# defaults num_similar_genes_go_graph and num_go_gnn_layers
GO_SIMILAR_GENES, GO_LAYERS = 20, 1


def packaged_file(name: str) -> Path:
    """The path of one of the screen's packaged files (``SCREEN_FILE``, ...)."""
    return Path(str(resources.files("gears_ddp.datasets") / NAME / name))


def papalexi2021() -> anndata.AnnData:
    """The screen as it comes, in memory (see the module docstring)."""
    return anndata.read_h5ad(packaged_file(SCREEN_FILE))


def papalexi2021_go_gene_sets() -> Path:
    """The packaged GO gene sets (GMT, gzip): every term of the genes its model reads."""
    return packaged_file(GENE_SETS_FILE)


def write_papalexi2021_dataset(data_path, overwrite: bool = False) -> Path:
    """The GO files in ``data_path`` and the processed screen in ``data_path/papalexi2021``;
    returns that folder. A processed screen already there is kept (``overwrite=True``
    processes it again); GO files of another annotation in ``data_path`` are refused
    (``FileExistsError``), not replaced."""
    data_path = Path(data_path)
    if data_path.exists() and not data_path.is_dir():
        raise ValueError(f"data path {data_path} is a file; the real screen's dataset needs a folder")
    write_go_files(data_path, read_gene_sets(papalexi2021_go_gene_sets()))
    folder = data_path / NAME
    if (folder / io.PROCESSED_FILE).exists() and not overwrite:
        logger.info("the real screen is processed already at %s", folder)
        return folder
    PertData(data_path).new_data_process(
        NAME,
        papalexi2021(),
        overwrite=overwrite,
        perturbation_column=PERTURBATION_COLUMN,
        control_label=CONTROL_LABEL,
        normalize=True,
        drop_unannotated=True,
    )
    return folder


def write_papalexi2021_go_gene_sets(full_gene_sets, out) -> Path:
    """Write to ``out`` the GMT file ``full_gene_sets`` restricted to the screen's knocked-out
    genes and the genes within ``GO_LAYERS + 1`` steps of them in the GO graph of
    ``GO_SIMILAR_GENES`` similar genes (how the packaged file was made from Enrichr's
    GO_Biological_Process_2021). Returns ``out``."""
    targets = set(anndata.read_h5ad(packaged_file(SCREEN_FILE), backed="r").obs[PERTURBATION_COLUMN].astype(str))
    genes = go_neighbourhood(
        read_gene_sets(full_gene_sets), sorted(targets - {CONTROL_LABEL}), GO_SIMILAR_GENES, GO_LAYERS
    )
    return restrict_gene_sets(full_gene_sets, genes, out)
