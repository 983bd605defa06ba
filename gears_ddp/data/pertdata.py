"""``PertData``: a Perturb-seq dataset ready for GEARS.

It reads the processed GEARS format (or processes a raw AnnData, in memory or backed by
its h5ad file), keeps the cells whose perturbed genes are in the perturbation vocabulary,
splits conditions into train / val / test, builds the gene graphs and hands out loaders.

Expression is held once per machine. By default it is a read-only map of a file beside
``perturb_processed.h5ad`` (``expression_map``), which every process that loads the dataset
shares through the page cache, whatever started it, and which may be larger than memory;
``expression_storage='memory'`` keeps it in memory instead, where pickling a ``PertData`` (as
``torch.multiprocessing`` does when it starts workers) passes it through shared memory.
``adata.X`` views the same values either way.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pandas as pd

from gears_ddp._logging import get_logger
from gears_ddp.data import (
    dataset_cells,
    download,
    graph_cache,
    io,
    processed_dataset,
    processing,
    raw_screens,
    screen_check,
    split_cache,
)
from gears_ddp.data.cells import CellTable
from gears_ddp.data.conditions import CONTROL, condition_genes
from gears_ddp.data.expression_map import DTYPES
from gears_ddp.data.go_files import GENE2GO_FILE
from gears_ddp.data.graphs import GeneGraph
from gears_ddp.data.loaders import build_loaders, check_loader_options
from gears_ddp.data.screen_report import ScreenReport
from gears_ddp.data.splits import SplitOptions, cells_of_sets
from gears_ddp.data.vocabulary import VocabularySource, cells_in_vocabulary

if TYPE_CHECKING:  # anndata is imported where an AnnData is read or built, not by every rank
    import anndata

logger = get_logger(__name__)

STORAGES = ("mapped", "memory")
NO_DATASET = "no dataset loaded: call load() or new_data_process() first"

T = TypeVar("T")


def _split_sets(set2conditions: dict | None) -> dict:
    """``set2conditions``, which ``prepare_split`` sets; a RuntimeError before it."""
    if set2conditions is None:
        raise RuntimeError("call prepare_split before asking for loaders or graphs")
    return set2conditions


def _loaded(value: T | None) -> T:
    """``value``, an attribute that loading a dataset sets; a RuntimeError while none is loaded."""
    if value is None:
        raise RuntimeError(NO_DATASET)
    return value


class PertData:
    """A Perturb-seq dataset for GEARS: conditions, splits, gene graphs and loaders.

    Parameters
    ----------
    data_path: folder holding the datasets (one sub-folder each) and the GO files; made when
        something is first written there (a GO file downloaded, a dataset processed).
    gene_set_path: optional pickle of a gene list that defines the perturbation vocabulary.
    default_pert_graph: use the published GEARS vocabulary and GO graph
        (``essential_all_data_pert_genes.pkl``, ``go_essential_all``); if False the
        vocabulary is the dataset's genes plus its perturbed genes, and the GO graph is
        computed for it.
    expression_storage: ``'mapped'`` (a read-only file map shared by every process of a
        machine; the default) or ``'memory'``.
    expression_dtype: ``'float32'`` or ``'float16'`` (half the bytes; batches and
        statistics are computed in float32 / float64 either way).
    """

    def __init__(
        self,
        data_path,
        gene_set_path=None,
        default_pert_graph: bool = True,
        expression_storage: str = "mapped",
        expression_dtype: str = "float32",
    ):
        if expression_storage not in STORAGES:
            raise ValueError(f"expression_storage must be one of {STORAGES}, got {expression_storage!r}")
        if expression_dtype not in DTYPES:
            raise ValueError(f"expression_dtype must be one of {tuple(DTYPES)}, got {expression_dtype!r}")
        self.expression_storage, self.expression_dtype = expression_storage, expression_dtype
        self.data_path = str(data_path)
        if Path(self.data_path).exists() and not Path(self.data_path).is_dir():
            raise ValueError(
                f"data_path {self.data_path} is a file; PertData needs a folder (for the GO files and the datasets)"
            )
        self.gene_set_path = gene_set_path
        self.default_pert_graph = default_pert_graph and gene_set_path is None
        self.dataset_name: str | None = None
        self.dataset_path: str | None = None
        self._adata: anndata.AnnData | None = None
        self.var: pd.DataFrame | None = None
        self.uns: dict | None = None
        self.cells: CellTable | None = None
        self.gene_names: pd.Series = pd.Series(dtype=str)
        self.node_map: dict[str, int] = {}
        self.pert_names: np.ndarray | None = None
        self.node_map_pert: dict[str, int] = {}
        self.split: str | None = None
        self.seed: int | None = None
        self.train_gene_set_size: float | None = None
        self.subgroup: dict | None = None
        self.set2conditions: dict[str, list[str]] | None = None
        self.dataloader: dict | None = None
        self.loader_options: dict | None = None  # the arguments the loaders were built with
        self._gene2go: dict | None = None

    # ------------------------------------------------------------------ loading
    @property
    def gene2go(self) -> dict:
        """Gene symbol -> GO term ids (``gene2go_all.pkl``, downloaded if absent)."""
        if self._gene2go is None:
            path = download.ensure_go_file(GENE2GO_FILE, self.data_path)
            self._gene2go = io.read_pickle(path, "gene -> GO terms mapping")
        return self._gene2go

    def load(
        self, data_name: str | None = None, data_path: str | os.PathLike | None = None, archive=None, go_archive=None
    ) -> None:
        """Load a dataset: one of the paper's by ``data_name`` (downloaded into ``data_path``
        of the constructor if absent), or a local folder holding ``perturb_processed.h5ad``.

        Where the download is refused, the files can come from local archives (zip or
        tar.gz, extracted into the constructor's ``data_path`` as a download is):
        ``archive`` holds the dataset's folder (``data_name`` may then be any name), and
        ``go_archive`` the Gene Ontology files at their published paths."""
        self.ensure_go_inputs(go_archive)
        folder = processed_dataset.dataset_folder(data_name, data_path, self.data_path, archive)
        with processed_dataset.opened_dataset(folder, check_values=self.expression_storage == "memory") as parts:
            in_vocabulary = self._cells_in_vocabulary(parts, folder.name)
            self._use_dataset(parts, folder, processing.kept_with_de_genes(parts, folder.name, in_vocabulary))

    def new_data_process(
        self,
        dataset_name: str,
        adata: anndata.AnnData | None = None,
        skip_calc_de: bool = False,
        overwrite: bool = False,
        *,
        perturbation_column: str | None = None,
        control_label: str | None = None,
        combination_separator: str | None = None,
        normalize: bool = False,
        n_top_genes: int | None = None,
        drop_unannotated: bool = True,
        go_annotation: dict | None = None,
        go_annotation_origin: str = "go_annotation",
    ) -> None:
        """Process a screen into ``data_path/<dataset_name>/perturb_processed.h5ad`` and load it.

        The published GEARS takes ``obs['condition']`` (``'ctrl'``, ``'A+ctrl'``, ``'A+B'``),
        ``obs['cell_type']``, ``var['gene_name']`` and log-normalised ``X``. A screen as it
        comes is taken too:

        - ``perturbation_column``: the ``obs`` column naming each cell's perturbed gene(s),
          with ``control_label`` the label of control cells and ``combination_separator``
          the text joining two genes (``'+'``, ``'_'``); ``obs['condition']`` is written
          from it. Without ``obs['cell_type']`` every cell gets one cell type, the dataset's
          name (GEARS models one cell type).
        - ``normalize=True``: ``X`` holds raw counts, normalised as scanpy does (each cell to
          1e4 counts, then log1p); ``n_top_genes`` keeps only that many highly variable
          genes, chosen on the counts (scanpy's ``seurat_v3``), plus every perturbed gene the
          screen measures. Raw counts without ``normalize`` are refused.
        - ``drop_unannotated``: cells whose perturbed genes are outside the perturbation
          vocabulary (no GO annotation) are dropped with a warning that names them, as the
          published GEARS drops them; ``False`` refuses the screen instead, naming them.
        - ``go_annotation``: gene -> GO terms (as ``read_gene_sets`` and ``read_annotation``
          read a GMT or GAF file, named by ``go_annotation_origin``) to build the GO files of
          ``data_path`` from (``go_files``), in place of those there: the screen is checked
          against it, and the GO files are written with the processed file, all or none.

        An existing processed file is only replaced with ``overwrite=True``. The expression is
        read a block of cells at a time (a backed ``adata`` too: a screen larger than memory),
        and a refused or interrupted screen leaves the disk as it was
        (``processed_dataset.processed_dataset`` says how).
        """
        if adata is None:
            raise ValueError("new_data_process needs the raw AnnData as `adata`")
        folder = processed_dataset.folder_to_process(self.data_path, dataset_name, overwrite)
        screen: dict[str, Any] = {
            "perturbation_column": perturbation_column,
            "control_label": control_label,
            "combination_separator": combination_separator,
            "normalize": normalize,
            "n_top_genes": n_top_genes,
            "drop_unannotated": drop_unannotated,
            "skip_calc_de": skip_calc_de,
            "splits": [],
            "go_annotation": go_annotation,
            "go_annotation_origin": go_annotation_origin,
        }
        checked = self.check_screen(adata, dataset_name, read_expression=False, **screen)
        if not checked.would_train:
            self.check_screen(adata, dataset_name, **screen).refuse()  # the expression's problems named too
        screen_check.log_warnings_processing_omits(checked)
        source = screen_check.screen_source(dataset_name)
        raw_screens.add_gears_columns(
            adata, dataset_name, perturbation_column, control_label, combination_separator, source
        )
        if go_annotation is None:
            self.ensure_go_inputs()  # every GO file there, or all the missing ones named, before any work
        cells_to_keep = functools.partial(
            self._cells_in_vocabulary, name=dataset_name, drop_unannotated=drop_unannotated, go_annotation=go_annotation
        )
        with processed_dataset.processed_dataset(
            adata,
            folder,
            normalize=normalize,
            n_top_genes=n_top_genes,
            de=not skip_calc_de,
            go_annotation=go_annotation,
            data_path=self.data_path,
            cells_to_keep=cells_to_keep,
            source=source,
        ) as (data, annotations, keep):
            if go_annotation is not None:
                self._gene2go = go_annotation  # what the GO files just written hold
            self._use_dataset(data, folder, keep)
        self._adata = dataset_cells.anndata_view(
            _loaded(self.cells).expression, annotations.obs, keep, self.var, _loaded(self.uns)
        )

    def check_screen(
        self,
        adata: anndata.AnnData,
        dataset_name: str = "screen",
        *,
        perturbation_column: str | None = None,
        control_label: str | None = None,
        combination_separator: str | None = None,
        normalize: bool = False,
        n_top_genes: int | None = None,
        drop_unannotated: bool = True,
        skip_calc_de: bool = False,
        go_annotation: dict | None = None,
        go_annotation_origin: str = "go_annotation",
        splits: list[dict] | None = None,
        read_expression: bool = True,
    ) -> ScreenReport:
        """Check a screen whole, as ``new_data_process(dataset_name, adata, ...)`` with the same
        options would take it and as ``prepare_split`` would split it with each of ``splits``
        (dicts of its options; None: its defaults, the simulation split with seed 1), and
        process nothing: no file is written, nothing downloaded, ``adata`` left as it is.

        Returns the ``ScreenReport``: what the screen holds and every problem, each with its
        fix (``print(report)``; ``ScreenReport.would_train``; ``ScreenReport.refuse()`` raises them all).
        The GO terms are those of the GO files in ``data_path``, when they are there; or, given
        ``go_annotation`` (gene -> GO terms, as ``read_gene_sets`` and ``read_annotation``
        read a GMT or GAF file, named by ``go_annotation_origin``), those the GO files built
        from it would hold, and the report says what it adds. ``read_expression=False`` leaves
        out the one check that reads every cell's expression. A processed dataset is checked
        as one: its ``perturb_processed.h5ad`` read backed, with ``skip_calc_de=True``."""
        return screen_check.check_screen(
            adata,
            dataset_name,
            perturbation_column=perturbation_column,
            control_label=control_label,
            combination_separator=combination_separator,
            normalize=normalize,
            n_top_genes=n_top_genes,
            de=not skip_calc_de,
            drop_unannotated=drop_unannotated,
            vocabulary=lambda annotations: self._go_vocabulary(annotations, go_annotation, go_annotation_origin),
            splits=[_split_request(options) for options in ([{}] if splits is None else splits)],
            read_expression=read_expression,
        )

    @property
    def _vocabulary_source(self) -> VocabularySource:
        """Where the perturbation vocabulary comes from, by the constructor's choice."""
        return VocabularySource(self.data_path, self.gene_set_path, self.default_pert_graph)

    def _go_vocabulary(self, annotations, gene2go: dict | None, origin: str) -> screen_check.GoVocabulary:
        """The perturbation vocabulary of the screen ``annotations`` (GEARS's columns): that
        of ``gene2go`` when given, as the GO files built from it would make it, else that of
        the data folder's GO files, unknown when they are absent (nothing is downloaded)."""
        return self._vocabulary_source.screen_vocabulary(annotations, lambda: self.gene2go, gene2go, origin)

    def ensure_go_inputs(self, archive=None) -> None:
        """Have every Gene Ontology file this PertData will read (from the local ``archive``
        or downloaded, if absent), or fail at once naming all that are missing."""
        download.ensure_go_files(self._vocabulary_source.go_files(), self.data_path, archive)

    def _cells_in_vocabulary(
        self, adata: anndata.AnnData, name: str, drop_unannotated: bool = True, go_annotation: dict | None = None
    ) -> np.ndarray:
        """Set the perturbation vocabulary, of the data folder's GO files or of those
        ``go_annotation`` will make; returns which cells it can represent. The others'
        conditions are dropped with a warning naming them, or (``drop_unannotated=False``)
        refused naming their genes and the ways to keep them (``vocabulary``); the folder is
        named as a path (``data/demo`` for ``./data/demo``), so that the warning is the same
        text however the folder was given, and said once a process."""
        if go_annotation is None:
            self.pert_names = self._vocabulary_source.genes(adata, self.gene2go)
        else:
            self.pert_names = self._vocabulary_source.genes(adata, go_annotation, from_annotation=True)
        self.node_map_pert = {g: i for i, g in enumerate(self.pert_names)}
        return cells_in_vocabulary(adata, name, self.node_map_pert, str(Path(self.data_path)), drop_unannotated)

    def _use_dataset(self, data, folder: Path, keep: np.ndarray) -> None:
        """Build the cell table of the cells ``keep`` of ``data`` (an AnnData, or the parts of
        an h5ad file), the expression mapped or in memory."""
        self.dataset_name = folder.name
        self.dataset_path = str(folder)
        self.var, self.uns = data.var.copy(), dict(data.uns)
        self.cells = cells = dataset_cells.cell_table(
            data, keep, self.node_map_pert, folder, self.expression_storage, self.expression_dtype
        )
        self._adata = None  # built from the h5ad when first asked for (the cells' names cost memory)
        self.gene_names = self.var["gene_name"]
        self.node_map = {g: i for i, g in enumerate(self.gene_names)}
        self.split = self.set2conditions = self.subgroup = self.dataloader = None
        logger.info(
            "dataset %s: %d cells, %d genes, %d conditions, perturbation vocabulary of %d genes",
            self.dataset_name,
            cells.n_cells,
            len(self.var),
            len(cells.conditions),
            len(_loaded(self.pert_names)),
        )

    @property
    def adata(self) -> anndata.AnnData | None:
        """The dataset's cells as an AnnData whose ``X`` views the expression, with the ``obs``
        table of ``perturb_processed.h5ad``. Built on first use: training needs only the cell
        table and the condition tables, and a million cells' names alone take tens of MB."""
        if self._adata is None and self.cells is not None:
            obs = io.read_obs(Path(_loaded(self.dataset_path)) / io.PROCESSED_FILE)
            keep = obs["condition"].astype(str).isin(self.cells.conditions).to_numpy()
            self._adata = dataset_cells.anndata_view(self.cells.expression, obs, keep, self.var, _loaded(self.uns))
        return self._adata

    @property
    def ctrl_adata(self) -> anndata.AnnData:
        """The control cells (a view of ``adata``)."""
        adata = _loaded(self.adata)
        return adata[adata.obs["condition"] == CONTROL]

    def get_pert_idx(self, condition: str) -> list[int]:
        """Indices of a condition's perturbed genes in the perturbation vocabulary."""
        return [self.node_map_pert[g] for g in condition_genes(condition)]

    # ------------------------------------------------------------------ splits
    def prepare_split(
        self,
        split: str = "simulation",
        seed: int = 1,
        train_gene_set_size: float = 0.75,
        combo_seen2_train_frac: float = 0.75,
        combo_single_split_test_set_fraction: float = 0.1,
        test_perts=None,
        only_test_set_perts: bool = False,
        test_pert_genes=None,
        split_dict_path=None,
    ) -> None:
        """Split conditions into train / val / test (sets ``set2conditions`` and ``subgroup``).

        Same parameters and results as the published GEARS; splits are cached in
        ``<dataset>/splits/`` under the reference's file names. ``test_perts`` and
        ``test_pert_genes`` take a list or the reference's ``'_'``-joined string.

        Those names hold the split, seed, ``train_gene_set_size`` and ``test_perts`` only, so
        every setting is also written beside the split (``cache_settings``). A cached split
        built with other settings is built again and replaces the cache (logged, naming the
        settings that differ), rather than refused: a split is a pure function of the
        conditions and the settings, the cache only saves its computation, and whoever asks
        for other settings wants their split, not a request to delete files. A split file
        without settings (as the published GEARS writes it) is used when its name matches.
        """
        cells = self.require_data()
        result = split_cache.prepared_split(
            cells.conditions,
            self.dataset_path,
            _loaded(self.dataset_name),
            split,
            seed,
            train_gene_set_size,
            combo_seen2_train_frac,
            combo_single_split_test_set_fraction,
            test_perts,
            only_test_set_perts,
            test_pert_genes,
            split_dict_path,
        )
        self.split, self.seed, self.train_gene_set_size = split, seed, train_gene_set_size
        self.set2conditions, self.subgroup = result.set2conditions, result.subgroup

    # ------------------------------------------------------------------ loaders
    def get_dataloader(
        self,
        batch_size: int,
        test_batch_size: int | None = None,
        seed: int = 0,
        resample_controls: bool = False,
        num_workers: int = 0,
    ) -> dict:
        """Loaders for one process: ``{'train_loader', 'val_loader', 'test_loader'}`` (the sets
        the split defines), also stored as ``self.dataloader``.

        ``seed`` fixes the shuffling and the control cell paired with each perturbed cell;
        ``resample_controls=True`` draws new control partners for training every epoch
        (call ``loader.set_epoch(epoch)``).
        """
        return self.get_dataloader_distributed(
            batch_size,
            test_batch_size,
            world_size=1,
            rank=0,
            num_workers=num_workers,
            seed=seed,
            resample_controls=resample_controls,
        )

    def get_dataloader_distributed(
        self,
        batch_size: int,
        test_batch_size: int | None = None,
        world_size: int = 1,
        rank: int = 0,
        num_workers: int = 0,
        pin_memory: bool = False,
        seed: int = 0,
        resample_controls: bool = False,
    ) -> dict:
        """Loaders for rank ``rank`` of ``world_size``: train shuffled as ``DistributedSampler``
        shuffles (``drop_last``; call ``set_epoch``), val/test as contiguous shards that cover
        every cell exactly once across ranks.

        ``num_workers`` defaults to 0 because a batch is one in-memory gather; worker
        processes would only add copies between processes.
        """
        check_loader_options(
            {
                "batch_size": batch_size,
                "test_batch_size": test_batch_size,
                "seed": seed,
                "num_workers": num_workers,
                "resample_controls": resample_controls,
            }
        )
        return self.use_loaders(
            batch_size, test_batch_size, world_size, rank, num_workers, pin_memory, seed, resample_controls
        )

    def use_loaders(
        self,
        batch_size: int,
        test_batch_size: int | None = None,
        world_size: int = 1,
        rank: int = 0,
        num_workers: int = 0,
        pin_memory: bool = False,
        seed: int = 0,
        resample_controls: bool = False,
    ) -> dict:
        """``get_dataloader_distributed`` of options checked where they came in (a training
        run's: ``TrainingOptions``), so not again: ``new_loaders``, kept as ``self.dataloader``
        and their options as ``self.loader_options``."""
        options: dict[str, Any] = {
            "batch_size": batch_size,
            "test_batch_size": test_batch_size,
            "world_size": world_size,
            "rank": rank,
            "num_workers": num_workers,
            "pin_memory": pin_memory,
            "seed": seed,
            "resample_controls": resample_controls,
        }
        self.dataloader = self.new_loaders(**options)
        self.loader_options = options
        return self.dataloader

    def new_loaders(
        self,
        batch_size: int,
        test_batch_size: int | None,
        world_size: int,
        rank: int,
        num_workers: int,
        pin_memory: bool,
        seed: int,
        resample_controls: bool,
    ) -> dict:
        """Loaders of the split with these (checked) options, this ``PertData``'s own left as
        they are: what one ``GEARS.train`` call with other loader options trains on."""
        cells = self.require_data()
        return build_loaders(
            cells,
            cells_of_sets(cells, _split_sets(self.set2conditions), self.split),
            batch_size,
            test_batch_size or batch_size,
            world_size,
            rank,
            seed,
            resample_controls,
            num_workers,
            pin_memory,
        )

    # ------------------------------------------------------------------ graphs
    def coexpression_graph(self, threshold: float = 0.4, k: int = 20) -> GeneGraph:
        """Gene co-expression graph from the training cells of control and single conditions
        (cached, except for custom splits, as the reference's
        ``<split>_<seed>_<size>_<threshold>_<k>_co_expression_network.csv``).

        Splits with other ``test_perts`` or other settings share that name, so the training
        conditions the graph was built from are written beside it (``cache_settings``): a
        cache built from other ones is built again; one without them is used on its name."""
        return graph_cache.coexpression_graph(
            self.require_data(),
            self.gene_names.to_numpy(),
            self.node_map,
            _split_sets(self.set2conditions)["train"],
            self.dataset_path,
            self.split,
            self.seed,
            self.train_gene_set_size,
            threshold,
            k,
        )

    def go_graph(self, k: int = 20) -> GeneGraph:
        """GO-similarity graph over the perturbation vocabulary (top ``k + 1`` sources per gene).

        From the GO edge list of the data folder (``go_essential_all.csv``, which holds every
        annotated gene's edges), the vocabulary's graph is cached in the dataset folder as
        ``go_graph_<k>.csv``, with the edge list's size and time and the vocabulary beside it
        (``cache_settings``): the ranks of a run and later runs read the vocabulary's edges,
        not the whole edge list again."""
        self.require_data()
        pert_names = _loaded(self.pert_names)
        if self.default_pert_graph:
            return graph_cache.default_go_graph(self.data_path, self.dataset_path, pert_names, self.node_map_pert, k)
        return graph_cache.dataset_go_graph(
            lambda: self.gene2go, self.dataset_path, _loaded(self.dataset_name), pert_names, self.node_map_pert, k
        )

    # ------------------------------------------------------------------ sharing
    def require_data(self) -> CellTable:
        """The loaded dataset's cell table; a RuntimeError while none is loaded."""
        return _loaded(self.cells)

    def share_memory_(self) -> "PertData":
        """Make the data shareable with spawned workers without a copy each: an expression
        kept in memory moves to shared memory (``/dev/shm``: containers need it large enough
        for the matrix, e.g. ``docker run --shm-size``), so ``adata.X`` is pointed at the
        shared copy and the private one is freed; a mapped expression is shared already."""
        cells = self.require_data()
        cells.share_memory_()
        if self._adata is not None:
            self._adata.X = cells.expression.numpy()
        return self

    def __getstate__(self) -> dict:
        """Pickle without the loaders and without the per-cell AnnData (a process that
        unpickles it builds it from the h5ad if it asks for ``adata``)."""
        return {**self.__dict__, "dataloader": None, "loader_options": None, "_adata": None}


SPLIT_OPTIONS = tuple(SplitOptions.names())  # prepare_split's parameters (a test checks they are the same)
SPLIT_DEFAULTS = SplitOptions.defaults()


def _split_request(options: dict) -> dict:
    """``prepare_split``'s options for a split to check: ``options`` (names checked) over its
    defaults, the gene and condition lists as ``prepare_split`` reads them."""
    unknown = sorted(set(options) - set(SPLIT_OPTIONS))
    if unknown:
        raise ValueError(f"unknown split option(s) {unknown}; prepare_split's options: {', '.join(SPLIT_OPTIONS)}")
    request = {**SPLIT_DEFAULTS, **options}
    return {
        **request,
        "test_perts": split_cache.names_given(request["test_perts"]),
        "test_pert_genes": split_cache.names_given(request["test_pert_genes"]),
    }
