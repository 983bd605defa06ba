"""Screens as users have them: their own perturbation column, raw counts normalised as
scanpy normalises them, highly variable genes, GO files from GMT gene sets, and a clear
one-line refusal of each bad input; GO tables with a header row or without."""

import gzip
import logging
import re
import subprocess
import sys
from pathlib import Path

import anndata
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import toy_data
from test_bad_input import _refused_in_one_line, _refused_naming

from gears_ddp import PertData
from gears_ddp.data import io
from gears_ddp.data.gene_sets import read_gene_sets
from gears_ddp.data.go_files import GO_EDGES_NAME, read_annotation, write_go_files
from gears_ddp.data.raw_screens import gears_condition


@pytest.mark.parametrize(
    "label,separator,condition",
    [
        ("NT", None, "ctrl"),
        ("FEV", None, "FEV+ctrl"),
        ("FEV_SAMD1", "_", "FEV+SAMD1"),
        ("FEV_NT", "_", "FEV+ctrl"),
        (" FEV + SAMD1 ", "+", "FEV+SAMD1"),
        ("FEV+ctrl", "+", "FEV+ctrl"),
        ("NT_NT", "_", "ctrl"),
    ],
)
def test_a_label_becomes_a_gears_condition(label, separator, condition):
    assert gears_condition(label, "NT", separator) == condition


@pytest.mark.parametrize(
    "label,separator,message",
    [
        ("A_B_C", "_", "names 3 genes"),
        ("A+B", None, "holds '+'"),
        ("A_A", "_", "names gene 'A' twice"),
        ("A_", "_", "empty gene name"),
    ],
)
def test_a_label_that_is_no_gears_condition_is_named(label, separator, message):
    with pytest.raises(ValueError, match=f"label {label!r}.*{message}".replace("+", r"\+")):
        gears_condition(label, "NT", separator)


def _own_columns(adata, separator="_", control="NT"):
    """The toy screen as a screen comes: its perturbations in obs['target'] (genes joined by
    ``separator``, controls ``control``), no condition or cell_type column."""
    labels = [
        control if c == "ctrl" else separator.join(g for g in c.split("+") if g != "ctrl")
        for c in adata.obs["condition"].astype(str)
    ]
    screen = adata.copy()
    screen.obs = pd.DataFrame({"target": labels}, index=adata.obs_names)
    return screen


def _counts(seed=0, **sizes):
    """The toy screen with raw counts in X (and its conditions in obs)."""
    adata = toy_data.make_raw(seed=seed, **sizes)
    rng = np.random.default_rng(seed)
    depth = rng.integers(500, 5000, size=(adata.n_obs, 1))
    adata.X = sp.csr_matrix(rng.poisson(np.expm1(adata.X.toarray()) / 1e4 * depth).astype(np.float32))
    return adata


@pytest.mark.parametrize("separator", ["_", "+"])
def test_a_screen_in_its_own_column_gets_the_gears_conditions_and_one_cell_type(data_root, separator, caplog):
    raw = toy_data.make_raw()
    screen = _own_columns(raw, separator)
    pert_data = PertData(data_root)
    with caplog.at_level(logging.INFO, logger="gears_ddp"):
        pert_data.new_data_process(
            "own", screen, perturbation_column="target", control_label="NT", combination_separator=separator
        )
    processed = pert_data.adata.obs
    assert processed["condition"].astype(str).tolist() == raw.obs["condition"].astype(str).tolist()
    assert set(processed["cell_type"].astype(str)) == {"own"}
    assert "one cell type 'own'" in caplog.text


