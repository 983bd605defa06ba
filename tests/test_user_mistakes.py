"""What new users ran into: each mistake gets a clear error at once, naming what is wrong,
and leaves nothing half-done behind."""

import os
import stat
import time

import pytest
import torch
import toy_data
from test_launch import _run_script

from gears_ddp import PertData, train_multi_gpu
from gears_ddp.data import download, io
from gears_ddp.gears import GEARS

SCRIPT = """
from gears_ddp import train_multi_gpu
{body}
"""
CALL = (
    'train_multi_gpu({data!r}, "toy", {{"split": "simulation", "seed": 1}}, {{"epochs": 1, "batch_size": 8, '
    '"cpu_processes": 2, "model_config": {{"hidden_size": 8}}, "save_path": {save!r}}})'
)


@pytest.mark.parametrize("layout", ["top level", "main() called at the top level"])
def test_a_script_without_the_main_guard_fails_at_once_saying_what_to_add(data_folder, tmp_path, layout):
    call = CALL.format(data=str(data_folder), save=str(tmp_path / "run"))
    body = call if layout == "top level" else f"def main():\n    {call}\n\nmain()"
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(body=body))
    start = time.monotonic()
    done = _run_script(script)
    assert done.returncode != 0 and time.monotonic() - start < 60
    assert f"train_multi_gpu is called at the top level of {script}" in done.stderr
    assert 'if __name__ == "__main__":' in done.stderr
    assert "starting 2 cpu process(es)" not in done.stderr and not (tmp_path / "run").exists()


def test_a_guarded_script_edited_while_it_runs_is_not_taken_for_an_unguarded_one(tmp_path):
    """The guard is found by reading the script's source at the caller's line; a script whose
    file changed since it started (its lines moved) is not read."""
    script = tmp_path / "edited.py"
    script.write_text(
        "import pathlib, time\n"
        "from gears_ddp.launching.main_guard import check_main_guard\n"
        "if __name__ == '__main__':\n"
        "    path = pathlib.Path(__file__)\n"
        "    time.sleep(0.05)\n"
        "    path.write_text('\\n' * 50 + path.read_text())  # an edit that moves every line\n"
        "    check_main_guard('train_multi_gpu')\n"
        "    print('started')\n"
    )
    done = _run_script(script)
    assert done.returncode == 0 and done.stdout.strip() == "started", done.stderr[-2000:]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_written_files_follow_the_umask(toy, tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        toy.get_dataloader(16)
        torch.manual_seed(0)
        gears = GEARS(toy)
        gears.model_initialize(hidden_size=8)
        gears.train(epochs=1, save_path=str(tmp_path / "run"), checkpoint_every=1)
    finally:
        os.umask(previous)
    written = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    names = {p.name for p in written}
    assert {"config.pkl", "model.pt", "vocabulary.json"} <= names and any(n.startswith("checkpoint-") for n in names)
    for path in written:
        assert stat.S_IMODE(path.stat().st_mode) == mode, path


def test_an_atomic_write_reaches_the_disk_before_its_rename(tmp_path, monkeypatch):
    events = []
    fsync, replace = os.fsync, os.replace

    def recorded_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return fsync(fd)

    def recorded_replace(source, target):
        events.append(("rename", str(target)))
        return replace(source, target)

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "replace", recorded_replace)
    io.write_pickle({"a": 1}, tmp_path / "x.pkl")
    assert [kind for kind, _ in events] == ["fsync", "rename", "fsync"]
    assert events[0][1].startswith(str(tmp_path / ".x.pkl.")) and events[1][1] == str(tmp_path / "x.pkl")
    assert events[2][1] == str(tmp_path)  # the folder, which makes the rename durable


def test_a_dataset_fails_before_anything_is_written_and_every_missing_go_file_is_named(data_root, monkeypatch):
    closed_port = "http://127.0.0.1:9/api/access/datafile/"
    monkeypatch.setenv(download.DATAVERSE_URL_ENV, closed_port)
    (data_root / "essential_all_data_pert_genes.pkl").unlink()
    (data_root / "go_essential_all" / "go_essential_all.csv").unlink()
    with pytest.raises(download.DownloadError) as info:
        PertData(data_root).new_data_process("toy", toy_data.make_raw())
    assert "2 Gene Ontology input file(s) are missing" in str(info.value)
    assert "essential_all_data_pert_genes.pkl" in str(info.value) and "go_essential_all.csv" in str(info.value)
    assert not (data_root / "toy").exists()
    toy_data.write_go_files(data_root)  # supplied: the same call now works (no FileExistsError)
    PertData(data_root).new_data_process("toy", toy_data.make_raw())
    assert (data_root / "toy" / io.PROCESSED_FILE).is_file()


