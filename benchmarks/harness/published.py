"""The published GEARS (``cell-gears``) beside gears_ddp: whether it is installed, what it
needs to run on current scipy, a stand-in that runs its ``predict`` and ``GI_predict`` on a
gears_ddp model's data and weights, and its test figures read as gears_ddp reports them."""

from __future__ import annotations

import importlib.util
import math

from harness.settings import SUBGROUPS


def data_code_runs() -> bool:
    """Whether the published package's data code (its ``PertData`` processing and loading,
    its gene graphs) runs with the installed pandas: not under pandas 3, as cell-gears 0.1.2
    reads a Series by position (``obs['condition_name'][0]``) and counts on
    ``groupby().apply`` keeping the grouping column (``get_similarity_network``)."""
    import pandas as pd

    return int(pd.__version__.split(".")[0]) < 3


def reference_available() -> bool:
    """Whether the published package is installed and its data code runs here
    (``data_code_runs``). Found, not imported: importing it takes 10-25 s on 2 cores
    (torch_geometric, scanpy) and seeds torch, and the benchmark's child that runs it imports
    it anyway; an installed package that cannot import fails that child, with its error,
    rather than leaving the comparison out without a word."""
    return data_code_runs() and importlib.util.find_spec("gears") is not None


def patch_csr_indexing() -> None:
    """Let scipy CSR matrices be indexed by pandas Series / Index (the published package's
    ``GEARS.__init__`` does so, which current scipy refuses): keys become numpy arrays.
    Only for a process that runs the published package."""
    import pandas as pd
    import scipy.sparse as sp

    def plain(key):
        return key.to_numpy() if isinstance(key, (pd.Series, pd.Index)) else key

    for cls in (sp.csr_matrix, sp.csr_array):
        original = cls.__getitem__

        def getitem(self, key, _original=original):
            key = tuple(plain(k) for k in key) if isinstance(key, tuple) else plain(key)
            return _original(self, key)

        cls.__getitem__ = getitem


def published_test_figures(pert_data, result: dict, overall: dict, compute_metrics, deeper_analysis) -> dict:
    """``mse`` and ``mse_de`` (from ``compute_metrics``'s ``overall``) and the mean
    ``pearson_delta`` of ``deeper_analysis``, over all test conditions and per subgroup
    (NaN for a subgroup without conditions), of a published-package evaluation result; the
    published functions are passed in, so that importing this module imports no package."""
    import numpy as np

    per_condition = deeper_analysis(pert_data.adata, result)
    pearson = {c: m["pearson_delta"] for c, m in per_condition.items() if "pearson_delta" in m}
    subgroups = pert_data.subgroup["test_subgroup"]

    def mean_of(conditions):
        values = [pearson[c] for c in conditions if c in pearson]
        return float(np.mean(values)) if values else math.nan

    return {
        "mse": float(overall["mse"]),
        "mse_de": float(overall["mse_de"]),
        "pearson_delta": mean_of(pearson),
        "subgroups": {name: mean_of(subgroups.get(name, [])) for name in SUBGROUPS},
    }


def published_gears(gears):
    """The published ``GEARS.predict`` and ``GEARS.GI_predict``, unchanged, bound to a stand-in
    for the published ``GEARS`` that holds ``gears``'s data (an AnnData with CSR expression,
    as the published predict reads it), perturbation vocabulary and weights (in the
    published ``GEARS_Model``). Building the published ``GEARS`` itself needs its own
    ``PertData``; these two methods read only the attributes set here."""
    import contextlib
    import io
    import types

    import anndata
    import scipy.sparse as sp

    with contextlib.redirect_stdout(io.StringIO()):  # the published package prints on import
        import gears.gears as published
        from gears.model import GEARS_Model

    model = GEARS_Model(dict(gears.config, device="cpu"))
    model.load_state_dict({k: v.cpu() for k, v in gears.best_model.state_dict().items()})
    cells = gears.pert_data.cells
    obs = {"condition": [cells.conditions[code] for code in cells.condition_codes.tolist()]}
    adata = anndata.AnnData(X=sp.csr_matrix(cells.expression.float().numpy()), obs=obs, var=gears.pert_data.var)
    stand_in = types.SimpleNamespace(
        adata=adata,
        pert_list=list(gears.pert_list),
        config=model.args,
        best_model=model,
        device="cpu",
        saved_pred={},
        saved_logvar_sum={},
    )
    stand_in.predict = types.MethodType(published.GEARS.predict, stand_in)
    stand_in.GI_predict = types.MethodType(published.GEARS.GI_predict, stand_in)
    return stand_in
