"""Packaging for gears_ddp: fast single- and multi-device training of GEARS."""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = {}
exec((HERE / "gears_ddp" / "_version.py").read_text(encoding="utf-8"), VERSION)

setup(
    name="gears_ddp",
    version=VERSION["__version__"],
    description=(
        "GEARS (perturbation-response prediction) with tensor-backed data, "
        "vectorised training and DistributedDataParallel"
    ),
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["gears_ddp", "gears_ddp.*"]),
    # the real screen of gears-ddp demo, its GO gene sets, and their sources and licences
    package_data={"gears_ddp.datasets": ["papalexi2021/*.h5ad", "papalexi2021/*.gmt.gz", "papalexi2021/NOTICE.md"]},
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.4",  # fused Adam on CPU (training/optimization.py)
        "anndata>=0.11",  # anndata.io (data/io.py)
        "numpy>=1.24",
        "scipy>=1.11",  # scipy.stats.false_discovery_control (evaluation/calibration.py)
        "pandas>=1.5",
        "tqdm>=4.60",
        "joblib>=1.3",  # cpu_count: the cores a process may use (affinity, cgroup quota)
        "matplotlib>=3.7",  # figure legends placed outside the axes (loc="outside ...")
        "pyyaml>=6",  # run configuration files (gears-ddp train --config)
        # screens as they come (gears-ddp process --n-top-genes): scanpy's seurat_v3 loess, imported
        # by gears_ddp.data.highly_variable only, never by the training processes
        "scikit-misc>=0.3",
        "optuna>=4.0",  # sweeps (gears_ddp.sweeps): TPE, the median pruner, journal-file and database studies
    ],
    entry_points={"console_scripts": ["gears-ddp = gears_ddp.cli:command"]},
    extras_require={
        # scanpy, torch-geometric, scikit-learn and dcor: the tests compare gears_ddp's processing
        # (normalisation, highly variable genes, DE ranking), graph operator and genetic-interaction
        # scores with theirs
        "test": [
            "scanpy>=1.11",
            "pytest>=7",
            "pytest-timeout>=2",
            "pytest-xdist>=3",
            "cell-gears==0.1.2",
            "torch-geometric>=2.4",
            "scikit-learn>=1.0",
            "dcor>=0.6",
            "networkx",
            "cell-eval",
            "psycopg[binary]",  # a sweep's study in a real PostgreSQL server (tests/test_sweeps.py)
            # the linter, formatter and type checker CI runs (ruff.toml, mypy.ini), pinned so that a
            # new release cannot fail a build whose code did not change
            "ruff==0.17.6",
            "mypy==2.4.1",
        ],
        "wandb": ["wandb"],
    },
)
