"""Built-in datasets that need no download: the synthetic Perturb-seq generator and the
writer of a complete data folder.

May import: ``data``.
"""
from gears_ddp.datasets.folder import read_true_means, write_synthetic_dataset, write_synthetic_screen
from gears_ddp.datasets.synthetic import PRESETS, SyntheticPerturbSeq, make_synthetic_perturb_seq, preset

__all__ = ["PRESETS", "SyntheticPerturbSeq", "make_synthetic_perturb_seq", "preset", "read_true_means",
           "write_synthetic_dataset", "write_synthetic_screen"]
