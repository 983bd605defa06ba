"""Bad input gets a clear error naming the problem, and nothing is overwritten silently."""

import logging
import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import toy_data

from gears_ddp import PertData
from gears_ddp.cli import main
from gears_ddp.configuration.run_options import resolved_config, write_run_config
from gears_ddp.configuration.sections import SplitConfig, TrainingArgs
from gears_ddp.data import io
from gears_ddp.data.conditions import coded_conditions
from gears_ddp.gears import GEARS


@pytest.mark.parametrize("column,where", [("condition", "obs"), ("gene_name", "var")])  # (cell_type: one is given)
def test_missing_column_is_named(data_root, column, where):
    adata = toy_data.make_raw()
    del getattr(adata, where)[column]
    with pytest.raises(ValueError, match=rf"lacks required column\(s\) {where}\['{column}'\]"):
        PertData(data_root).new_data_process("toy", adata)


def test_conditions_are_coded_without_a_string_per_cell_and_checked():
    cells = ["B+ctrl", "ctrl", "A+B", "ctrl", "B+ctrl", "A+B"]
    for column in (
        pd.Series(cells, dtype=object),
        pd.Series(pd.Categorical(cells, categories=["unused+ctrl", "A+B", "ctrl", "B+ctrl"])),
    ):
        conditions, codes = coded_conditions(column)
        assert conditions == ["B+ctrl", "ctrl", "A+B"]  # in order of first appearance, unused left out
        assert codes.tolist() == [0, 1, 2, 1, 0, 2] and codes.dtype == np.int64
    with pytest.raises(ValueError, match=r"malformed condition strings in obs\['condition'\]: None: not a string"):
        coded_conditions(pd.Series(pd.Categorical(["ctrl", None, "A+ctrl"])))
    with pytest.raises(ValueError, match=r"'A\+A': names gene 'A' twice"):
        coded_conditions(pd.Series(["ctrl", "A+A"], dtype=object))


@pytest.mark.parametrize(
    "bad,reason",
    [
        ("G1+G2+G3", "expected 'ctrl'"),
        ("G1+", "empty gene name"),
        ("ctrl+ctrl", "names no gene"),
        ("G1+G1", "names gene 'G1' twice"),
        (" G1+ctrl", "whitespace"),
    ],
)
def test_malformed_condition_is_named(data_root, bad, reason):
    adata = toy_data.make_raw()
    conditions = adata.obs["condition"].astype(str).to_numpy()
    conditions[5] = bad
    adata.obs["condition"] = conditions
    with pytest.raises(
        ValueError, match=rf"malformed condition strings.*{re.escape(repr(bad))}: .*{re.escape(reason)}"
    ):
        PertData(data_root).new_data_process("toy", adata)


def test_conditions_outside_vocabulary_are_listed_and_dropped(data_root, caplog):
    adata = toy_data.make_raw()
    conditions = adata.obs["condition"].astype(str).to_numpy()
    conditions[conditions == "G9+ctrl"] = "UNKNOWNGENE+ctrl"
    adata.obs["condition"] = conditions
    pert_data = PertData(data_root)
    with caplog.at_level(logging.WARNING, logger="gears_ddp"):
        pert_data.new_data_process("toy", adata)
    assert "UNKNOWNGENE+ctrl" in caplog.text
    assert "UNKNOWNGENE+ctrl" not in pert_data.cells.conditions
    assert pert_data.adata.n_obs == adata.n_obs - int((conditions == "UNKNOWNGENE+ctrl").sum())
    assert pert_data.cells.n_cells == pert_data.adata.n_obs


@pytest.mark.parametrize("value,message", [(np.nan, "non-finite"), (np.inf, "non-finite"), (-1.0, "negative")])
def test_bad_expression_values(data_root, value, message):
    adata = toy_data.make_raw()
    x = adata.X.toarray()
    x[3, 4] = value
    adata.X = x
    with pytest.raises(ValueError, match=f"1 {message} expression values"):
        PertData(data_root).new_data_process("toy", adata)


def test_no_control_cells(data_root):
    adata = toy_data.make_raw()
    adata = adata[adata.obs["condition"] != "ctrl"].copy()
    with pytest.raises(ValueError, match="no control cells"):
        PertData(data_root).new_data_process("toy", adata)


def test_several_cell_types_refused(data_root):
    adata = toy_data.make_raw()
    adata.obs["cell_type"] = np.where(np.arange(adata.n_obs) % 2, "A", "B")
    with pytest.raises(ValueError, match="2 cell types"):
        PertData(data_root).new_data_process("toy", adata)


