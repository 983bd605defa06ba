"""What importing the library costs: every ``gears-ddp`` command pays it before it does
anything (``gears-ddp --help`` included)."""

import subprocess
import sys

SLOW_TO_IMPORT = ("torch._dynamo", "sympy", "scipy.stats", "anndata", "zarr")  # (scanpy: tests/test_raw_screens.py)


def test_importing_the_library_imports_neither_the_compiler_nor_scipy_stats_nor_anndata():
    """torch's compiler (with sympy) and scipy.stats take seconds to import; only
    ``compile: True``, the DE test, the replicates' intervals and torch's optimisers use them,
    and they import them when they run. anndata (with zarr, 0.15 s) is imported where an h5ad
    file is read or written or an AnnData built: a spawned rank, which trains on the tensors
    its parent shares, never does."""
    code = (
        "import sys, gears_ddp, gears_ddp.cli, gears_ddp.train_distributed, gears_ddp.launching.rank_training, "
        "gears_ddp.distributed.replicates, gears_ddp.training.recipe\n"
        f"print(sorted({{name.split('.')[0] if name.startswith('sympy') else name for name in sys.modules "
        f"if name in {SLOW_TO_IMPORT!r} or name.startswith('sympy.')}}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
