"""A tiny raw Perturb-seq AnnData and GO files for fast data-layer tests, and copies of a
data folder as another machine would hold them."""

import os
import shutil
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import scipy.sparse as sp

from gears_ddp.data import go_files

GENES = [f"G{i}" for i in range(40)]
SINGLES = [f"G{i}+ctrl" for i in range(10)]
COMBOS = ["G0+G1", "G2+G3", "G4+G5", "G6+G7", "G8+G9", "G0+G5", "G1+G6", "G2+G9"]


def make_raw(n_ctrl=120, cells_per_condition=12, seed=0, singles=SINGLES, combos=COMBOS):
    """Controls plus every single and combo condition (of ``GENES``), shuffled, log-normalised
    Poisson counts.

    Perturbing gene Gi lowers its own expression so DE genes are meaningful; genes in
    blocks of five share a per-cell program, so the co-expression graph has real edges.
    """
    rng = np.random.default_rng(seed)
    conditions = ["ctrl"] * n_ctrl + [c for c in list(singles) + list(combos) for _ in range(cells_per_condition)]
    rng.shuffle(conditions)
    programs = rng.normal(scale=0.8, size=(len(conditions), len(GENES) // 5))
    rates = 3.0 * np.exp(np.repeat(programs, 5, axis=1))
    for row, condition in enumerate(conditions):
        for gene in condition.split("+"):
            if gene != "ctrl":
                rates[row, GENES.index(gene)] = 0.2
    counts = rng.poisson(rates).astype(np.float32)
    x = np.log1p(counts / counts.sum(1, keepdims=True) * 1e4).astype(np.float32)
    obs = pd.DataFrame(
        {"condition": conditions, "cell_type": "toy"}, index=[f"cell{i}" for i in range(len(conditions))]
    )
    return anndata.AnnData(X=sp.csr_matrix(x), obs=obs, var=pd.DataFrame({"gene_name": GENES}, index=GENES))


def write_go_files(data_path, genes=GENES):
    """gene2go, the default vocabulary list and the GO edge list, as the published files."""
    gene2go = {g: {f"GO:{i % 6}", f"GO:{100 + i % 4}", f"GO:{200 + i}"} for i, g in enumerate(genes)}
    go_files.write_go_files(data_path, gene2go, list(genes), overwrite=True)
    return gene2go


def copy_data_folder(source, target, mtime_ns: int):
    """A copy of the data folder ``source`` at ``target`` whose files all carry the time
    ``mtime_ns``, as a copy to another machine has (cp, scp and downloads set new times)."""
    shutil.copytree(source, target)
    for path in Path(target).rglob("*"):
        os.utime(path, ns=(mtime_ns, mtime_ns))
    return Path(target)


def change_one_value(h5ad, cell: int = 0, gene: int = 0, by: float = 0.5):
    """Add ``by`` to one expression value of an h5ad file (rewritten in place, kept sparse)."""
    adata = anndata.read_h5ad(h5ad)
    x = adata.X.toarray()
    x[cell, gene] += by
    adata.X = sp.csr_matrix(x)
    adata.write_h5ad(h5ad)
