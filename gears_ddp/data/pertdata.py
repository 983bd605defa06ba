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

import contextlib
import hashlib
import inspect
from pathlib import Path
from typing import Iterator

import anndata
import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch

from gears_ddp._logging import get_logger
from gears_ddp.data import (cache_settings, download, go_files, graphs, io, normalization, processing,
                            raw_screens, screen_check)
from gears_ddp.data.cells import MAX_PERTURBED_GENES, N_DE_GENES, CellTable
from gears_ddp.data.expression_map import DTYPES, as_tensor, mapped_expression
from gears_ddp.data.go_files import ESSENTIAL_GENES_FILE, GENE2GO_FILE, GO_EDGES_NAME
from gears_ddp.data.conditions import CONTROL, coded_conditions, condition_genes, genes_of_conditions, is_single
from gears_ddp.data.loaders import build_loaders
from gears_ddp.data.go_coverage import coverage_problems, go_coverage
from gears_ddp.data.screen_report import ScreenReport, refuse
from gears_ddp.data.splits import (check_split_sets, read_custom_split, sets_of_split, split_conditions,
                                   split_option_problems)

logger = get_logger(__name__)

STORAGES = ("mapped", "memory")
CACHE_ADVICE = "it is a cache of this dataset folder: delete it and it is built again"
GO_EDGES_ADVICE = ("replace it: delete it to download it again, or build it with gears-ddp process --go-annotation "
                   "or --go-gene-sets")


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

    def __init__(self, data_path, gene_set_path=None, default_pert_graph: bool = True,
                 expression_storage: str = "mapped", expression_dtype: str = "float32"):
        if expression_storage not in STORAGES:
            raise ValueError(f"expression_storage must be one of {STORAGES}, got {expression_storage!r}")
        if expression_dtype not in DTYPES:
            raise ValueError(f"expression_dtype must be one of {tuple(DTYPES)}, got {expression_dtype!r}")
        self.expression_storage, self.expression_dtype = expression_storage, expression_dtype
        self.data_path = str(data_path)
        if Path(self.data_path).exists() and not Path(self.data_path).is_dir():
            raise ValueError(f"data_path {self.data_path} is a file; PertData needs a folder (for the GO files and "
                             "the datasets)")
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

    def load(self, data_name: str | None = None, data_path: str | None = None, archive=None,
             go_archive=None) -> None:
        """Load a dataset: one of the paper's by ``data_name`` (downloaded into ``data_path``
        of the constructor if absent), or a local folder holding ``perturb_processed.h5ad``.

        Where the download is refused, the files can come from local archives (zip or
        tar.gz, extracted into the constructor's ``data_path`` as a download is):
        ``archive`` holds the dataset's folder (``data_name`` may then be any name), and
        ``go_archive`` the Gene Ontology files at their published paths."""
        self.ensure_go_inputs(go_archive)
        if data_name is not None and (data_name in download.DATASET_FILE_IDS or archive is not None):
            folder = download.ensure_dataset(data_name, self.data_path, archive)
        elif data_path is not None and Path(data_path).is_dir():
            folder = Path(data_path)
        else:
            raise ValueError(f"nothing to load: data_name must be one of {sorted(download.DATASET_FILE_IDS)} "
                             f"(got {data_name!r}) or come with an archive, or data_path must be an existing "
                             f"folder (got {data_path!r})")
        h5ad = folder / io.PROCESSED_FILE
        columns = ("condition", "cell_type", "condition_name")
        with io.h5ad_parts(h5ad, columns) as parts:  # X stays on disk, read a block at a time if need be
            processing.check_columns(parts, str(h5ad), obs_columns=columns)
            coded_conditions(parts.obs["condition"], f"{h5ad} obs['condition']")
            if self.expression_storage == "memory":
                processing.check_expression(parts.X, str(h5ad))  # (a new map checks the values it copies)
            self._use_dataset(parts, folder, self._cells_in_vocabulary(parts, folder.name))

    def new_data_process(self, dataset_name: str, adata: anndata.AnnData | None = None,
                         skip_calc_de: bool = False, overwrite: bool = False, *,
                         perturbation_column: str | None = None, control_label: str | None = None,
                         combination_separator: str | None = None, normalize: bool = False,
                         n_top_genes: int | None = None, drop_unannotated: bool = True,
                         go_annotation: dict | None = None, go_annotation_origin: str = "go_annotation") -> None:
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

        Without ``normalize``, ``adata`` gains the processed columns in place; with it,
        ``adata`` keeps its counts, and its cells are normalised a block at a time as the
        processed file is written. Either way the expression is read a block of cells at a
        time, from memory or from the file of a backed ``adata``
        (``anndata.read_h5ad(path, backed='r')``), so a screen larger than memory can be
        processed. An existing processed file is only replaced with ``overwrite=True``; split
        and graph caches in the folder are removed. Every check that can refuse the screen
        runs before a file is written, but those of raw counts (with ``normalize``), which are
        read once, as they are written; the files written are renamed into place together
        once all are complete, so a refused screen, or one interrupted, leaves the disk as it
        was.
        """
        if adata is None:
            raise ValueError("new_data_process needs the raw AnnData as `adata`")
        folder = Path(self.data_path) / dataset_name.lower()
        target = folder / io.PROCESSED_FILE
        if target.exists() and not overwrite:
            raise FileExistsError(f"{target} already exists; load it with PertData.load(data_path="
                                  f"'{folder}') or pass overwrite=True to replace it")
        source = screen_check.screen_source(dataset_name)
        screen = {"perturbation_column": perturbation_column, "control_label": control_label,
                  "combination_separator": combination_separator, "normalize": normalize, "n_top_genes": n_top_genes,
                  "drop_unannotated": drop_unannotated, "skip_calc_de": skip_calc_de, "splits": [],
                  "go_annotation": go_annotation, "go_annotation_origin": go_annotation_origin}
        if not self.check_screen(adata, dataset_name, read_expression=False, **screen).would_train:
            self.check_screen(adata, dataset_name, **screen).refuse()  # the expression's problems named too
        raw_screens.add_gears_columns(adata, dataset_name, perturbation_column, control_label,
                                      combination_separator, source)
        if go_annotation is None:
            self.ensure_go_inputs()  # every GO file there, or all the missing ones named, before any work
        de = not skip_calc_de
        if normalize:  # the counts are read, so checked, as they are written: the cheap checks come first
            perturbed = genes_of_conditions(adata.obs["condition"].astype(str).unique())
            processed, genes = normalization.normalized_annotations(adata, n_top_genes, perturbed, source)
            keep = self._cells_in_vocabulary(adata, dataset_name, drop_unannotated, go_annotation)
            with self._files_of_dataset(target, go_annotation) as processed_path:
                write_normalized_dataset(processed, processed_path, normalization.normalized_blocks(
                    adata.X, genes, source, check_counts=genes is None), normalization.normalized_dtype(adata.X), de,
                    source)
            clear_stale_caches(processed, folder)
            with io.h5ad_parts(target, ("condition", "cell_type", "condition_name")) as parts:
                self._use_dataset(parts, folder, keep)
        else:  # the expression is read, so checked, before anything is written
            processed, reading = adata, read_processed_expression(adata, de, source)
            keep = self._cells_in_vocabulary(adata, dataset_name, drop_unannotated, go_annotation)
            with self._files_of_dataset(target, go_annotation) as processed_path:
                write_processed_dataset(adata, processed_path, reading)
            clear_stale_caches(adata, folder)
            self._use_dataset(adata, folder, keep)
        self._adata = _view(self.cells.expression, _kept(processed.obs, keep), self.var, self.uns)

    @contextlib.contextmanager
    def _files_of_dataset(self, target: Path, go_annotation: dict | None) -> Iterator[Path]:
        """Yield the path to write the processed file ``target`` at; with ``go_annotation``,
        the GO files built from it are written first, and all are renamed into place together
        when the block succeeds (``io.atomic_files``), else none."""
        paths = [target] + (go_files.go_file_paths(self.data_path) if go_annotation is not None else [])
        with io.atomic_files(paths) as (processed_path, *go_paths):
            if go_annotation is not None:
                go_files.write_go_files_to(go_paths, go_annotation)
            yield processed_path
        if go_annotation is not None:
            self._gene2go = go_annotation

    def check_screen(self, adata: anndata.AnnData, dataset_name: str = "screen", *,
                     perturbation_column: str | None = None, control_label: str | None = None,
                     combination_separator: str | None = None, normalize: bool = False,
                     n_top_genes: int | None = None, drop_unannotated: bool = True, skip_calc_de: bool = False,
                     go_annotation: dict | None = None, go_annotation_origin: str = "go_annotation",
                     splits: list[dict] | None = None, read_expression: bool = True) -> ScreenReport:
        """Check a screen whole, as ``new_data_process(dataset_name, adata, ...)`` with the same
        options would take it and as ``prepare_split`` would split it with each of ``splits``
        (dicts of its options; None: its defaults, the simulation split with seed 1), and
        process nothing: no file is written, nothing downloaded, ``adata`` left as it is.

        Returns the ``ScreenReport``: what the screen holds and every problem, each with its
        fix (``print(report)``; ``report.would_train``; ``report.refuse()`` raises them all).
        The GO terms are those of the GO files in ``data_path``, when they are there; or, given
        ``go_annotation`` (gene -> GO terms, as ``read_gene_sets`` and ``read_annotation``
        read a GMT or GAF file, named by ``go_annotation_origin``), those the GO files built
        from it would hold, and the report says what it adds. ``read_expression=False`` leaves
        out the one check that reads every cell's expression. A processed dataset is checked
        as one: its ``perturb_processed.h5ad`` read backed, with ``skip_calc_de=True``."""
        return screen_check.check_screen(
            adata, dataset_name, perturbation_column=perturbation_column, control_label=control_label,
            combination_separator=combination_separator, normalize=normalize, n_top_genes=n_top_genes,
            de=not skip_calc_de, drop_unannotated=drop_unannotated,
            vocabulary=lambda annotations: self._go_vocabulary(annotations, go_annotation, go_annotation_origin),
            splits=[_split_request(options) for options in ([{}] if splits is None else splits)],
            read_expression=read_expression)

    def _go_vocabulary(self, annotations, gene2go: dict | None, origin: str) -> screen_check.GoVocabulary:
        """The perturbation vocabulary of the screen ``annotations`` (GEARS's columns): that
        of ``gene2go`` when given, as the GO files built from it would make it, else that of
        the data folder's GO files, unknown when they are absent (nothing is downloaded)."""
        names = [GENE2GO_FILE] + ([ESSENTIAL_GENES_FILE] if self.default_pert_graph else [])
        absent = [name for name in names if download.local_go_file(name, self.data_path) is None]
        if absent:
            local = screen_check.GoVocabulary(None, f"{self.data_path} lacks {', '.join(absent)}, which processing "
                                                    "downloads; give the data folder that holds the GO files, or a "
                                                    "GO annotation (gears-ddp check --go-gene-sets FILE.gmt or "
                                                    "--go-annotation FILE.gaf)")
        else:
            local = screen_check.GoVocabulary(
                frozenset(graphs.pert_vocabulary(self.gene2go, self._pert_vocabulary_candidates(annotations))),
                f"the GO files of {self.data_path}")
        if gene2go is None:
            return local
        candidates = self._pert_vocabulary_candidates(annotations, annotated=sorted(gene2go))
        return screen_check.GoVocabulary(frozenset(graphs.pert_vocabulary(gene2go, candidates)), origin, local)

    def ensure_go_inputs(self, archive=None) -> None:
        """Have every Gene Ontology file this PertData will read (from the local ``archive``
        or downloaded, if absent), or fail at once naming all that are missing."""
        names = [GENE2GO_FILE]
        if self.default_pert_graph:
            names += [ESSENTIAL_GENES_FILE, GO_EDGES_NAME]
        download.ensure_go_files(names, self.data_path, archive)

    def _pert_vocabulary_candidates(self, adata, annotated: list[str] | None = None) -> list[str]:
        """Genes that may form the perturbation vocabulary, by the constructor's choice; for
        the default graph, the list of ``data_path``, or ``annotated`` when given (GO files
        built from an annotation list every annotated gene)."""
        if self.gene_set_path is not None:
            return list(io.read_pickle(self.gene_set_path, "perturbation gene set"))
        if not self.default_pert_graph:
            perturbed = {g for c in adata.obs["condition"].astype(str).unique() for g in condition_genes(c)}
            return list(adata.var["gene_name"].astype(str)) + sorted(perturbed)
        if annotated is not None:
            return annotated
        path = download.ensure_go_file(ESSENTIAL_GENES_FILE, self.data_path)
        return list(io.read_pickle(path, "default perturbation gene list"))

    def _cells_in_vocabulary(self, adata: anndata.AnnData, name: str, drop_unannotated: bool = True,
                             go_annotation: dict | None = None) -> np.ndarray:
        """Set the perturbation vocabulary, of the data folder's GO files or of those
        ``go_annotation`` will make; returns which cells it can represent. The others'
        conditions are dropped with a warning naming them, or (``drop_unannotated=False``)
        refused naming their genes and the ways to keep them (``go_coverage``)."""
        if go_annotation is None:
            self.pert_names = graphs.pert_vocabulary(self.gene2go, self._pert_vocabulary_candidates(adata))
        else:
            self.pert_names = graphs.pert_vocabulary(
                go_annotation, self._pert_vocabulary_candidates(adata, annotated=sorted(go_annotation)))
        self.node_map_pert = {g: i for i, g in enumerate(self.pert_names)}
        conditions, codes = coded_conditions(adata.obs["condition"], f"dataset {name!r} obs['condition']")
        coverage = go_coverage(dict(zip(conditions, np.bincount(codes, minlength=len(conditions)).tolist())),
                               self.node_map_pert)
        logger.info("dataset %s: %d of %d perturbed genes are in the perturbation vocabulary (genes with GO "
                    "annotations)", name, len(coverage.perturbed) - len(coverage.outside), len(coverage.perturbed))
        problems = coverage_problems(coverage, name, self.data_path, drop_unannotated)
        refuse(problems, f"dataset {name!r}")
        for warning in problems:
            logger.warning("%s", warning)
        return np.isin(np.asarray(conditions, dtype=object), coverage.kept)[codes]

    def _use_dataset(self, data, folder: Path, keep: np.ndarray) -> None:
        """Build the cell table of the cells ``keep`` of ``data`` (an AnnData, or the parts of
        an h5ad file), the expression mapped or in memory."""
        self.dataset_name = folder.name
        self.dataset_path = str(folder)
        if self.expression_storage == "mapped":
            values, path, digest = mapped_expression(folder, data.X, keep, self.expression_dtype)
            expression, mapped_from = as_tensor(values), str(path)
        else:  # the digest of values in memory is computed when first asked for (CellTable.identity)
            expression, mapped_from, digest = _in_memory(data.X, keep, self.expression_dtype), None, None
        self.var, self.uns = data.var.copy(), dict(data.uns)
        self.cells = _cell_table(data.obs, keep, self.uns, self.var.index, self.node_map_pert, expression, mapped_from)
        self.cells.expression_digest = digest
        self._adata = None  # built from the h5ad when first asked for (the cells' names cost memory)
        self.gene_names = self.var["gene_name"]
        self.node_map = {g: i for i, g in enumerate(self.gene_names)}
        self.split = self.set2conditions = self.subgroup = self.dataloader = None
        logger.info("dataset %s: %d cells, %d genes, %d conditions, perturbation vocabulary of %d genes",
                    self.dataset_name, self.cells.n_cells, len(self.var), len(self.cells.conditions),
                    len(self.pert_names))

    @property
    def adata(self) -> anndata.AnnData | None:
        """The dataset's cells as an AnnData whose ``X`` views the expression, with the ``obs``
        table of ``perturb_processed.h5ad``. Built on first use: training needs only the cell
        table and the condition tables, and a million cells' names alone take tens of MB."""
        if self._adata is None and self.cells is not None:
            obs = io.read_obs(Path(self.dataset_path) / io.PROCESSED_FILE)
            keep = obs["condition"].astype(str).isin(self.cells.conditions).to_numpy()
            self._adata = _view(self.cells.expression, _kept(obs, keep), self.var, self.uns)
        return self._adata

    @property
    def ctrl_adata(self) -> anndata.AnnData:
        """The control cells (a view of ``adata``)."""
        return self.adata[self.adata.obs["condition"] == CONTROL]

    def get_pert_idx(self, condition: str) -> list[int]:
        """Indices of a condition's perturbed genes in the perturbation vocabulary."""
        return [self.node_map_pert[g] for g in condition_genes(condition)]

    # ------------------------------------------------------------------ splits
    def prepare_split(self, split: str = "simulation", seed: int = 1, train_gene_set_size: float = 0.75,
                      combo_seen2_train_frac: float = 0.75, combo_single_split_test_set_fraction: float = 0.1,
                      test_perts=None, only_test_set_perts: bool = False, test_pert_genes=None,
                      split_dict_path=None) -> None:
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
        self._require_data()
        refuse(split_option_problems(split, seed, train_gene_set_size=train_gene_set_size,
                                     combo_seen2_train_frac=combo_seen2_train_frac,
                                     combo_single_split_test_set_fraction=combo_single_split_test_set_fraction),
               "prepare_split")
        self.split, self.seed, self.train_gene_set_size, self.subgroup = split, seed, train_gene_set_size, None
        required = sets_of_split(split)
        if split == "custom":
            sets = read_custom_split(split_dict_path)
            check_split_sets(sets, self.cells.conditions, required, f"custom split file {split_dict_path}")
            self.set2conditions = sets
            return

        test_perts = _gene_list(test_perts)
        test_pert_genes = _gene_list(test_pert_genes)
        split_path = Path(self.dataset_path) / "splits" / (
            f"{self.dataset_name}_{split}_{seed}_{train_gene_set_size}"
            + (f"_{'_'.join(test_perts)}" if test_perts else "") + ".pkl")
        subgroup_path = split_path.with_name(split_path.stem + "_subgroup.pkl")
        settings = {"split": split, "seed": seed, "train_gene_set_size": train_gene_set_size,
                    "combo_seen2_train_frac": combo_seen2_train_frac,
                    "combo_single_split_test_set_fraction": combo_single_split_test_set_fraction,
                    "test_perts": test_perts, "only_test_set_perts": only_test_set_perts,
                    "test_pert_genes": test_pert_genes}
        other_settings = cache_settings.differences(split_path, settings) if split_path.exists() else []
        if other_settings:
            logger.info("cached split %s was built with other settings (%s): building it again",
                        split_path, "; ".join(other_settings))
        if split_path.exists() and not other_settings:
            logger.info("using cached split %s", split_path)
            sets = {k: [str(c) for c in v] for k, v in io.read_pickle(split_path, "cached split").items()}
            check_split_sets(sets, self.cells.conditions, required,
                             f"cached split {split_path} (delete it if the data changed)")
            if split == "simulation":
                self.subgroup = io.read_pickle(subgroup_path, "cached split subgroups")
        else:
            result = split_conditions(self.cells.conditions, split, seed, train_gene_set_size,
                                      combo_seen2_train_frac, combo_single_split_test_set_fraction,
                                      test_perts, only_test_set_perts, test_pert_genes)
            sets = result.set2conditions
            check_split_sets(sets, self.cells.conditions, required, f"split {split!r} with seed {seed}")
            cache_settings.forget(split_path)
            io.write_pickle(sets, split_path)
            if result.subgroup is not None:
                io.write_pickle(result.subgroup, subgroup_path)
                self.subgroup = result.subgroup
            cache_settings.write_settings(split_path, settings)
            logger.info("saved split to %s", split_path)
        self.set2conditions = sets
        logger.info("split %s (seed %s): %s conditions", split, seed,
                    {name: len(conds) for name, conds in sets.items()})
        if self.subgroup is not None:
            logger.info("test composition: %s",
                        {name: len(conds) for name, conds in self.subgroup["test_subgroup"].items()})

    # ------------------------------------------------------------------ loaders
    def _set2cells(self) -> dict[str, torch.Tensor]:
        """Cell indices of each set the split defines (control excluded from a ``no_split`` test)."""
        if self.set2conditions is None:
            raise RuntimeError("call prepare_split before asking for loaders or graphs")
        names = sets_of_split(self.split)
        out = {}
        for name in names:
            conditions = self.set2conditions[name]
            if self.split == "no_split":
                conditions = [c for c in conditions if c != CONTROL]
            out[name] = self.cells.cells_of(conditions)
        return out

    def get_dataloader(self, batch_size: int, test_batch_size: int | None = None, seed: int = 0,
                       resample_controls: bool = False, num_workers: int = 0) -> dict:
        """Loaders for one process: ``{'train_loader', 'val_loader', 'test_loader'}`` (the sets
        the split defines), also stored as ``self.dataloader``.

        ``seed`` fixes the shuffling and the control cell paired with each perturbed cell;
        ``resample_controls=True`` draws new control partners for training every epoch
        (call ``loader.set_epoch(epoch)``).
        """
        return self.get_dataloader_distributed(batch_size, test_batch_size, world_size=1, rank=0,
                                               num_workers=num_workers, seed=seed,
                                               resample_controls=resample_controls)

    def get_dataloader_distributed(self, batch_size: int, test_batch_size: int | None = None,
                                   world_size: int = 1, rank: int = 0, num_workers: int = 0,
                                   pin_memory: bool = False, seed: int = 0,
                                   resample_controls: bool = False) -> dict:
        """Loaders for rank ``rank`` of ``world_size``: train shuffled as ``DistributedSampler``
        shuffles (``drop_last``; call ``set_epoch``), val/test as contiguous shards that cover
        every cell exactly once across ranks.

        ``num_workers`` defaults to 0 because a batch is one in-memory gather; worker
        processes would only add copies between processes.
        """
        self.dataloader = build_loaders(self.cells, self._set2cells(), batch_size, test_batch_size or batch_size,
                                        world_size, rank, seed, resample_controls, num_workers, pin_memory)
        self.loader_options = {"batch_size": batch_size, "test_batch_size": test_batch_size, "world_size": world_size,
                               "rank": rank, "num_workers": num_workers, "pin_memory": pin_memory, "seed": seed,
                               "resample_controls": resample_controls}
        return self.dataloader

    # ------------------------------------------------------------------ graphs
    def coexpression_graph(self, threshold: float = 0.4, k: int = 20) -> graphs.GeneGraph:
        """Gene co-expression graph from the training cells of control and single conditions
        (cached, except for custom splits, as the reference's
        ``<split>_<seed>_<size>_<threshold>_<k>_co_expression_network.csv``).

        Splits with other ``test_perts`` or other settings share that name, so the training
        conditions the graph was built from are written beside it (``cache_settings``): a
        cache built from other ones is built again; one without them is used on its name."""
        if self.set2conditions is None:
            raise RuntimeError("call prepare_split before building the co-expression graph")
        cache = Path(self.dataset_path) / (f"{self.split}_{self.seed}_{self.train_gene_set_size}_"
                                           f"{threshold}_{k}_co_expression_network.csv")
        conditions = [c for c in self.set2conditions["train"] if c == CONTROL or is_single(c)]
        settings = {"training_conditions_sha256": hashlib.sha256("\n".join(sorted(conditions)).encode()).hexdigest()}
        cached = self.split != "custom" and cache.exists()  # the name cannot tell custom split files apart
        if cached and not cache_settings.differences(cache, settings):
            edges = graphs.read_edge_list(cache, "co-expression graph", CACHE_ADVICE)
            return graphs.to_gene_graph(edges, self.node_map)
        if cached:
            logger.info("cached co-expression graph %s was built from other training conditions: building it again",
                        cache)
        rows = self.cells.cells_of(conditions).numpy()
        edges = graphs.coexpression_edge_list(self.cells.expression, rows, self.gene_names.to_numpy(), threshold, k)
        if self.split != "custom":
            _cache_edges(cache, edges, settings)
        return graphs.to_gene_graph(edges, self.node_map)

    def go_graph(self, k: int = 20) -> graphs.GeneGraph:
        """GO-similarity graph over the perturbation vocabulary (top ``k + 1`` sources per gene).

        From the GO edge list of the data folder (``go_essential_all.csv``, which holds every
        annotated gene's edges), the vocabulary's graph is cached in the dataset folder as
        ``go_graph_<k>.csv``, with the edge list's size and time and the vocabulary beside it
        (``cache_settings``): the ranks of a run and later runs read the vocabulary's edges,
        not the whole edge list again."""
        self._require_data()
        if self.default_pert_graph:
            source = download.ensure_go_file(GO_EDGES_NAME, self.data_path)
            cache = Path(self.dataset_path) / f"go_graph_{k}.csv"
            stat = source.stat()
            settings = {"go_edges_size": stat.st_size,
                        "go_edges_mtime_ns": stat.st_mtime_ns,
                        "vocabulary_sha256": hashlib.sha256("\n".join(self.pert_names).encode()).hexdigest()}
            if cache.exists() and cache_settings.settings_path(cache).is_file() \
                    and not cache_settings.differences(cache, settings):
                edges = graphs.read_edge_list(cache, "GO graph", CACHE_ADVICE)
            else:
                edges = graphs.go_edge_list(graphs.read_edge_list(source, "GO graph", GO_EDGES_ADVICE),
                                            self.pert_names, k)
                _cache_edges(cache, edges, settings)
            return graphs.to_gene_graph(edges, self.node_map_pert)
        cache = Path(self.dataset_path) / f"go_essential_{self.dataset_name}.csv"
        if cache.exists():
            edges = graphs.read_edge_list(cache, "GO graph", CACHE_ADVICE)
        else:
            edges = graphs.jaccard_edge_list(self.gene2go, self.pert_names)
            _cache_edges(cache, edges)
        return graphs.to_gene_graph(graphs.go_edge_list(edges, self.pert_names, k), self.node_map_pert)

    # ------------------------------------------------------------------ sharing
    def _require_data(self) -> None:
        if self.cells is None:
            raise RuntimeError("no dataset loaded: call load() or new_data_process() first")

    def share_memory_(self) -> "PertData":
        """Make the data shareable with spawned workers without a copy each: an expression
        kept in memory moves to shared memory (``/dev/shm``: containers need it large enough
        for the matrix, e.g. ``docker run --shm-size``), so ``adata.X`` is pointed at the
        shared copy and the private one is freed; a mapped expression is shared already."""
        self._require_data()
        self.cells.share_memory_()
        if self._adata is not None:
            self._adata.X = self.cells.expression.numpy()
        return self

    def __getstate__(self) -> dict:
        """Pickle without the loaders and without the per-cell AnnData (a process that
        unpickles it builds it from the h5ad if it asks for ``adata``)."""
        return {**self.__dict__, "dataloader": None, "loader_options": None, "_adata": None}


SPLIT_OPTIONS = tuple(name for name in inspect.signature(PertData.prepare_split).parameters if name != "self")
SPLIT_DEFAULTS = {name: parameter.default for name, parameter in
                  inspect.signature(PertData.prepare_split).parameters.items() if name in SPLIT_OPTIONS}


def _split_request(options: dict) -> dict:
    """``prepare_split``'s options for a split to check: ``options`` (names checked) over its
    defaults, the gene and condition lists as ``prepare_split`` reads them."""
    unknown = sorted(set(options) - set(SPLIT_OPTIONS))
    if unknown:
        raise ValueError(f"unknown split option(s) {unknown}; prepare_split's options: {', '.join(SPLIT_OPTIONS)}")
    request = {**SPLIT_DEFAULTS, **options}
    return {**request, "test_perts": _gene_list(request["test_perts"]),
            "test_pert_genes": _gene_list(request["test_pert_genes"])}


def _cache_edges(cache: Path, edges, settings: dict | None = None) -> None:
    """Write the edge list ``edges`` to the CSV file ``cache`` atomically, with the
    ``settings`` it was built with beside it (``cache_settings``), if any."""
    cache_settings.forget(cache)
    with io.atomic_path(cache) as tmp:
        graphs.write_edge_list(edges, tmp)
    if settings is not None:
        cache_settings.write_settings(cache, settings)


def read_processed_expression(adata: anndata.AnnData, de: bool = True,
                              source: str = "the AnnData") -> processing.ExpressionReading:
    """Add the processed columns to the validated ``adata`` (``processing.validate_annotations``)
    and read its expression, a block of cells at a time: checked, and, with ``de``, summed for
    the DE ranking and the gene sets (``write_processed_dataset`` writes them)."""
    processing.prepare_for_reading(adata, de)
    return processing.read_expression(adata, source, de)


def write_processed_dataset(adata: anndata.AnnData, path: Path, reading: processing.ExpressionReading) -> None:
    """Add the DE ranking and the gene sets of ``reading`` (``read_processed_expression`` of
    ``adata``) and write ``adata`` as the processed file ``path`` (atomically; a backed one
    by copying its file, never reading its expression into memory). ``clear_stale_caches``
    then deletes what an earlier version of the data left in the folder."""
    processing.add_de_entries(adata, reading)
    io.write_h5ad(adata, path)


def write_normalized_dataset(annotations: anndata.AnnData, path: Path, blocks, dtype, de: bool = True,
                             source: str = "the AnnData") -> None:
    """Process and write the processed file ``path`` from a screen's ``annotations`` (an
    AnnData without ``X``, validated) and its expression, which ``blocks`` gives a block of
    cells at a time (``(first cell, CSR block)``: ``normalization.normalized_blocks``), as
    values of ``dtype``. ``clear_stale_caches`` then deletes what an earlier version of the
    data left in the folder.

    The blocks are read once: checked, summed for the DE ranking and the gene sets (``de``)
    and appended to the file as they come, so the expression is never in memory whole. The
    file is written atomically: nothing is left of it when a check fails."""
    processing.prepare_for_reading(annotations, de)
    reading = processing.ExpressionReading(annotations.obs, annotations.n_vars, de)
    with io.h5ad_by_blocks(path, annotations, dtype) as expression:
        for start, block in blocks:
            reading.add(start, block)
            expression.append(block)
        reading.check.finish(source)
        processing.add_de_entries(annotations, reading)


def clear_stale_caches(adata: anndata.AnnData, folder: Path) -> None:
    """Delete the split and graph caches of an earlier version of the dataset just written
    to ``folder``."""
    splits = folder / "splits"
    stale = list(splits.glob("*.pkl")) + list(splits.glob(f"*{cache_settings.SUFFIX}")) \
        + list(folder.glob("*_co_expression_network*")) + list(folder.glob("go_essential_*.csv"))
    for path in stale:
        path.unlink()
    logger.info("wrote %s (%d cells x %d genes)%s", folder / io.PROCESSED_FILE, adata.n_obs, adata.n_vars,
                f"; removed {len(stale)} cached split/graph files of earlier data" if stale else "")


def _condition_tables(conditions: list[str], condition_names: dict, uns: dict, var_names: pd.Index,
                      node_map_pert: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-condition perturbed-gene indices (C x 2) and top-20 DE gene indices (C x 20), -1 padded.

    DE indices are the positions of the condition's 20 top-ranked genes, in gene order (as
    the reference stores them); all -1 for control or when DE genes were not computed.
    """
    pert_idx = torch.full((len(conditions), MAX_PERTURBED_GENES), -1, dtype=torch.long)
    de_idx = torch.full((len(conditions), N_DE_GENES), -1, dtype=torch.long)
    for code, condition in enumerate(conditions):
        genes = condition_genes(condition)
        pert_idx[code, :len(genes)] = torch.tensor([node_map_pert[g] for g in genes], dtype=torch.long)
        if condition != CONTROL:
            top = processing.top_de_positions(uns, var_names, condition_names[condition])
            de_idx[code, :len(top)] = torch.from_numpy(top)
    return pert_idx, de_idx


def _gene_list(value) -> list[str] | None:
    """A list of names given as a list or as the published package's ``'_'``-joined string."""
    if value is None:
        return None
    return value.split("_") if isinstance(value, str) else [str(name) for name in value]


def _in_memory(matrix, keep: np.ndarray, dtype: str) -> torch.Tensor:
    """The rows ``keep`` of ``matrix`` as a dense tensor in memory."""
    rows = np.flatnonzero(keep)
    matrix = matrix[rows] if len(rows) < len(keep) else matrix[:]
    dense = matrix.toarray() if sp.issparse(matrix) else np.asarray(matrix)
    return torch.from_numpy(np.ascontiguousarray(dense, dtype=np.dtype(dtype)))


def _kept(obs: pd.DataFrame, keep: np.ndarray) -> pd.DataFrame:
    """The rows ``keep`` of ``obs``, without categories that no longer occur."""
    obs = obs.iloc[np.flatnonzero(keep)].copy() if not keep.all() else obs.copy()
    for column in obs.columns:
        if isinstance(obs[column].dtype, pd.CategoricalDtype):
            obs[column] = obs[column].cat.remove_unused_categories()
    return obs


def _cell_table(obs: pd.DataFrame, keep: np.ndarray, uns: dict, var_names: pd.Index, node_map_pert: dict,
                expression: torch.Tensor, mapped_from: str | None) -> CellTable:
    """The kept cells as a ``CellTable`` over ``expression``."""
    kept = obs.iloc[np.flatnonzero(keep)] if not keep.all() else obs
    conditions, codes = coded_conditions(kept["condition"])
    first_cells = np.unique(codes, return_index=True)[1]  # codes number the conditions in order of first cell
    names = dict(zip(conditions, kept["condition_name"].iloc[first_cells].astype(str)))
    pert_idx, de_idx = _condition_tables(conditions, names, uns, var_names, node_map_pert)
    return CellTable(expression, torch.from_numpy(codes), conditions, pert_idx, de_idx,
                     [names[c] for c in conditions], mapped_from)


def _view(expression: torch.Tensor, obs: pd.DataFrame, var: pd.DataFrame, uns: dict) -> anndata.AnnData:
    """An AnnData whose ``X`` views ``expression``."""
    return anndata.AnnData(X=expression.numpy(), obs=obs, var=var.copy(), uns=uns)
