"""A screen checked whole before it is processed (``gears-ddp check``, ``PertData.check_screen``):
the real and synthetic screens pass, each broken screen is named with its fix, a screen with
many problems gets all of them in one run, and ``gears-ddp process`` refuses it the same way;
the cells that processing drops (genes without GO terms) are not held against the screen."""

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

from gears_ddp import GEARS, PertData
from gears_ddp.cli import main
from gears_ddp.data import io
from gears_ddp.data.gene_sets import read_gene_sets
from gears_ddp.data.processing import RANK_KEY
from gears_ddp.data.screen_report import ScreenProblems
from gears_ddp.datasets import papalexi2021, papalexi2021_go_gene_sets, write_synthetic_dataset, write_synthetic_screen
from gears_ddp.datasets.real_screen import (
    CONTROL_LABEL,
    PERTURBATION_COLUMN,
    SCREEN_FILE,
    packaged_file,
    write_papalexi2021_dataset,
)
from gears_ddp.datasets.real_screen import (
    NAME as REAL_NAME,
)

SMALL_SYNTHETIC = {
    "n_genes": 120,
    "n_modules": 6,
    "n_perturbed_genes": 16,
    "n_combos": 16,
    "cells_per_condition": 20,
    "n_control_cells": 200,
}


def _check(capsys, argv) -> tuple[int, str]:
    """The exit status of ``gears-ddp check`` and its report (stdout)."""
    status = main(["check", *argv])
    return status, capsys.readouterr().out


def _split_line(report: str, split: str, seed: int) -> str:
    return next(line for line in report.splitlines() if line.startswith(f"  split {split}, seed {seed}: "))


def _set_sizes(pert_data: PertData) -> str:
    """What the check says of a split, from the sets ``prepare_split`` made."""
    sizes = ", ".join(
        f"{name} {sum(c != 'ctrl' for c in pert_data.set2conditions[name])}"
        for name in ("train", "val", "test")
        if name in pert_data.set2conditions
    )
    groups = "".join(
        f"; {where.split('_')[0]}: " + ", ".join(f"{g} {len(m)}" for g, m in subgroups.items() if m)
        for where, subgroups in (pert_data.subgroup or {}).items()
    )
    return f"{sizes} perturbations{groups}"


# ----------------------------------------------------------------------------- the screens that train


def test_the_packaged_real_screen_would_train_as_it_is_processed_and_split(tmp_path, capsys):
    data = tmp_path / "data"
    screen = [
        "--adata",
        str(packaged_file(SCREEN_FILE)),
        "--data-path",
        str(data),
        "--name",
        REAL_NAME,
        "--perturbation-column",
        PERTURBATION_COLUMN,
        "--control-label",
        CONTROL_LABEL,
        "--normalize",
        "--go-gene-sets",
        str(papalexi2021_go_gene_sets()),
    ]
    status, report = _check(capsys, [*screen, "--drop-unannotated", "--split-seeds", "1", "2", "3"])
    assert status == 0, report
    assert not data.exists()  # nothing written: not even the data folder
    raw = papalexi2021()
    targets = raw.obs[PERTURBATION_COLUMN].astype(str)
    unannotated = sorted(set(targets) - {CONTROL_LABEL} - set(read_gene_sets(papalexi2021_go_gene_sets())))
    assert unannotated  # MARCH8, spelt MARCHF8 in the gene sets
    assert f"{targets.nunique() - 1} perturbations from obs['target_gene']" in report
    assert (
        f"{targets.nunique() - 1 - len(unannotated)} of {targets.nunique() - 1} perturbed genes have GO terms" in report
    )
    assert f"{int((targets == CONTROL_LABEL).sum())} control cells" in report
    dropped = next(line for line in report.splitlines() if "dropping" in line)
    assert all(gene in dropped for gene in unannotated) and "--go-gene-sets" in dropped
    assert "(raw counts)" in report and "scales each cell to 1e+04 counts, then takes log1p" in report
    assert report.rstrip().splitlines()[-1].startswith("it would train")

    folder = write_papalexi2021_dataset(tmp_path / "processed")  # what processing and splitting make of it
    for seed in (1, 2, 3):
        pert_data = PertData(tmp_path / "processed")
        pert_data.load(data_path=folder)
        pert_data.prepare_split("simulation", seed=seed)
        assert _split_line(report, "simulation", seed).endswith(_set_sizes(pert_data))

    status, report = _check(capsys, screen)  # gears-ddp process refuses unannotated genes unless told to drop them
    assert status == 2
    assert f"are outside the perturbation vocabulary (no GO annotation in {papalexi2021_go_gene_sets()})" in report
    assert "--drop-unannotated" in report and report.rstrip().endswith("it would not train: 1 problem to fix")


