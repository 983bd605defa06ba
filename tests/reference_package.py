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


def published_gears(gears):
    """The published ``GEARS.predict`` and ``GEARS.GI_predict``, unchanged, bound to a stand-in
    for the published ``GEARS`` that holds ``gears``'s data (an AnnData with CSR expression,
    as the published predict reads it), perturbation vocabulary and weights (in the
    published ``GEARS_Model``). Building the published ``GEARS`` itself needs its own
    ``PertData``; these two methods read only the attributes set here."""
    import types

    import anndata
    import scipy.sparse as sp

    published = import_reference("gears.gears")
    model = import_reference("gears.model").GEARS_Model(dict(gears.config, device="cpu"))
    model.load_state_dict({k: v.cpu() for k, v in gears.best_model.state_dict().items()})
    cells = gears.pert_data.cells
    obs = {"condition": [cells.conditions[code] for code in cells.condition_codes.tolist()]}
    adata = anndata.AnnData(X=sp.csr_matrix(cells.expression.float().numpy()), obs=obs, var=gears.pert_data.var)
    stand_in = types.SimpleNamespace(adata=adata, pert_list=list(gears.pert_list), config=model.args,
                                     best_model=model, device="cpu", saved_pred={}, saved_logvar_sum={})
    stand_in.predict = types.MethodType(published.GEARS.predict, stand_in)
    stand_in.GI_predict = types.MethodType(published.GEARS.GI_predict, stand_in)
    return stand_in