def test_the_screen_s_own_column_errors_name_what_there_is(data_root):
    screen = _own_columns(toy_data.make_raw())
    pert_data = PertData(data_root)
    with pytest.raises(ValueError, match=r"no obs column 'perturbation'; its columns: target$"):
        pert_data.new_data_process("own", screen, perturbation_column="perturbation", control_label="NT")
    counts = screen.obs["target"].value_counts()
    with pytest.raises(ValueError, match="control label 'non-targeting'; its labels, most frequent first: ") as info:
        pert_data.new_data_process("own", screen, perturbation_column="target", control_label="non-targeting")
    shown = re.findall(r"(\S+) \((\d+)\)", str(info.value))
    assert len(shown) == 10 and str(info.value).endswith(f"and {len(counts) - 10} more")
    assert [int(n) for _, n in shown] == sorted((int(n) for _, n in shown), reverse=True)
    assert all(counts[label] == int(n) for label, n in shown) and shown[0][0] == counts.index[0]
    with pytest.raises(ValueError, match="needs the label of its control cells"):
        pert_data.new_data_process("own", screen, perturbation_column="target")
    assert not (data_root / "own").exists()


def test_normalisation_is_scanpy_s_and_leaves_the_counts_as_they_were(data_root):
    import scanpy as sc

    counts = _counts()
    expected = counts.copy()
    sc.pp.normalize_total(expected, target_sum=1e4)
    sc.pp.log1p(expected)
    pert_data = PertData(data_root, expression_storage="memory")
    pert_data.new_data_process("counts", counts, normalize=True)
    assert np.allclose(pert_data.adata.X, expected.X.toarray(), rtol=1e-6, atol=1e-6)
    written = anndata.read_h5ad(data_root / "counts" / io.PROCESSED_FILE)
    assert np.allclose(written.X.toarray(), expected.X.toarray(), rtol=1e-6, atol=1e-6)
    assert np.array_equal(counts.X.toarray(), _counts().X.toarray())  # the caller's counts are untouched


def test_highly_variable_genes_are_scanpy_s_on_the_counts_with_every_perturbed_gene(data_root):
    import scanpy as sc

    counts = _counts()
    perturbed = {f"G{i}" for i in range(10)}
    chosen = sc.pp.highly_variable_genes(counts.copy(), n_top_genes=8, flavor="seurat_v3", inplace=False)
    top = set(counts.var_names[chosen["highly_variable"].to_numpy()])
    assert not perturbed <= top  # some perturbed gene is kept only because it is perturbed
    expected = counts.copy()
    sc.pp.normalize_total(expected, target_sum=1e4)  # over all genes, before the others are left out
    sc.pp.log1p(expected)
    expected = expected[:, expected.var_names.isin(top | perturbed)]
    pert_data = PertData(data_root, expression_storage="memory")
    pert_data.new_data_process("hvg", counts, normalize=True, n_top_genes=8)
    assert list(pert_data.var.index) == list(expected.var_names)
    assert np.allclose(pert_data.adata.X, expected.X.toarray(), rtol=1e-6, atol=1e-6)


def test_counts_are_refused_without_normalisation_and_checked_with_it(data_root):
    counts = _counts()
    with pytest.raises(ValueError, match=r"holds raw counts .*normalize=True \(gears-ddp process --normalize\)"):
        PertData(data_root).new_data_process("counts", counts)
    with pytest.raises(ValueError, match="n_top_genes chooses genes on the raw counts"):
        PertData(data_root).new_data_process("counts", counts, n_top_genes=5)
    x = counts.X.toarray()
    x[2, 3] = -1
    counts.X = sp.csr_matrix(x)
    with pytest.raises(ValueError, match="1 negative values .*raw counts are never negative"):
        PertData(data_root).new_data_process("counts", counts, normalize=True)
    assert not (data_root / "counts").exists()


def test_unannotated_genes_are_named_and_dropped_only_when_asked(data_root):
    raw = toy_data.make_raw()
    toy_data.write_go_files(data_root, genes=[g for g in toy_data.GENES if g != "G3"])
    with pytest.raises(
        ValueError,
        match=r"1 perturbed gene\(s\) are outside the perturbation vocabulary .*: G3, "
        rf"in {int(raw.obs['condition'].str.contains('G3').sum())} cells; "
        r"drop those cells \(.*--drop-unannotated\)",
    ):
        PertData(data_root).new_data_process("toy", raw, drop_unannotated=False)
    pert_data = PertData(data_root)
    pert_data.new_data_process("toy", raw, drop_unannotated=True)
    assert not [c for c in pert_data.cells.conditions if "G3" in c]