def test_the_synthetic_data_would_train_and_its_splits_are_those_prepare_split_makes(tmp_path, capsys):
    folder = write_synthetic_dataset(tmp_path, name="synthetic", **SMALL_SYNTHETIC)
    config = tmp_path / "run.yaml"
    config.write_text(
        f"pert_data_path: {tmp_path}\ndataset_name: synthetic\nsplit_config: {{split: simulation}}\n"
        "replicates: {split_seeds: [2, 5]}\n"
    )
    status, report = _check(capsys, ["--config", str(config)])
    assert status == 0, report
    assert "two-gene) and the control" in report and "taken as log-normalised" in report
    pert_data = PertData(tmp_path)
    pert_data.load(data_path=folder)
    for seed in (2, 5):
        pert_data.prepare_split("simulation", seed=seed)
        assert _split_line(report, "simulation", seed).endswith(_set_sizes(pert_data))
    assert "seed 1:" not in report  # the replicates' split seeds, not split_config's
    status, report = _check(
        capsys,
        ["--data-path", str(tmp_path), "--name", "synthetic", "--split", "combo_seen1", "single", "--split-seeds", "3"],
    )
    assert status == 0, report
    for split in ("combo_seen1", "single"):
        pert_data.prepare_split(split, seed=3)
        assert _split_line(report, split, 3).endswith(_set_sizes(pert_data))


def test_a_synthetic_screen_as_it_comes_would_train(tmp_path, capsys):
    path = write_synthetic_screen(tmp_path, name="screen", layout="screen", **SMALL_SYNTHETIC)
    status, report = _check(
        capsys,
        [
            "--adata",
            str(path),
            "--data-path",
            str(tmp_path),
            "--perturbation-column",
            "target_gene",
            "--control-label",
            "non-targeting",
            "--normalize",
            "--combination-separator",
            "+",
        ],
    )
    assert status == 0, report
    labels = anndata.read_h5ad(path, backed="r").obs["target_gene"]
    assert f"{labels.nunique() - 1} perturbations from obs['target_gene'] (" in report and "(raw counts)" in report


def test_a_processed_dataset_takes_no_option_of_a_raw_screen_and_must_be_there(tmp_path, capsys):
    _refused_in_one_line_check(
        capsys,
        ["--data-path", str(tmp_path), "--name", "absent"],
        f"no processed dataset at {tmp_path / 'absent' / io.PROCESSED_FILE}",
    )
    _refused_in_one_line_check(
        capsys,
        ["--data-path", str(tmp_path), "--name", "x", "--normalize"],
        "--normalize read a screen as it comes: give it with --adata",
    )
    _refused_in_one_line_check(capsys, ["--name", "x"], "give the data folder (--data-path")