def test_existing_processed_file_is_not_overwritten(toy, data_root):
    target = data_root / "toy" / "perturb_processed.h5ad"
    before = target.stat().st_mtime_ns
    with pytest.raises(FileExistsError, match="overwrite=True"):
        PertData(data_root).new_data_process("toy", toy_data.make_raw())
    assert target.stat().st_mtime_ns == before


def test_overwrite_removes_stale_split_caches(toy, data_root):
    assert list((data_root / "toy" / "splits").glob("*.pkl"))
    PertData(data_root).new_data_process("toy", toy_data.make_raw(seed=5), overwrite=True)
    assert not list((data_root / "toy" / "splits").iterdir())  # the splits and their settings


def test_unknown_split_name(toy):
    with pytest.raises(ValueError, match="unknown split 'simulated'.*available splits: simulation"):
        toy.prepare_split("simulated")


@pytest.mark.parametrize(
    "split,n_genes,empty_set", [("simulation", 2, "train"), ("no_test", 3, "val"), ("single", 3, "test")]
)
def test_split_that_leaves_a_set_without_perturbations(data_root, split, n_genes, empty_set):
    adata = toy_data.make_raw()
    keep = adata.obs["condition"].isin(["ctrl"] + toy_data.SINGLES[:n_genes]).to_numpy()
    pert_data = PertData(data_root)
    pert_data.new_data_process("tiny", adata[keep].copy())
    with pytest.raises(
        ValueError,
        match=rf"split '{split}' with seed 1 leaves the .*{empty_set}.* set\(s\) "
        "without perturbations",
    ):
        pert_data.prepare_split(split, seed=1)


def test_custom_split_file_missing(toy, tmp_path):
    with pytest.raises(FileNotFoundError, match="custom split file not found"):
        toy.prepare_split("custom", split_dict_path=tmp_path / "nope.pkl")
    with pytest.raises(ValueError, match="needs split_dict_path"):
        toy.prepare_split("custom")


def _write_split(path, sets):
    with open(path, "wb") as f:
        pickle.dump(sets, f)
    return path


def test_custom_split_unknown_conditions_and_overlap(toy, tmp_path):
    good = {"train": ["ctrl", "G0+ctrl", "G1+ctrl"], "val": ["G2+ctrl"], "test": ["G3+ctrl", "G0+G1"]}
    toy.prepare_split("custom", split_dict_path=_write_split(tmp_path / "good.pkl", good))
    assert toy.set2conditions == good
    unknown = dict(good, test=["G3+ctrl", "G77+ctrl"])
    with pytest.raises(ValueError, match=r"names conditions absent from the data: \['G77\+ctrl'\]"):
        toy.prepare_split("custom", split_dict_path=_write_split(tmp_path / "unknown.pkl", unknown))
    overlap = dict(good, val=["G2+ctrl", "G0+ctrl"])
    with pytest.raises(ValueError, match=r"in both 'train' and 'val': \['G0\+ctrl'\]"):
        toy.prepare_split("custom", split_dict_path=_write_split(tmp_path / "overlap.pkl", overlap))
    empty = dict(good, val=[])
    with pytest.raises(ValueError, match="leaves the val set"):
        toy.prepare_split("custom", split_dict_path=_write_split(tmp_path / "empty.pkl", empty))


def test_custom_split_without_control_in_train_or_with_a_misnamed_set_is_refused_before_training(toy, tmp_path, caplog):
    good = {"train": ["ctrl", "G0+ctrl", "G1+ctrl"], "val": ["G2+ctrl"], "test": ["G3+ctrl", "G0+G1"]}
    no_control = _write_split(tmp_path / "no_control.pkl", dict(good, train=["G0+ctrl", "G1+ctrl"]))
    with pytest.raises(ValueError, match=r"no_control.pkl leaves the control cells \('ctrl'\) out of the train set"):
        toy.prepare_split("custom", split_dict_path=no_control)  # was refused by the baselines, after training
    misnamed = {"train": good["train"], "validation": good["val"], "test": good["test"]}
    with pytest.raises(ValueError) as refused:
        toy.prepare_split("custom", split_dict_path=_write_split(tmp_path / "misnamed.pkl", misnamed))
    assert "has set(s) 'validation', which are none of 'train', 'val' and 'test'" in str(refused.value)
    assert "leaves the val set(s) without perturbations" in str(refused.value)
    assert "too few perturbations" not in str(refused.value)  # a custom split's sets are the file's
    with caplog.at_level("WARNING", logger="gears_ddp"):
        toy.prepare_split("custom", split_dict_path=_write_split(tmp_path / "good.pkl", good))
    [unused] = [record.getMessage() for record in caplog.records if "in no set" in record.getMessage()]
    assert re.search(r"puts \d+ of the data's conditions in no set: they are neither trained nor scored: G", unused)