def test_a_screen_processed_then_loaded_in_one_process_says_what_it_drops_once(data_root, caplog, monkeypatch):
    # as gears-ddp demo does: processed into the folder as a path, then loaded by the folder as
    # a user writes it (./data); every later saying of the same is a DEBUG record
    toy_data.write_go_files(data_root, genes=[g for g in toy_data.GENES if g != "G3"])
    monkeypatch.chdir(data_root.parent)
    with caplog.at_level(logging.DEBUG, logger="gears_ddp"):
        PertData(Path(data_root.name)).new_data_process("toy", toy_data.make_raw(), drop_unannotated=True)
        PertData(f"./{data_root.name}").load(data_path=f"./{data_root.name}/toy")
    dropped = [record for record in caplog.records if record.getMessage().startswith("dropping ")]
    assert [record.levelno for record in dropped] == [logging.WARNING, logging.DEBUG]
    assert f"(no GO annotation in {data_root.name}: G3)" in dropped[0].getMessage()
    assert dropped[0].filename == "vocabulary.py"  # the record names where it was said, not log_once
    assert dropped[0].getMessage() == dropped[1].getMessage()
    found = [record for record in caplog.records if record.getMessage().startswith("found local copy")]
    assert found and {record.getMessage() for record in found if record.levelno == logging.INFO} == {
        record.getMessage() for record in found
    }
    said = [record.getMessage() for record in found if record.levelno == logging.INFO]
    assert len(said) == len(set(said))


# ----------------------------------------------------------------------------- GMT gene sets

GMT = (
    "spindle assembly (GO:0090307)\t\tG0\tG1\tG2\n"
    "HALLMARK_SOMETHING\thttp://example.org/set\tG1\tG3,1.0\n"
    "\n"
    "another set (GO:0000002)\t\tG0\tG3\n"
)


@pytest.mark.parametrize("compress", [False, True])
def test_gene_sets_become_terms_per_gene(tmp_path, compress):
    path = tmp_path / ("sets.gmt.gz" if compress else "sets.gmt")
    path.write_bytes(gzip.compress(GMT.encode()) if compress else GMT.encode())
    assert read_gene_sets(path) == {
        "G0": {"GO:0090307", "GO:0000002"},
        "G1": {"GO:0090307", "HALLMARK_SOMETHING"},
        "G2": {"GO:0090307"},
        "G3": {"HALLMARK_SOMETHING", "GO:0000002"},
    }


def test_go_files_from_gene_sets_are_those_from_the_same_annotation(tmp_path):
    """A GMT file and a GAF-path table holding the same gene-term pairs give the same GO files."""
    gmt = tmp_path / "sets.gmt"
    gmt.write_text(GMT)
    gene2go = read_gene_sets(gmt)
    table = tmp_path / "pairs.tsv"
    table.write_text(
        "gene\tterm\n"
        + "".join(f"{g}\t{t}\n" for g, terms in gene2go.items() for t in sorted(terms) if t.startswith("GO:"))
    )
    write_go_files(tmp_path / "from_gmt", {g: {t for t in ts if t.startswith("GO:")} for g, ts in gene2go.items()})
    write_go_files(tmp_path / "from_table", read_annotation(table))
    edges = f"{GO_EDGES_NAME}/{GO_EDGES_NAME}.csv"
    assert (tmp_path / "from_gmt" / edges).read_text() == (tmp_path / "from_table" / edges).read_text()
    pairs = pd.read_csv(tmp_path / "from_gmt" / edges)
    assert ((pairs["source"] == "G0") & (pairs["target"] == "G3")).any()  # G0 {2 terms}, G3 {1 of them}: 0.5


@pytest.mark.parametrize("separator", ["\t", ","], ids=["tab", "comma"])
@pytest.mark.parametrize("header", ["gene{}go_id\n", ""], ids=["with a header row", "without one"])
def test_a_go_table_is_read_whole_with_its_header_row_or_without_one(tmp_path, header, separator):
    pairs = [("FEV", "GO:0000001"), ("FEV", "GO:0000002"), ("SAMD1", "GO:0000003")]
    table = tmp_path / "pairs.txt"
    table.write_text(header.format(separator) + "".join(f"{gene}{separator}{term}\n" for gene, term in pairs))
    assert read_annotation(table) == {"FEV": {"GO:0000001", "GO:0000002"}, "SAMD1": {"GO:0000003"}}