def _refused_in_one_line_check(capsys, argv, text):
    assert main(["check", *argv]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and text in err.strip().splitlines()[-1], err


# ----------------------------------------------------------------------------- broken screens, one problem each


def _own_column(adata, separator="_", control="NT"):
    """The screen with its perturbations in obs['target'] (genes joined by ``separator``),
    as screens come: no condition column."""
    labels = [
        control if c == "ctrl" else separator.join(g for g in c.split("+") if g != "ctrl")
        for c in adata.obs["condition"].astype(str)
    ]
    adata.obs = pd.DataFrame({"target": labels, "cell_type": "toy"}, index=adata.obs_names)
    return adata


def _conditions(adata, change):
    """The screen with ``change`` (conditions -> conditions) applied to obs['condition']."""
    conditions = adata.obs["condition"].astype(str).to_numpy().copy()
    adata.obs["condition"] = change(conditions)
    return adata


def _set(array, where, value):
    array[where] = value
    return array


def _with(adata, **parts):
    """The screen with its ``obs`` or ``var`` replaced."""
    for name, value in parts.items():
        setattr(adata, name, value)
    return adata


def _first_control(conditions):
    return np.flatnonzero(conditions == "ctrl")[0]


def _x(adata, change):
    x = adata.X.toarray()
    adata.X = sp.csr_matrix(change(x))
    return adata


def _counts(adata):
    return _x(adata, lambda x: np.round(np.expm1(x)))


def _renamed(adata, axis, first, second):
    names = list(getattr(adata, axis))
    names[second] = names[first]
    setattr(adata, axis, names)
    return adata


def _var_gene_ids(adata):
    """Ensembl-like ids in var['gene_name'], the symbols in var['symbol'] (as some screens have them)."""
    adata.var["symbol"] = adata.var["gene_name"]
    adata.var["gene_name"] = [f"ENSG{i:011d}" for i in range(adata.n_vars)]
    return adata


def _split_conditions(adata, conditions):
    return adata[adata.obs["condition"].isin(["ctrl", *conditions]).to_numpy()].copy()


BROKEN = {  # problem: (the screen from the toy one, check_screen's options, topic, texts of the problem and fix, stops)
    "no condition column": (
        lambda a: _with(a, obs=a.obs.drop(columns="condition")),
        {},
        "columns",
        ["lacks required column(s) obs['condition']", "--perturbation-column", "its obs columns are cell_type"],
        True,
    ),
    "perturbation column absent": (
        _own_column,
        {"perturbation_column": "gene", "control_label": "NT"},
        "condition column",
        ["no obs column 'gene'; its columns: target, cell_type"],
        True,
    ),
    "control label absent": (
        _own_column,
        {"perturbation_column": "target", "control_label": "non-targeting", "combination_separator": "_"},
        "control label",
        ["no cell of obs['target'] has the control label 'non-targeting'", "its labels, most frequent first: NT (120)"],
        True,
    ),
    "label of three genes": (
        lambda a: _own_column(_conditions(a, lambda c: _set(c, _first_control(c), "G1+G2+G3"))),
        {"perturbation_column": "target", "control_label": "NT", "combination_separator": "_"},
        "conditions",
        ["label 'G1_G2_G3' names 3 genes; GEARS models one or two per cell"],
        True,
    ),
    "label with an unsplit +": (
        lambda a: _own_column(a, separator="+"),
        {"perturbation_column": "target", "control_label": "NT"},
        "conditions",
        ["holds '+'", "give '+' as the combination separator"],
        True,
    ),
    "malformed condition": (
        lambda a: _conditions(a, lambda c: _set(c, _first_control(c), " G1+ctrl")),
        {},
        "conditions",
        [
            "malformed condition strings",
            "' G1+ctrl': empty gene name or surrounding whitespace",
            "write each as 'ctrl', 'GENE+ctrl' or 'GENE1+GENE2'",
        ],
        True,
    ),
    "no control cells": (
        lambda a: a[a.obs["condition"] != "ctrl"].copy(),
        {},
        "control label",
        ["has no control cells", "--control-label"],
        True,
    ),
    "two cell types": (
        lambda a: _with(a, obs=a.obs.assign(cell_type=np.where(np.arange(a.n_obs) % 2, "A", "B"))),
        {},
        "cell type",
        ["has 2 cell types", "subset the AnnData first"],
        True,
    ),
    "perturbed genes not measured": (
        _var_gene_ids,
        {},
        "perturbed genes",
        [
            "10 perturbed gene(s) are not among the measured genes",
            "var['symbol'] holds 10 of the 10",
            "give var['gene_name'] the symbols the labels use",
        ],
        False,
    ),
    "a condition of one cell": (
        lambda a: _conditions(a, lambda c: _set(c, np.flatnonzero(c == "G8+ctrl")[1:], "ctrl")),
        {},
        "cells per condition",
        [
            "['G8+ctrl'] have fewer than two cells",
            "remove their cells from the screen (the h5ad given to gears-ddp process --adata",
            "skip_calc_de=True (Python only)",
        ],
        True,
    ),
    "a condition of few cells": (
        lambda a: _conditions(a, lambda c: _set(c, np.flatnonzero(c == "G8+ctrl")[4:], "ctrl")),
        {},
        "cells per condition",
        ["1 condition(s) have fewer than 10 cells: G8+ctrl (4)", "collect more, or remove them"],
        False,
    ),
    "raw counts not normalised": (
        _counts,
        {},
        "expression",
        ["holds raw counts", "gears-ddp process --normalize"],
        True,
    ),
    "normalised values given to normalisation": (
        lambda a: a,
        {"normalize": True},
        "expression",
        ["values that are not whole numbers, all at most", "log-transform them twice", "without normalisation"],
        True,
    ),
    "corrected counts given to normalisation": (  # fractional counts (ambient RNA removed): a warning only
        lambda a: _x(_counts(a), lambda x: x * 2.5 + 0.25 * (x > 0)),
        {"normalize": True},
        "expression",
        ["values that are not whole numbers: if it is normalised already", "process it without normalisation"],
        False,
    ),
    "negative values": (
        lambda a: _x(a, lambda x: _set(x, (3, 4), -1.0)),
        {},
        "expression",
        ["1 negative expression values", "normalise_total + log1p"],
        True,
    ),
    "n_top_genes without counts": (
        lambda a: a,
        {"n_top_genes": 5},
        "options",
        ["n_top_genes chooses genes on the raw counts", "normalize=True"],
        True,
    ),
    "repeated gene names": (
        lambda a: _with(a, var=a.var.assign(gene_name=["G0", *a.var["gene_name"][1:-1], "G0"])),
        {},
        "duplicates",
        ["var['gene_name'] repeats genes ['G0']", "keep one row per gene"],
        True,
    ),
    "repeated gene ids": (
        lambda a: _renamed(a, "var_names", 4, 5),
        {},
        "duplicates",
        ["var_names repeat gene ids G4", "adata.var_names_make_unique()"],
        True,
    ),
    "repeated cells": (
        lambda a: _renamed(a, "obs_names", 0, 1),
        {},
        "duplicates",
        ["obs_names repeat 1 cell name(s) (cell0)", "adata.obs_names_make_unique()"],
        False,
    ),
    "genes without GO terms": (
        lambda a: _conditions(a, lambda c: _set(c, c == "G9+ctrl", "NOGO+ctrl")),
        {"drop_unannotated": False},
        "GO terms",
        [
            "1 perturbed gene(s) are outside the perturbation vocabulary",
            "NOGO, in 12 cells",
            "--drop-unannotated",
            "--go-gene-sets FILE.gmt",
        ],
        True,
    ),
    "genes without GO terms, dropped": (
        lambda a: _conditions(a, lambda c: _set(c, c == "G9+ctrl", "NOGO+ctrl")),
        {},
        "GO terms",
        ["dropping 1 conditions", "NOGO+ctrl, 12 cells", "--go-annotation FILE.gaf"],
        False,
    ),
    "too few perturbations for the split": (
        lambda a: _split_conditions(a, ["G0+ctrl", "G1+ctrl"]),
        {"splits": [{}]},
        "split simulation, seed 1",
        [
            "split 'simulation' with seed 1 leaves the",
            "too few perturbations for this split",
            "(it has 2 perturbations)",
        ],
        True,
    ),
    "single genes for a combination split": (
        lambda a: _split_conditions(a, toy_data.SINGLES),
        {"splits": [{"split": "combo_seen2"}]},
        "split combo_seen2, seed 1",
        [
            "leaves the val and test set(s) without perturbations",
            "single-gene perturbations only",
            "use split 'simulation' or 'single'",
        ],
        True,
    ),
    "combinations for a single-gene split": (
        lambda a: a,
        {"splits": [{"split": "simulation_single"}]},
        "split simulation_single, seed 1",
        ["needs single perturbations only", "use 'simulation' instead"],
        True,
    ),
}


@pytest.mark.parametrize("problem", list(BROKEN))
def test_each_broken_screen_is_named_with_its_fix_and_nothing_else(problem, data_root):
    build, options, topic, texts, stops = BROKEN[problem]
    report = PertData(data_root).check_screen(build(toy_data.make_raw()), "toy", **{"splits": [], **options})
    named = [p for p in (report.stopping if stops else report.warnings) if p.topic == topic]
    assert named, str(report)
    assert all(text in named[0].text for text in texts), named[0].text
    if stops:  # that problem alone stops the screen
        assert {p.topic for p in report.stopping} == {topic}, str(report)
    else:  # a warning: the screen would still train
        assert report.would_train, str(report)


def test_a_split_seed_that_leaves_a_set_empty_is_told_the_seeds_that_do_not(data_root):
    screen = _split_conditions(toy_data.make_raw(), ["G0+ctrl", "G1+ctrl", "G0+G1", "G2+G3"])
    pert_data = PertData(data_root)
    refused = pert_data.check_screen(screen, "toy").stopping
    assert [p.topic for p in refused] == ["split simulation, seed 1"]
    seeds = [
        int(seed)
        for seed in refused[0]
        .text.split("split seeds that give every set perturbations: ")[1]
        .split(" (of")[0]
        .split(" and")[0]
        .split(", ")
    ]
    assert seeds and 1 not in seeds
    for seed in seeds:
        assert pert_data.check_screen(screen, "toy", splits=[{"seed": seed}]).would_train


def test_a_go_file_is_said_to_add_the_genes_it_covers(data_root):
    screen = toy_data.make_raw()
    toy_data.write_go_files(data_root, genes=[g for g in toy_data.GENES if g != "G3"])
    annotation = {gene: {"GO:1", "GO:2"} for gene in toy_data.GENES}
    report = PertData(data_root).check_screen(
        screen, "toy", drop_unannotated=False, go_annotation=annotation, go_annotation_origin="sets.gmt"
    )
    assert report.would_train, str(report)
    assert (
        "GO terms",
        "10 of 10 perturbed genes have GO terms in sets.gmt (a perturbation vocabulary of 40 genes)",
    ) in report.facts
    assert (
        "GO terms",
        f"sets.gmt adds 1 perturbed gene(s) that the GO files of {data_root} leave(s) out: G3",
    ) in report.facts
    assert not PertData(data_root).check_screen(screen, "toy", drop_unannotated=False).would_train


def test_the_check_changes_nothing_of_the_screen(data_root):
    screen = _own_column(_counts(toy_data.make_raw()))
    before = (screen.obs.copy(), screen.var.copy(), screen.X.copy())
    report = PertData(data_root).check_screen(
        screen, "toy", perturbation_column="target", control_label="NT", combination_separator="_", normalize=True
    )
    assert report.would_train, str(report)
    pd.testing.assert_frame_equal(screen.obs, before[0])
    pd.testing.assert_frame_equal(screen.var, before[1])
    assert (screen.X != before[2]).nnz == 0
    assert not (data_root / "toy").exists()


# ----------------------------------------------------------------------------- a screen with every problem at once


def _many_problems(path):
    """A screen with six problems that stop it: repeated gene ids, a label of three genes, a
    condition of one cell, a gene without GO terms (not dropped), raw counts not normalised,
    and too few perturbations for a combination split."""
    screen = _counts(toy_data.make_raw())
    screen = _conditions(screen, lambda c: _set(c, c == "G9+ctrl", "NOGO+ctrl"))
    screen = _conditions(screen, lambda c: _set(c, np.flatnonzero(c == "G8+ctrl")[1:], "ctrl"))
    screen = _own_column(_conditions(screen, lambda c: _set(c, _first_control(c), "G1+G2+G3")))
    _renamed(screen, "var_names", 4, 5)
    screen.write_h5ad(path)
    return ["--perturbation-column", "target", "--control-label", "NT", "--combination-separator", "_"]


MANY_PROBLEMS = [
    ("duplicates: ", "var_names repeat gene ids G4", "var_names_make_unique"),
    ("conditions: ", "label 'G1_G2_G3' names 3 genes"),
    ("cells per condition: ", "['G8+ctrl'] have fewer than two cells", "remove their cells"),
    ("GO terms: ", "NOGO, in 12 cells", "--drop-unannotated"),
    ("expression: ", "holds raw counts", "--normalize"),
]


def test_a_screen_with_many_problems_gets_them_all_in_one_run_with_exit_status_2(data_root):
    path = data_root / "screen.h5ad"
    own = _many_problems(path)
    command = [
        sys.executable,
        "-m",
        "gears_ddp",
        "check",
        "--adata",
        str(path),
        "--data-path",
        str(data_root),
        *own,
        "--split",
        "simulation",
        "combo_seen2",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    problems = MANY_PROBLEMS + [("split combo_seen2, seed 1: ", "leaves the val and test set(s) without perturbations")]
    listed = done.stdout.split("problems that stop it, each with its fix:\n")[1].splitlines()[:-1]
    assert len(listed) == len(problems), done.stdout
    for texts in problems:
        assert any(line.startswith(f"  - {texts[0]}") and all(t in line for t in texts[1:]) for line in listed), texts
    assert done.stdout.rstrip().endswith(f"it would not train: {len(problems)} problems to fix")


def test_process_refuses_the_same_screen_naming_every_problem_before_writing_anything(data_root, capsys):
    path = data_root / "screen.h5ad"
    own = _many_problems(path)
    _refused_naming(
        capsys,
        ["process", "--adata", str(path), "--data-path", str(data_root), "--name", "many", *own],
        *[texts[1:] for texts in MANY_PROBLEMS],
    )  # process splits nothing
    assert not (data_root / "many").exists()
    with pytest.raises(ScreenProblems) as refused:
        PertData(data_root).new_data_process(
            "many",
            anndata.read_h5ad(path),
            drop_unannotated=False,
            perturbation_column="target",
            control_label="NT",
            combination_separator="_",
        )
    assert [p.topic for p in refused.value.problems] == [texts[0].rstrip(": ") for texts in MANY_PROBLEMS]


# ----------------------------------------------------------------------------- empty screens


@pytest.mark.parametrize(
    "empty, what",
    [
        (lambda screen: screen[:, []], "has no genes (336 cells x 0 genes)"),
        (lambda screen: screen[[]], "has no cells (0 cells x 40 genes)"),
    ],
    ids=["no genes", "no cells"],
)
def test_a_screen_without_cells_or_genes_is_named_so_in_one_line_by_check_and_process(empty, what, data_root, capsys):
    path = data_root / "empty.h5ad"
    empty(_own_column(_counts(toy_data.make_raw()))).copy().write_h5ad(path)
    screen = [
        "--adata",
        str(path),
        "--data-path",
        str(data_root),
        "--perturbation-column",
        "target",
        "--control-label",
        "NT",
        "--combination-separator",
        "_",
        "--normalize",
    ]
    status, report = _check(capsys, screen)
    problems = [line for line in report.splitlines() if line.startswith("  - ")]
    assert status == 2 and len(problems) == 1, report
    assert problems[0].startswith(
        f"  - cells and genes: AnnData for dataset 'empty' {what}, so there is nothing to train on; "
    )
    _refused_in_one_line(capsys, ["process", *screen, "--name", "empty"], problems[0].split(": ", 1)[1])
    assert not (data_root / "empty").exists()


# ----------------------------------------------------------------------------- nothing written before the checks


def _files_and_folders(root) -> dict:
    """Every file (its bytes) and folder (None) under ``root``, by path."""
    return {path: path.read_bytes() if path.is_file() else None for path in sorted(root.rglob("*"))}


def _other_screens_folder(root):
    """A data folder holding another screen's GO files and its processed dataset."""
    toy_data.write_go_files(root, genes=toy_data.GENES[::-1])
    PertData(root).new_data_process("other", toy_data.make_raw(seed=3))
    return root


def _toy_process_argv(screen: Path, data: Path, tmp_path: Path) -> list[str]:
    """``gears-ddp process``'s options for a toy screen file as it comes (``_own_column``: its
    own column of perturbations, raw counts), its GO files built from gene sets written in
    ``tmp_path``, processed as dataset ``new`` into ``data``."""
    gene_sets = tmp_path / "go.gmt"
    gene_sets.write_text("".join(f"set{i}\t\t" + "\t".join(toy_data.GENES[i::4]) + "\n" for i in range(4)))
    return [
        "--adata",
        str(screen),
        "--data-path",
        str(data),
        "--name",
        "new",
        "--perturbation-column",
        "target",
        "--control-label",
        "NT",
        "--combination-separator",
        "_",
        "--normalize",
        "--go-gene-sets",
        str(gene_sets),
    ]


REFUSED_SCREENS = {  # the screen (from the toy one) and its options: refused before, or while, its counts are read
    "a label of three genes": (
        lambda a: _own_column(_counts(_conditions(a, lambda c: _set(c, _first_control(c), "G1+G2+G3"))))
    ),
    "no genes": (lambda a: _own_column(_counts(a))[:, []].copy()),
    "negative counts, met while they are written": (
        lambda a: _own_column(_x(_counts(a), lambda x: _set(x, (3, 4), -1.0)))
    ),
}


@pytest.mark.parametrize("problem", list(REFUSED_SCREENS))
def test_a_refused_process_leaves_every_byte_of_a_folder_of_other_go_files_as_it_was(problem, tmp_path, capsys):
    data = _other_screens_folder(tmp_path / "data")
    before = _files_and_folders(data)
    path = tmp_path / "screen.h5ad"
    REFUSED_SCREENS[problem](toy_data.make_raw()).write_h5ad(path)
    assert main(["process", *_toy_process_argv(path, data, tmp_path)]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert _files_and_folders(data) == before


def test_a_screen_processed_with_go_files_writes_them_all_or_none(tmp_path, monkeypatch):
    from gears_ddp.data import normalization
    from gears_ddp.data.go_files import go_file_paths

    data = _other_screens_folder(tmp_path / "data")
    before = _files_and_folders(data)
    annotation = {gene: {"GO:1", f"GO:{gene}"} for gene in toy_data.GENES}
    screen = {
        "perturbation_column": "target",
        "control_label": "NT",
        "combination_separator": "_",
        "normalize": True,
        "go_annotation": annotation,
    }
    blocks = normalization.normalized_blocks

    def interrupted(*args, **kwargs):  # the process is stopped once the first block of cells is written
        for block in blocks(*args, **kwargs):
            yield block
            raise KeyboardInterrupt

    monkeypatch.setattr(normalization, "normalized_blocks", interrupted)
    with pytest.raises(KeyboardInterrupt):
        PertData(data).new_data_process("new", _own_column(_counts(toy_data.make_raw())), **screen)
    assert _files_and_folders(data) == before  # the old GO files, no part of the new ones, no new folder
    monkeypatch.setattr(normalization, "normalized_blocks", blocks)
    pert_data = PertData(data)
    pert_data.new_data_process("new", _own_column(_counts(toy_data.make_raw())), **screen)
    assert io.read_pickle(go_file_paths(data)[0], "GO") == annotation == pert_data.gene2go
    assert io.read_pickle(go_file_paths(data)[1], "genes") == sorted(annotation)
    assert not list(data.rglob("*.tmp"))  # no temporary left
    assert (data / "new" / io.PROCESSED_FILE).is_file()


def test_without_go_files_the_go_terms_are_not_checked_and_nothing_is_downloaded(tmp_path, monkeypatch):
    from gears_ddp.data import download

    monkeypatch.setenv(download.DATAVERSE_URL_ENV, "http://127.0.0.1:9/api/access/datafile/")  # a closed port
    report = PertData(tmp_path / "data").check_screen(toy_data.make_raw(), "toy")
    assert report.would_train, str(report)
    [warning] = [p for p in report.warnings if p.topic == "GO terms"]
    assert "not checked" in warning.text and "lacks gene2go_all.pkl, essential_all_data_pert_genes.pkl" in warning.text
    assert "--go-gene-sets FILE.gmt" in warning.text
    assert not (tmp_path / "data").exists()


def test_a_screen_without_gene_names_is_named_not_failed_on(data_root):
    screen = toy_data.make_raw()
    del screen.var["gene_name"]
    report = PertData(data_root, default_pert_graph=False).check_screen(screen, "toy")
    assert [p.topic for p in report.stopping] == ["columns"] and "var['gene_name']" in report.stopping[0].text
    assert any(p.topic == "GO terms" and "once var['gene_name'] is there" in p.text for p in report.warnings)


# ----------------------------------------------------------------------------- cells that processing drops


def _one_cell_without_go_terms(screen):
    """The toy screen with one control cell perturbing NOGO, a gene without GO terms (and not
    measured), and G9's single-gene cells perturbing NOGO2, another."""
    screen = _conditions(screen, lambda c: _set(c, _first_control(c), "NOGO+ctrl"))
    return _conditions(screen, lambda c: _set(c, c == "G9+ctrl", "NOGO2+ctrl"))


def test_a_condition_of_one_cell_stops_the_screen_only_if_its_cells_are_kept(data_root, capsys):
    path = data_root / "screen.h5ad"
    _one_cell_without_go_terms(toy_data.make_raw()).write_h5ad(path)
    screen = ["--adata", str(path), "--data-path", str(data_root)]
    status, report = _check(capsys, [*screen, "--drop-unannotated"])
    assert status == 0 and "cells per condition:" not in report.split("\n  - ", 1)[-1], report
    status, report = _check(capsys, screen)  # without --drop-unannotated NOGO's cell is kept: both are named
    stopping = report.split("problems that stop it, each with its fix:\n")[1].splitlines()
    assert status == 2 and [line.split(":")[0] for line in stopping[:-1]] == ["  - cells per condition", "  - GO terms"]
    assert "['NOGO+ctrl'] have fewer than two cells" in stopping[0] and "(Python only)" in stopping[0]
    assert main(["process", *screen, "--name", "toy", "--drop-unannotated"]) == 0


@pytest.mark.parametrize("normalize", [False, True], ids=["log-normalised", "raw counts"])
def test_a_dropped_condition_of_one_cell_gets_no_de_genes_and_the_others_theirs(normalize, data_root):
    screen = _one_cell_without_go_terms(toy_data.make_raw())
    pert_data = PertData(data_root)
    pert_data.new_data_process("toy", _counts(screen) if normalize else screen, normalize=normalize)
    ranked = anndata.read_h5ad(data_root / "toy" / io.PROCESSED_FILE, backed="r").uns[RANK_KEY]
    assert "toy_NOGO2+ctrl_1+1" in ranked  # dropped, but of 12 cells: ranked, as before
    assert "toy_NOGO+ctrl_1+1" not in ranked and len(ranked) == len(toy_data.SINGLES) + len(toy_data.COMBOS)
    assert {"NOGO+ctrl", "NOGO2+ctrl"}.isdisjoint(pert_data.cells.conditions)


def test_a_dropped_condition_of_one_cell_stays_out_when_a_covering_vocabulary_loads_it(data_root, caplog):
    PertData(data_root).new_data_process("toy", _one_cell_without_go_terms(toy_data.make_raw()))
    toy_data.write_go_files(data_root, genes=[*toy_data.GENES, "NOGO", "NOGO2"])  # GO terms for both genes now
    pert_data = PertData(data_root)
    with caplog.at_level("WARNING", logger="gears_ddp"):
        pert_data.load(data_path=str(data_root / "toy"))
    assert "NOGO2+ctrl" in pert_data.cells.conditions and "NOGO+ctrl" not in pert_data.cells.conditions
    [warning] = [record.getMessage() for record in caplog.records if "without DE genes" in record.getMessage()]
    assert "dropping 1 condition(s) without DE genes" in warning and ": NOGO+ctrl (1 cell);" in warning
    pert_data.prepare_split("simulation", seed=1)
    pert_data.get_dataloader(batch_size=8, test_batch_size=8)
    gears = GEARS(pert_data, device="cpu")
    gears.model_initialize(hidden_size=8)
    assert np.isfinite(gears.train(epochs=1)["model"]["test_mse"])  # was a KeyError on NOGO+ctrl's DE genes


def test_processing_says_the_checks_warnings_of_unmeasured_genes_and_few_cells(data_root, caplog):
    screen = toy_data.make_raw()
    screen.var["gene_name"] = [
        f"ENSG{i:011d}" if name == "G3" else name for i, name in enumerate(screen.var["gene_name"])
    ]
    screen = _conditions(screen, lambda c: _set(c, np.flatnonzero(c == "G8+ctrl")[4:], "ctrl"))
    with caplog.at_level("WARNING", logger="gears_ddp"):
        PertData(data_root).new_data_process("toy", screen)
    said = [record.getMessage() for record in caplog.records]
    assert any(
        m.startswith("1 perturbed gene(s) are not among the measured genes (var['gene_name']): G3;") for m in said
    )
    assert any(m.startswith("1 condition(s) have fewer than 10 cells: G8+ctrl (4)") for m in said), said


def test_genes_whose_cells_are_dropped_are_not_counted_among_the_unmeasured(data_root):
    screen = _one_cell_without_go_terms(toy_data.make_raw())
    dropped = PertData(data_root).check_screen(screen, "toy", splits=[])
    assert "perturbed genes: 10 of 10 measured" in str(dropped)
    assert not [p for p in dropped.warnings if p.topic == "perturbed genes"], str(dropped)
    kept = PertData(data_root).check_screen(screen, "toy", splits=[], drop_unannotated=False)
    [warning] = [p for p in kept.warnings if p.topic == "perturbed genes"]
    assert "perturbed genes: 10 of 12 measured" in str(kept)
    assert "2 perturbed gene(s) are not among the measured genes (var['gene_name']): NOGO, NOGO2;" in warning.text


def test_a_screen_without_conditions_is_told_the_obs_columns_of_its_file(tmp_path, capsys):
    screen = toy_data.make_raw()
    screen.obs = screen.obs.rename(columns={"condition": "guide_target"}).drop(columns="cell_type")
    path = tmp_path / "screen.h5ad"
    screen.write_h5ad(path)
    argv = ["--adata", str(path), "--data-path", str(tmp_path / "data")]
    status, report = _check(capsys, argv)
    [line] = [line for line in report.splitlines() if "lacks required column(s) obs['condition']" in line]
    assert status == 2 and line.endswith("its obs columns are guide_target"), line
    assert main(["process", *argv, "--name", "screen"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("its obs columns are guide_target")