def test_custom_split_file_not_a_dict(toy, tmp_path):
    with pytest.raises(ValueError, match="holds a list"):
        toy.prepare_split("custom", split_dict_path=_write_split(tmp_path / "list.pkl", ["ctrl"]))


def test_truncated_h5ad_names_the_file(toy, data_root):
    target = data_root / "toy" / "perturb_processed.h5ad"
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 3])
    with pytest.raises(ValueError, match=f"cannot read {target}.*truncated or corrupt"):
        PertData(data_root).load(data_path=data_root / "toy")


def test_garbage_h5ad_names_the_file(data_root):
    (data_root / "junk").mkdir()
    (data_root / "junk" / "perturb_processed.h5ad").write_text("<html>not found</html>")
    with pytest.raises(ValueError, match="junk/perturb_processed.h5ad"):
        PertData(data_root).load(data_path=data_root / "junk")


def test_load_nothing(data_root):
    with pytest.raises(ValueError, match="data_name must be one of .*'norman'"):
        PertData(data_root).load(data_name="normann")


def test_loaders_before_split(data_root):
    pert_data = PertData(data_root)
    pert_data.new_data_process("toy", toy_data.make_raw())
    with pytest.raises(RuntimeError, match="call prepare_split"):
        pert_data.get_dataloader(8)


def test_batch_larger_than_train_set(toy):
    with pytest.raises(ValueError, match="fewer than one batch"):
        toy.get_dataloader(100_000)


# ----------------------------------------------------------------------------- files that are not what they claim


def _refused_in_one_line(capsys, argv, *expected):
    """The command exits with status 2, and the last line of its stderr, which is no
    traceback, says what is wrong with ``expected`` in it (the file, the problem)."""
    library = logging.getLogger("gears_ddp")  # the command's log handler writes to this test's captured stderr
    for handler in [h for h in library.handlers if getattr(h, "_gears_ddp_console", False)]:
        library.removeHandler(handler)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"gears-ddp {argv[0]}: ")
    for text in expected:
        assert text in last, last


def _refused_naming(capsys, argv, *problems):
    """The command exits with status 2 and, with no traceback, refuses in one message, which
    starts ``gears-ddp <command>: `` and counts them, every one of ``problems``: each a tuple
    of texts that one line of the message holds together (the file, column or gene, and
    the fix)."""
    library = logging.getLogger("gears_ddp")
    for handler in [h for h in library.handlers if getattr(h, "_gears_ddp_console", False)]:
        library.removeHandler(handler)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    message = err[err.index(f"gears-ddp {argv[0]}: ") :].strip()
    assert f": {len(problems)} problems stop it, each with its fix:" in message.splitlines()[0]
    for texts in problems:
        assert any(all(text in line for text in texts) for line in message.splitlines()), (texts, message)


@pytest.fixture(scope="module")
def run_folder(data_folder, tmp_path_factory):
    """A run folder as gears-ddp train leaves it: the model files and config.yaml."""
    folder = tmp_path_factory.mktemp("run")
    pert_data = PertData(data_folder)
    pert_data.load(data_path=data_folder / "toy")
    pert_data.prepare_split("simulation", seed=1)
    pert_data.get_dataloader(16)
    gears = GEARS(pert_data)
    gears.model_initialize(hidden_size=8)
    gears.save_model(folder)
    args = TrainingArgs.from_dict({"batch_size": 16, "model_config": {"hidden_size": 8}, "save_path": str(folder)})
    write_run_config(folder, resolved_config(str(data_folder), "toy", SplitConfig.from_dict({}), args))
    return folder


def _garbage(path):
    Path(path).write_bytes(bytes(range(256)) * 4)


