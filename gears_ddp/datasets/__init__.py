"""Built-in datasets that need no download: a real screen shipped with the package
(Papalexi et al. 2021, raw counts and the GO gene sets its model reads), the synthetic
Perturb-seq generator and the writer of a complete data folder.

May import: ``data``.
"""

from gears_ddp.datasets.real_screen import papalexi2021, papalexi2021_go_gene_sets, write_papalexi2021_dataset
from gears_ddp.datasets.synthetic import PRESETS, SyntheticPerturbSeq, make_synthetic_perturb_seq, preset
from gears_ddp.datasets.synthetic_folder import (
    read_ground_truth,
    read_true_means,
    write_synthetic_dataset,
    write_synthetic_screen,
)

__all__ = [
    "PRESETS",
    "SyntheticPerturbSeq",
    "make_synthetic_perturb_seq",
    "papalexi2021",
    "papalexi2021_go_gene_sets",
    "preset",
    "read_ground_truth",
    "read_true_means",
    "write_papalexi2021_dataset",
    "write_synthetic_dataset",
    "write_synthetic_screen",
]
