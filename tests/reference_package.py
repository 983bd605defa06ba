"""Access to the published GEARS (``cell-gears``) for parity tests.

CI installs it (a test-only extra) and sets GEARS_DDP_REQUIRE_REFERENCE=1, so a parity test
fails there instead of skipping when the package cannot be imported.
"""

import contextlib
import io
import os
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"  # the stand-in is shared with bench_screen.py


def import_reference(module: str = "gears", runs_data_code: bool = False):
    """Import a module of the published package quietly, or skip / fail as configured.

    ``runs_data_code``: the test runs the published package's data code, which fails under
    pandas 3 (``harness.published.data_code_runs``). There the test cannot compare, and
    skips or fails as for a missing package."""
    if runs_data_code:
        _harness_importable()
        import pandas as pd
        from harness.published import data_code_runs

        if not data_code_runs():
            reason = f"the published GEARS's data code fails under pandas {pd.__version__} (it needs pandas < 3)"
            if os.environ.get("GEARS_DDP_REQUIRE_REFERENCE") == "1":
                raise RuntimeError(f"GEARS_DDP_REQUIRE_REFERENCE is set, but {reason}")
            pytest.skip(reason)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return __import__(module, fromlist=["_"])
    except ImportError as err:
        if os.environ.get("GEARS_DDP_REQUIRE_REFERENCE") == "1":
            raise
        pytest.skip(f"published GEARS not importable: {err}")


def published_gears(gears):
    """The benchmarks' stand-in for the published ``GEARS`` (its ``predict`` and ``GI_predict``
    bound to ``gears``'s data and weights: ``benchmarks/harness/published.py``), skipped or
    failed as configured when the published package cannot be imported."""
    import_reference("gears.gears")
    _harness_importable()
    from harness.published import published_gears as stand_in

    return stand_in(gears)


def _harness_importable() -> None:
    """Put benchmarks/ on the path, so that its ``harness`` package imports."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