def test_a_mistyped_data_path_or_dataset_name_is_named_before_anything_is_fetched_or_made(data_folder, tmp_path):
    from gears_ddp.data.preparation import prepare_data

    split = {"split": "simulation", "seed": 1}
    model = {"coexpress_threshold": 0.4, "num_similar_genes_co_express_graph": 20, "num_similar_genes_go_graph": 20}
    typo = tmp_path / "dat"
    with pytest.raises(ValueError, match=rf"dataset 'toy': there is no folder {typo}/toy, and 'toy' is none of the"):
        prepare_data(typo, "toy", split, model)  # was a DownloadError of the GO files, into the mistyped folder
    assert not typo.exists()
    with pytest.raises(ValueError, match=r"\(processing names the folder in lower case: .+/toy exists\)"):
        prepare_data(data_folder, "TOY", split, model)


def test_a_run_refused_for_its_dataset_writes_no_configuration(data_folder, tmp_path):
    """The run folder's config.yaml is written once the data is there: a mistyped dataset
    leaves no configuration of a run that never started."""
    save_path = tmp_path / "run"
    args = {"epochs": 1, "cpu_processes": 1, "save_path": str(save_path), "model_config": {"hidden_size": 8}}
    with pytest.raises(ValueError, match="dataset 'toyy': there is no folder"):
        train_multi_gpu(data_folder, "toyy", {"split": "simulation", "seed": 1}, args)
    assert not (save_path / "config.yaml").exists()


def test_a_dataset_refused_by_its_vocabulary_leaves_no_file(data_root):
    raw = toy_data.make_raw()
    raw.obs["condition"] = raw.obs["condition"].astype(str).str.replace("G", "X")  # genes without GO terms
    raw.obs.loc[raw.obs["condition"] == "ctrl", "condition"] = "ctrl"
    with pytest.raises(ValueError, match="no perturbation of dataset 'toy' is in the perturbation vocabulary"):
        PertData(data_root).new_data_process("toy", raw)
    assert not (data_root / "toy" / io.PROCESSED_FILE).exists()


@pytest.fixture
def trained(toy):
    toy.get_dataloader(16)
    torch.manual_seed(0)
    gears = GEARS(toy)
    gears.model_initialize(hidden_size=8)
    gears.train(epochs=1)
    return gears


@pytest.mark.parametrize(
    "queries, message",
    [
        (["G0"], r"query 0 is the string 'G0', not a list of genes: write \['G0'\]"),
        ([["G0", "G0"]], r"query 0 names 'G0' twice"),
        ([["G0", "G1", "G2"]], r"query 0 must be a list of one or two gene names"),
        ([[1]], r"query 0 must be a list of one or two gene names"),
        ("G0", r"queries must be a non-empty list of gene lists"),
        ([], r"queries must be a non-empty list of gene lists"),
        ([["G0"], ["NOPE"]], r"gene\(s\) not in the perturbation vocabulary.*: 'NOPE'"),
        ([["g1", "NOPE"]], r": 'NOPE', 'g1' \(gene symbols are case-sensitive: g1 -> G1\)$"),
    ],
)
def test_malformed_queries_are_named(trained, queries, message):
    with pytest.raises(ValueError, match=message):
        trained.predict(queries)


def test_predicting_with_untrained_weights_is_refused(toy):
    toy.get_dataloader(16)
    gears = GEARS(toy)
    gears.model_initialize(hidden_size=8)
    with pytest.raises(RuntimeError, match="random initial weights: train it"):
        gears.predict([["G0"]])
    with pytest.raises(RuntimeError, match="random initial weights"):
        gears.GI_predict(["G0", "G1"])


def test_a_device_this_machine_lacks_is_named(toy):
    toy.get_dataloader(16)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    expected = "torch sees no CUDA GPU" if count == 0 else f"torch sees {count} CUDA GPU"
    for device in ("cuda", f"cuda:{count}") if count == 0 else (f"cuda:{count}",):
        with pytest.raises(ValueError, match=expected):
            GEARS(toy, device=device)
    with pytest.raises(ValueError, match="device='gpu' is not a device"):
        GEARS(toy, device="gpu")


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("hidden_size", 0, "hidden_size must be an integer >= 1, got 0"),
        ("num_go_gnn_layers", -1, "num_go_gnn_layers must be an integer >= 0"),
        ("coexpress_threshold", 1.5, "coexpress_threshold is a correlation in"),
        ("direction_lambda", float("nan"), "direction_lambda must be a non-negative number"),
    ],
)
def test_bad_model_options_are_named(toy, option, value, message):
    toy.get_dataloader(16)
    with pytest.raises(ValueError, match=f"model_initialize: {message}"):
        GEARS(toy).model_initialize(**{option: value})


def test_bad_split_and_folder_arguments_are_named(toy, tmp_path):
    with pytest.raises(ValueError, match=r"train_gene_set_size must be a fraction in \(0, 1\], got 75"):
        toy.prepare_split("simulation", seed=1, train_gene_set_size=75)
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        toy.prepare_split("simulation", seed=-1)
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match=f"data_path {a_file} is a file"):
        PertData(a_file)


def test_a_model_folder_without_weights_is_named(trained, tmp_path):
    trained.save_model(tmp_path / "m")
    (tmp_path / "m" / "model.pt").unlink()
    with pytest.raises(FileNotFoundError, match=f"no model.pt in the model folder {tmp_path / 'm'}"):
        GEARS(trained.pert_data).load_pretrained(tmp_path / "m")
