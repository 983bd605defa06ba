"""The small dataset behind tests/data/reference_splits.json, shared by the test and its generator.

Only the ordered list of conditions matters to a split, so the dataset is two cells per
condition, cells in the order of ``CONDITIONS``; the perturbation vocabulary (genes with
GO terms) leaves out ``UNANNOTATED_GENE``, whose conditions both implementations drop.
"""

import pickle
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import scipy.sparse as sp

REFERENCE_FILE = Path(__file__).parent / "data" / "reference_splits.json"
UNANNOTATED_GENE = "NOGO1"
CASES = [  # (split, seed, train_gene_set_size)
    ("simulation", 1, 0.75),
    ("simulation", 2, 0.75),
    ("simulation", 7, 0.6),
    ("simulation_single", 1, 0.75),
    ("simulation_single", 3, 0.75),
    ("combo_seen0", 1, 0.75),
    ("combo_seen0", 2, 0.75),
    ("combo_seen1", 1, 0.75),
    ("combo_seen1", 2, 0.75),
    ("combo_seen2", 1, 0.75),
    ("combo_seen2", 2, 0.75),
    ("single", 1, 0.75),
    ("single", 2, 0.75),
    ("no_test", 1, 0.75),
    ("no_split", 1, 0.75),
]


def _conditions():
    """A Norman-like mix: singles (some written 'ctrl+A'), combos, control, one unannotated gene."""
    rng = np.random.default_rng(2023)
    genes = [f"PG{i:02d}" for i in range(48)]
    singles = [f"ctrl+{g}" if i % 9 == 0 else f"{g}+ctrl" for i, g in enumerate(genes[:44])]
    pairs = {tuple(sorted(rng.choice(genes, 2, replace=False))) for _ in range(70)}
    combos = [f"{a}+{b}" for a, b in sorted(pairs)]
    extra = [f"{UNANNOTATED_GENE}+ctrl", f"PG01+{UNANNOTATED_GENE}"]
    conditions = singles + combos + extra
    rng.shuffle(conditions)
    return ["ctrl"] + conditions[:30] + ["ctrl"] + conditions[30:]


CONDITIONS = _conditions()
GENES = sorted({g for c in CONDITIONS for g in c.split("+") if g not in ("ctrl", UNANNOTATED_GENE)})


def conditions_for(split):
    """The conditions of the dataset a case runs on: singles only for ``simulation_single``
    (the reference asserts that), all of CONDITIONS otherwise."""
    if split == "simulation_single":
        return [c for c in CONDITIONS if c == "ctrl" or "ctrl" in c.split("+")]
    return CONDITIONS


def make_raw_adata(conditions=CONDITIONS):
    """Two cells per entry of ``conditions`` (control entries: 20 cells), in that order."""
    cells = [c for c in conditions for _ in range(20 if c == "ctrl" else 2)]
    rng = np.random.default_rng(0)
    x = np.log1p(rng.poisson(2.0, size=(len(cells), len(GENES)))).astype(np.float32)
    obs = pd.DataFrame({"condition": cells, "cell_type": "toy"}, index=[f"cell{i}" for i in range(len(cells))])
    var = pd.DataFrame({"gene_name": GENES}, index=GENES)
    return anndata.AnnData(X=sp.csr_matrix(x), obs=obs, var=var)


def write_go_files(data_path):
    """GO inputs both implementations read locally: every gene but UNANNOTATED_GENE annotated."""
    data_path = Path(data_path)
    data_path.mkdir(parents=True, exist_ok=True)
    gene2go = {g: {f"GO:{i % 7}", f"GO:{10 + i % 5}"} for i, g in enumerate(GENES)}
    with open(data_path / "gene2go_all.pkl", "wb") as f:
        pickle.dump(gene2go, f)
    with open(data_path / "essential_all_data_pert_genes.pkl", "wb") as f:
        pickle.dump(GENES + [UNANNOTATED_GENE], f)
    (data_path / "go_essential_all").mkdir(exist_ok=True)  # the GO graph's edge list (unused by splits)
    pd.DataFrame({"source": GENES, "target": GENES, "importance": 1.0}).to_csv(
        data_path / "go_essential_all" / "go_essential_all.csv", index=False
    )


def case_key(split, seed, size):
    return f"{split}/{seed}/{size}"