def test_bad_gene_set_files_are_refused_in_one_line(tmp_path, capsys):
    raw = tmp_path / "raw.h5ad"
    toy_data.make_raw().write_h5ad(raw)
    data = ["process", "--adata", str(raw), "--data-path", str(tmp_path / "data"), "--name", "toy"]
    bad_line = tmp_path / "bad.gmt"
    bad_line.write_text(GMT + "a name without genes\t\n")
    _refused_in_one_line(capsys, [*data, "--go-gene-sets", str(bad_line)], f"{bad_line} line 5 is no gene set")
    binary = tmp_path / "binary.gmt"
    binary.write_bytes(bytes(range(256)) * 4)
    _refused_in_one_line(capsys, [*data, "--go-gene-sets", str(binary)], f"cannot read the gene set file {binary}")
    _refused_in_one_line(capsys, [*data, "--go-gene-sets", str(tmp_path / "absent.gmt")], "absent.gmt does not exist")
    assert not (tmp_path / "data").exists()


def test_the_process_command_names_every_problem_of_a_bad_screen_at_once(tmp_path, capsys):
    screen = _own_columns(_counts())
    raw = tmp_path / "screen.h5ad"
    screen.write_h5ad(raw)
    data_path = tmp_path / "data"
    toy_data.write_go_files(data_path)
    data = ["process", "--adata", str(raw), "--data-path", str(data_path), "--name", "own"]
    own = ["--perturbation-column", "target", "--control-label", "NT", "--combination-separator", "_"]
    counts = ("holds raw counts", "--normalize")  # the counts are not normalised in any of these
    _refused_naming(
        capsys,
        [*data, "--perturbation-column", "gene", "--control-label", "NT"],
        ("no obs column 'gene'; its columns: target",),
        counts,
    )
    _refused_naming(
        capsys,
        [*data, *own[:2], "--control-label", "control"],
        ("no cell of obs['target'] has the control label 'control'", "NT (120)"),
        counts,
    )
    _refused_in_one_line(capsys, [*data, *own], *counts)
    assert not (data_path / "own").exists()
    assert main_ok([*data, *own, "--normalize"], capsys).startswith("dataset own: ")


def main_ok(argv, capsys) -> str:
    from gears_ddp.cli import main

    assert main(argv) == 0
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_importing_the_package_and_its_training_parts_does_not_import_scanpy():
    """scanpy takes seconds to import; every DDP rank imports the training code."""
    code = (
        "import sys, pkgutil, importlib, gears_ddp\n"
        "for module in pkgutil.walk_packages(gears_ddp.__path__, 'gears_ddp.'):\n"
        "    if not module.name.endswith('__main__'):\n"
        "        importlib.import_module(module.name)\n"
        "assert 'gears_ddp.training.recipe' in sys.modules and 'gears_ddp.data.normalization' in sys.modules\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] == 'scanpy'))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_log_normalised_screen_in_its_own_column_is_processed_from_its_backed_file(tmp_path, capsys):
    raw = toy_data.make_raw()
    path = tmp_path / "screen.h5ad"
    _own_columns(raw, "+", "control").write_h5ad(path)
    data_path = tmp_path / "data"
    toy_data.write_go_files(data_path)
    line = main_ok(
        [
            "process",
            "--adata",
            str(path),
            "--data-path",
            str(data_path),
            "--name",
            "own",
            "--perturbation-column",
            "target",
            "--control-label",
            "control",
            "--combination-separator",
            "+",
        ],
        capsys,
    )
    assert line.endswith("10 of 10 perturbed genes have GO terms")
    written = anndata.read_h5ad(data_path / "own" / io.PROCESSED_FILE)
    assert written.obs["condition"].astype(str).tolist() == raw.obs["condition"].astype(str).tolist()
    assert np.array_equal(written.X.toarray(), raw.X.toarray())