@pytest.mark.parametrize(
    "name, spoil, message",
    [
        ("model.pt", _garbage, "cannot read model weights"),
        ("model.pt", lambda path: torch.save({"x": torch.zeros(2)}, path), "does not hold the weights of the network"),
        ("config.pkl", _garbage, "cannot read GEARS model config"),
        ("config.pkl", lambda path: io.write_pickle({"hidden_size": 8}, path), "is not a GEARS model config"),
        ("vocabulary.json", _garbage, "is not a model's vocabulary"),
        ("vocabulary.json", lambda path: Path(path).write_text('{"genes": 3}'), "is not a model's vocabulary"),
        ("config.yaml", _garbage, "is not a YAML configuration file"),
    ],
)
@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_a_run_folder_with_a_spoilt_file_is_refused_in_one_line_naming_it(
    run_folder, tmp_path, capsys, name, spoil, message, command
):
    folder = tmp_path / "run"
    shutil.copytree(run_folder, folder)
    spoil(folder / name)
    argv = [command, "--run", str(folder)] + (
        ["--perturbations", "G0", "--out", str(tmp_path / "p.h5ad")] if command == "predict" else []
    )
    _refused_in_one_line(capsys, argv, str(folder / name), message)


def test_process_refuses_inputs_that_are_no_h5ad_or_annotation_in_one_line(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("a plain text file\n")
    data = ["--data-path", str(tmp_path / "data"), "--name", "screen"]
    _refused_in_one_line(capsys, ["process", "--adata", str(notes), *data], str(notes), "is not an h5ad file")
    _refused_in_one_line(capsys, ["process", "--adata", str(tmp_path), *data], str(tmp_path), "is a folder")
    raw = tmp_path / "raw.h5ad"
    toy_data.make_raw().write_h5ad(raw)
    for annotation, content in (
        ("binary.tsv", bytes(range(256))),
        ("empty.tsv", b""),
        ("binary.gaf", bytes(range(256))),
    ):
        (tmp_path / annotation).write_bytes(content)
        _refused_in_one_line(
            capsys,
            ["process", "--adata", str(raw), *data, "--go-annotation", str(tmp_path / annotation)],
            f"cannot read the GO annotation {tmp_path / annotation}",
        )
    assert not (tmp_path / "data" / "screen").exists()


def test_train_and_demo_refuse_a_binary_config_and_a_file_for_a_folder_in_one_line(tmp_path, capsys):
    _garbage(tmp_path / "run.yaml")
    _refused_in_one_line(
        capsys,
        ["train", "--config", str(tmp_path / "run.yaml")],
        str(tmp_path / "run.yaml"),
        "is not a YAML configuration file",
    )
    _refused_in_one_line(
        capsys,
        ["demo", "--data-path", str(tmp_path / "run.yaml"), "--save-path", str(tmp_path / "x")],
        str(tmp_path / "run.yaml"),
        "is a file",
    )


@pytest.mark.parametrize(
    "content, message",
    [
        (bytes(range(256)) * 4, "cannot read the co-expression graph"),
        (b"just,some\ntext,here\n", "is not a co-expression graph"),
    ],
)
def test_a_spoilt_graph_file_is_named_with_what_to_do(toy, content, message):
    toy.coexpression_graph()
    cache = next(Path(toy.dataset_path).glob("*_co_expression_network.csv"))
    cache.write_bytes(content)
    with pytest.raises(ValueError, match=f"{re.escape(str(cache))}.*delete it and it is built again") as refused:
        toy.coexpression_graph()
    assert message in str(refused.value)
    go_edges = Path(toy.data_path) / "go_essential_all" / "go_essential_all.csv"
    go_edges.write_bytes(content)
    with pytest.raises(ValueError, match=f"{re.escape(str(go_edges))}.*delete it to download it again"):
        toy.go_graph()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"expression_storage": "disk"}, r"expression_storage must be one of \('mapped', 'memory'\), got 'disk'"),
        ({"expression_dtype": "float64"}, r"expression_dtype must be one of \('float32', 'float16'\), got 'float64'"),
    ],
)
def test_pertdata_storage_options_are_named(data_root, options, message):
    with pytest.raises(ValueError, match=message):
        PertData(data_root, **options)


def test_processing_without_an_anndata_and_checking_an_unknown_split_option_are_named(data_root):
    pert_data = PertData(data_root)
    with pytest.raises(ValueError, match="new_data_process needs the raw AnnData as `adata`"):
        pert_data.new_data_process("toy")
    with pytest.raises(ValueError, match=r"unknown split option\(s\) \['sed'\]; prepare_split's options: split, seed"):
        pert_data.check_screen(toy_data.make_raw(), "toy", splits=[{"split": "simulation", "sed": 2}])
