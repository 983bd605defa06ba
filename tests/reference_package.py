"""Access to the published GEARS (``cell-gears``) for parity tests.

CI installs it (a test-only extra) and sets GEARS_DDP_REQUIRE_REFERENCE=1, so a parity test
fails there instead of skipping when the package cannot be imported.
"""
import contextlib
import io
import os

import pytest


def import_reference(module: str = "gears"):
    """Import a module of the published package quietly, or skip / fail as configured."""
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return __import__(module, fromlist=["_"])
    except ImportError as err:
        if os.environ.get("GEARS_DDP_REQUIRE_REFERENCE") == "1":
            raise
        pytest.skip(f"published GEARS not importable: {err}")
