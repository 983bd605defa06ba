"""Processing reads a screen a block of cells at a time, normalising, summing and writing each
block as it comes: the result is scanpy's on the whole matrix, the same whatever the blocks,
and bad counts are refused in one line with nothing left behind."""
import anndata
import h5py
import numpy as np
import pandas as pd
import scipy.sparse as sp

from gears_ddp.data import io


def test_a_matrix_written_in_blocks_widens_its_row_pointers_when_int32_no_longer_holds_them(tmp_path, monkeypatch):
    monkeypatch.setattr(io.CsrRows, "INT32_VALUES", 50)  # as if int32 held 50 values
    blocks = [sp.random(10, 8, density=0.5, format="csr", dtype=np.float32, random_state=seed) for seed in range(4)]
    cells = anndata.AnnData(obs=pd.DataFrame(index=[f"c{i}" for i in range(40)]),
                            var=pd.DataFrame(index=[f"g{i}" for i in range(8)]))
    path = tmp_path / "blocks.h5ad"
    with io.h5ad_by_blocks(path, cells, np.float32) as expression:
        expression.append(blocks[0])
        assert expression.group["indptr"].dtype == np.int32
        for block in blocks[1:]:
            expression.append(block)
        cells.uns["written"] = "after the blocks"
    with h5py.File(path) as handle:
        assert handle["X/indptr"].dtype == np.int64
    written = anndata.read_h5ad(path)
    np.testing.assert_array_equal(written.X.toarray(), sp.vstack(blocks).toarray())
    assert written.uns["written"] == "after the blocks"
