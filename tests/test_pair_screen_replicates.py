"""Screens over replicates: the summary's numbers on tables built by hand (mean, sd and
interval over the models, agreement, the confidence rule, the spread within a model), each
model's screen as an ordinary screen (resumable, 2 processes equal to 1), the run folders a
replicates folder stands for, the command with its one-line refusals, and the picture."""

import json
import logging
import os

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import Normalize
from scipy import stats
from test_pair_screen import GENES, Interrupted, _trained

from gears_ddp.cli import main
from gears_ddp.configuration.run_options import resolved_config, write_run_config
from gears_ddp.configuration.sections import ReplicateOptions, SplitConfig, TrainingArgs
from gears_ddp.inference import figures
from gears_ddp.inference.pair_screen_job import PAIR_SCREEN_COLUMN_MEANINGS, PairScreenFolder, read_table
from gears_ddp.inference.pair_screen_statistics import SUMMARY_COLUMN_MEANINGS, confident_counts, summarise_models
from gears_ddp.inference.prediction import DRAWN_CELLS_CHANGE
from gears_ddp.inference.replicate_pair_screen import REPLICATE_RECORD_FORMAT
from gears_ddp.interactions.calls import CALL_ORDER, INTERACTION_TYPE_MEANINGS, interaction_types
from gears_ddp.interactions.scores import GI_SCORE_MEANINGS, GI_SCORE_NAMES
from gears_ddp.report.run_files import PAGE_FILE, REPORT_FILE
from gears_ddp.runs import pair_screens as pair_screens_module
from gears_ddp.runs.pair_screens import pair_screen_replicates
from gears_ddp.runs.saved_runs import load_run, run_folders

SCREENED = GENES[:6]  # 15 pairs
SPLIT = {"split": "simulation", "seed": 1}

# ----------------------------------------------------------------------------- tables built by hand

# three models' scores of six pairs; the other scores are fixed
MAG = [[1.5, 1.2, 0.50, 1.00, 1.5, 1.4], [1.6, 1.0, 0.52, 1.02, 0.5, 1.5], [1.7, 1.4, 0.54, 0.98, 1.0, 3.0]]
CORR_FIT = [[0.5, 0.8, 0.86, 0.95, 0.95, 0.95], [0.6, 0.9, 0.99, 0.95, 0.95, 0.95], [0.7, 0.9, 0.99, 0.95, 0.95, 0.95]]
DCOR = [[0.5, 0.5, 0.5, 0.5, 0.90, 0.5], [0.5, 0.5, 0.5, 0.5, 0.90, 0.5], [0.5, 0.5, 0.5, 0.5, 0.95, 0.5]]
DOMINANCE = [[0.1, 0.3, 0.1, 0.1, 0.1, 0.3], [0.1, 0.1, 0.1, 0.1, 0.1, 0.3], [0.1, 0.1, 0.1, 0.1, 0.1, 0.3]]


def _table(model, scale=1.0, pairs=6):
    """Model ``model``'s screen table of the pairs A0+B0 ... (its mag times ``scale``), its
    interaction types derived as a screen derives them."""
    table = pd.DataFrame(
        {
            "pair": [f"A{i}+B{i}" for i in range(pairs)],
            "first_gene": [f"A{i}" for i in range(pairs)],
            "second_gene": [f"B{i}" for i in range(pairs)],
        }
    )
    for name in GI_SCORE_NAMES:
        table[name] = 0.25 + 0.1 * model
    table["mag"] = np.array(MAG[model][:pairs]) * scale
    table["corr_fit"], table["dcor"], table["dominance"] = (
        CORR_FIT[model][:pairs],
        DCOR[model][:pairs],
        DOMINANCE[model][:pairs],
    )
    table["seen_in_training"] = [model < 2] + [False] * (pairs - 1)
    table["singles_in_training"] = [2 - model] + [2] * (pairs - 1)
    for name, values in interaction_types(table).items():
        table[name] = values
    return table


def _interval(values):
    values = np.asarray(values, dtype=float)
    return stats.t.interval(0.95, len(values) - 1, loc=values.mean(), scale=stats.sem(values))


def test_the_summary_of_tables_built_by_hand_has_the_known_means_intervals_and_calls():
    summary = summarise_models({f"seed-{model}": [_table(model)] for model in range(3)})
    assert list(summary["pair"]) == [f"A{i}+B{i}" for i in range(6)] and (summary["models"] == 3).all()
    for name, values in (("mag", MAG), ("corr_fit", CORR_FIT), ("dcor", DCOR), ("c1", [[0.25], [0.35], [0.45]])):
        for pair in range(len(values[0])):
            column = [values[model][pair] for model in range(3)]
            assert summary.at[pair, f"{name}_mean"] == pytest.approx(np.mean(column), rel=1e-12)
            assert summary.at[pair, f"{name}_sd_models"] == pytest.approx(np.std(column, ddof=1), rel=1e-12, abs=1e-15)
            low, high = _interval(column) if np.ptp(column) else (column[0], column[0])
            assert (summary.at[pair, f"{name}_ci_low"], summary.at[pair, f"{name}_ci_high"]) == pytest.approx(
                (low, high), rel=1e-10
            )
    assert (summary[[f"{name}_sd_draws" for name in GI_SCORE_NAMES]] == 0).all().all()  # the exact change
    # mag: synergy held; additive by 2 of 3; suppressor held; additive held; a three-way tie, to additive;
    # synergy in every model, but the interval reaches below 1.3
    assert list(summary["magnitude_type"]) == ["synergy", "additive", "suppressor", "additive", "additive", "synergy"]
    assert list(summary["magnitude_type_agreement"]) == pytest.approx([1, 2 / 3, 1, 1, 1 / 3, 1])
    assert list(summary["magnitude_type_confident"]) == [True, False, True, True, False, False]
    # corr_fit: neomorphic held; not by 2 of 3; not in every model, but the interval reaches below 0.85
    assert list(summary["neomorphic"]) == [True, False, False, False, False, False]
    assert list(summary["neomorphic_confident"]) == [True, False, False, True, True, True]
    assert list(summary["redundant"]) == [False, False, False, False, True, False]  # dcor above 0.8 at pair 4
    assert summary["redundant_confident"].all()
    assert list(summary["epistasis"]) == [False, False, False, False, False, True]
    assert list(summary["epistasis_agreement"]) == pytest.approx([1, 2 / 3, 1, 1, 1, 1])
    assert list(summary["epistasis_confident"]) == [True, False, True, True, True, True]
    assert list(summary["seen_in_training"][:2]) == [2, 0] and summary.at[0, "singles_in_training"] == 1.0
    assert confident_counts(summary) == {
        "magnitude_type": {"additive": 1, "synergy": 1, "suppressor": 1},
        "neomorphic": {"no": 3, "yes": 1},
        "redundant": {"no": 5, "yes": 1},
        "epistasis": {"no": 4, "yes": 1},
    }


def test_the_spread_within_a_model_is_over_its_draws_and_apart_from_the_spread_across_models():
    """Each model's two draws of control cells: a model's value is its draws' mean, the
    spread across models is that of these means, the spread within one is pooled over them."""
    scales = [[1.0, 1.2], [0.9, 0.9], [1.1, 1.4]]
    tables = {f"seed-{model}": [_table(model, scale) for scale in scales[model]] for model in range(3)}
    summary = summarise_models(tables, DRAWN_CELLS_CHANGE)
    # models x draws x pairs
    draws = np.array([[np.array(MAG[model]) * scale for scale in scales[model]] for model in range(3)])
    means = draws.mean(axis=1)
    np.testing.assert_allclose(summary["mag_mean"], means.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(summary["mag_sd_models"], means.std(axis=0, ddof=1), rtol=1e-12)
    np.testing.assert_allclose(summary["mag_sd_draws"], np.sqrt(draws.var(axis=1, ddof=1).mean(axis=0)), rtol=1e-12)
    assert (summary["c1_sd_draws"] == 0).all()  # the same in every draw
    one_draw = summarise_models({name: model_tables[:1] for name, model_tables in tables.items()}, DRAWN_CELLS_CHANGE)
    assert one_draw["mag_sd_draws"].isna().all()  # not measured


@pytest.mark.parametrize(
    "tables, change, message",
    [
        ({"seed-1": [_table(0)]}, "exact", r"at least 2 models, got 1: \['seed-1'\]"),
        ({"a": [_table(0)], "b": [_table(1, pairs=5)]}, "exact", "the tables of b hold other pairs than those of a"),
        ({"a": [_table(0), _table(0)], "b": [_table(1), _table(1)]}, "exact", "one table per draw.*one with the exact"),
        ({"a": [_table(0), _table(0)], "b": [_table(1)]}, DRAWN_CELLS_CHANGE, r"the same number for each .*\[2, 1\]"),
    ],
)
def test_tables_that_cannot_be_summarised_are_refused_naming_why(tables, change, message):
    with pytest.raises(ValueError, match=message):
        summarise_models(tables, change)


# ----------------------------------------------------------------------------- screens of trained models


def _run_folder(gears, data_folder, folder, seed=0):
    """A run folder of ``gears``: its model and the configuration that loads it."""
    gears.save_model(folder)
    args = TrainingArgs.from_dict({"batch_size": 16, "seed": seed, "model_config": {"hidden_size": 8}})
    write_run_config(folder, resolved_config(str(data_folder), "toy", SplitConfig.from_dict(SPLIT), args))


@pytest.fixture(scope="module")
def models(data_folder):
    return [_trained(data_folder, seed=seed) for seed in range(3)]


@pytest.fixture(scope="module")
def replicates(models, data_folder, tmp_path_factory):
    """A replicates folder of the three models, as ``gears-ddp train --seeds 1 2 3`` leaves it."""
    top = tmp_path_factory.mktemp("replicates")
    args = TrainingArgs.from_dict({"batch_size": 16, "save_path": str(top), "model_config": {"hidden_size": 8}})
    write_run_config(
        top,
        resolved_config(
            str(data_folder),
            "toy",
            SplitConfig.from_dict(SPLIT),
            args,
            None,
            None,
            ReplicateOptions.from_dict({"seeds": [1, 2, 3]}),
        ),
    )
    for seed, gears in enumerate(models, 1):
        _run_folder(gears, data_folder, top / f"seed-{seed}", seed)
        (top / f"seed-{seed}" / REPORT_FILE).write_text(json.dumps({"history": []}))
        (top / f"seed-{seed}" / PAGE_FILE).write_text("<html></html>")
    return top


@pytest.fixture(scope="module")
def summary(replicates, tmp_path_factory):
    out = tmp_path_factory.mktemp("screen") / "screen.csv"
    return pair_screen_replicates(replicates, SCREENED, out=out, cpu_processes=1, chunk_pairs=4), out


def test_a_bad_device_request_is_refused_before_any_model_is_loaded(replicates, tmp_path, monkeypatch):
    loaded = []
    monkeypatch.setattr(pair_screens_module, "load_run", lambda *args: loaded.append(args))
    with pytest.raises(ValueError, match="cpu_processes"):
        pair_screen_replicates(replicates, SCREENED, out=tmp_path / "screen.csv", cpu_processes=0)
    assert loaded == []


def test_a_pair_screen_over_replicates_summarises_each_models_own_pair_screen(models, replicates, summary):
    summary, out = summary
    tables = {}
    for seed, gears in enumerate(models, 1):
        tables[f"seed-{seed}"] = [read_table(out.with_suffix(".models") / f"seed-{seed}.csv")]
        pd.testing.assert_frame_equal(
            tables[f"seed-{seed}"][0], gears.screen(SCREENED, chunk_pairs=4), check_exact=True
        )
    pd.testing.assert_frame_equal(summary, summarise_models(tables), check_exact=True)
    pd.testing.assert_frame_equal(read_table(out), summary, check_exact=True)
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["format"] == REPLICATE_RECORD_FORMAT and record["genes"] == SCREENED and record["pairs"] == 15
    assert list(record["models"]) == ["seed-1", "seed-2", "seed-3"]
    assert record["models"]["seed-2"]["from"] == str(replicates / "seed-2")
    assert record["confident"] == confident_counts(summary) and record["draw_seeds"] is None
    assert summary["mag_sd_models"].gt(0).all()  # independently trained models differ


def test_an_interrupted_pair_screen_over_replicates_resumes_to_the_same_summary(
    replicates, summary, tmp_path, monkeypatch
):
    """Stopped in the second model's screen (4 chunks of 4 pairs each): run again, it reads
    the first model's table back and computes only the chunks that are missing."""
    whole, _ = summary
    out = tmp_path / "screen.csv"
    written, original = [], PairScreenFolder.write_chunk

    def write_then_stop(folder, chunk, scores):
        if len(written) == 6:
            raise Interrupted
        original(folder, chunk, scores)
        written.append((folder.table.stem, chunk))

    monkeypatch.setattr(PairScreenFolder, "write_chunk", write_then_stop)
    with pytest.raises(Interrupted):
        pair_screen_replicates(replicates, SCREENED, out=out, cpu_processes=1, chunk_pairs=4)
    assert not out.exists() and (out.with_suffix(".models") / "seed-1.csv").exists()
    monkeypatch.setattr(
        PairScreenFolder,
        "write_chunk",
        lambda folder, chunk, scores: (written.append((folder.table.stem, chunk)), original(folder, chunk, scores)),
    )
    resumed = pair_screen_replicates(replicates, SCREENED, out=out, cpu_processes=1, chunk_pairs=4)
    assert written[6:] == [("seed-2", 2), ("seed-2", 3), ("seed-3", 0), ("seed-3", 1), ("seed-3", 2), ("seed-3", 3)]
    pd.testing.assert_frame_equal(resumed, whole, check_exact=True)
    del written[:]
    pd.testing.assert_frame_equal(
        pair_screen_replicates(replicates, SCREENED, out=out, cpu_processes=1, chunk_pairs=4), whole, check_exact=True
    )
    assert written == []  # every model's table read back


# a screen over replicates in a process of its own, each chunk followed by a pause, so that
# the test can kill it part-way (argv: the replicates folder, the out file, the genes)
KILLED_PAIR_SCREEN = """
import sys, time
from gears_ddp.runs.pair_screens import pair_screen_replicates
from gears_ddp.inference.pair_screen_job import PairScreenFolder

write_chunk = PairScreenFolder.write_chunk

def write_then_pause(folder, chunk, scores):
    write_chunk(folder, chunk, scores)
    time.sleep(0.3)

PairScreenFolder.write_chunk = write_then_pause
if __name__ == "__main__":
    pair_screen_replicates(sys.argv[1], sys.argv[3:], out=sys.argv[2], cpu_processes=1, chunk_pairs=4)
"""


@pytest.mark.distributed
def test_a_pair_screen_over_replicates_killed_part_way_resumes_to_the_same_summary(replicates, summary, tmp_path):
    """SIGKILL in the second model's screen: the run again reads the first model's table
    and the finished chunks back, and ends with the summary of an uninterrupted run."""
    import signal
    import subprocess
    import sys
    import time

    whole, _ = summary
    out = tmp_path / "screen.csv"
    script = tmp_path / "screen.py"
    script.write_text(KILLED_PAIR_SCREEN)
    process = subprocess.Popen(
        [sys.executable, str(script), str(replicates), str(out), *SCREENED],
        start_new_session=True,
        stderr=subprocess.PIPE,
    )
    second = out.with_suffix(".models") / "seed-2.partial"
    deadline = time.monotonic() + 240
    while not len(list(second.glob("chunk-*.npz"))) >= 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, f"the screen ended before it was killed: {process.stderr.read()[-2000:]!r}"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert (
        not out.exists()
        and (out.with_suffix(".models") / "seed-1.csv").exists()
        and not (out.with_suffix(".models") / "seed-3.csv").exists()
    )
    pd.testing.assert_frame_equal(
        pair_screen_replicates(replicates, SCREENED, out=out, cpu_processes=1, chunk_pairs=4), whole, check_exact=True
    )


@pytest.mark.distributed
@pytest.mark.slow
def test_a_pair_screen_over_replicates_on_two_processes_equals_the_one_process_pair_screen(
    replicates, summary, tmp_path
):
    whole, _ = summary
    out = tmp_path / "screen.csv"
    pd.testing.assert_frame_equal(
        pair_screen_replicates(replicates, SCREENED, out=out, cpu_processes=2, chunk_pairs=4), whole, check_exact=True
    )
    for seed in (1, 2, 3):
        name = f"seed-{seed}.csv"
        pd.testing.assert_frame_equal(
            read_table(out.with_suffix(".models") / name),
            read_table(summary[1].with_suffix(".models") / name),
            check_exact=True,
        )


def test_with_drawn_cells_each_model_pair_screens_every_draw(models, replicates):
    summary = pair_screen_replicates(
        [replicates / "seed-1", replicates / "seed-3"],
        SCREENED[:4],
        cpu_processes=1,
        change=DRAWN_CELLS_CHANGE,
        seeds=[4, 7],
    )
    tables = {
        f"seed-{seed}": [models[seed - 1].screen(SCREENED[:4], change=DRAWN_CELLS_CHANGE, seed=draw) for draw in (4, 7)]
        for seed in (1, 3)
    }
    pd.testing.assert_frame_equal(summary, summarise_models(tables, DRAWN_CELLS_CHANGE), check_exact=True)
    assert summary["mag_sd_draws"].gt(0).all() and summary["models"].eq(2).all()
    with pytest.raises(ValueError, match=r"the draws of seed-1 repeat a seed \(\[4, 4\]\)"):
        pair_screen_replicates(replicates, SCREENED[:4], change=DRAWN_CELLS_CHANGE, seeds=[4, 4], cpu_processes=1)
    with pytest.raises(
        ValueError,
        match=r"several seeds \(\[4, 7\]\) draw control cells for the drawn-cells change "
        "only",
    ):
        pair_screen_replicates(replicates, SCREENED[:4], seeds=[4, 7], cpu_processes=1)


# ----------------------------------------------------------------------------- the run folders


def test_a_replicates_folder_stands_for_its_finished_replicates(replicates, tmp_path):
    assert run_folders(replicates) == {f"seed-{seed}": replicates / f"seed-{seed}" for seed in (1, 2, 3)}
    assert run_folders([replicates / "seed-2", replicates / "seed-1"]) == {
        "seed-2": replicates / "seed-2",
        "seed-1": replicates / "seed-1",
    }
    other = tmp_path / "other" / "seed-1"
    other.mkdir(parents=True)
    by_path = [str(folder).strip("/").replace("/", "_") for folder in (replicates / "seed-1", other)]
    assert list(run_folders([replicates / "seed-1", other])) == by_path  # two seed-1: named by their paths
    with pytest.raises(ValueError, match=r"run folders given more than once: \[.*seed-1'\]"):
        run_folders([replicates, replicates / "seed-1"])
    with pytest.raises(FileNotFoundError, match="run folder .*nowhere does not exist"):
        run_folders([replicates, tmp_path / "nowhere"])
    (replicates / "seed-3" / PAGE_FILE).rename(tmp_path / PAGE_FILE)  # as if seed-3 had not finished
    try:
        with pytest.raises(
            ValueError,
            match=r"replicates that have not finished \(no complete report\): .*seed-3; "
            r"finish them .* naming their folders: .*seed-1 .*seed-2$",
        ):
            run_folders(replicates)
    finally:
        (tmp_path / PAGE_FILE).rename(replicates / "seed-3" / PAGE_FILE)


def test_models_with_the_same_weights_are_refused(models, data_folder, replicates, tmp_path):
    _run_folder(models[0], data_folder, tmp_path / "copy")
    with pytest.raises(
        ValueError,
        match="models seed-1 and copy have the same weights: an interval over models needs independently trained ones",
    ):
        pair_screen_replicates([replicates / "seed-1", tmp_path / "copy"], SCREENED[:3], cpu_processes=1)


# ----------------------------------------------------------------------------- the command


@pytest.fixture
def command_logging(monkeypatch):
    """The command's console handler leaves with the test."""
    library_logger = logging.getLogger("gears_ddp")
    monkeypatch.setattr(library_logger, "handlers", list(library_logger.handlers))
    monkeypatch.setattr(library_logger, "level", library_logger.level)


def test_the_pair_screen_command_over_a_replicates_folder_writes_the_summary_and_the_picture(
    models, replicates, tmp_path, capsys, command_logging
):
    out = tmp_path / "out" / "screen.csv"
    command = ["screen", "--run", str(replicates), "--genes", *SCREENED, "--out", str(out), "--cpu-processes", "1"]
    assert main(command) == 0
    printed = capsys.readouterr().out
    tables = {f"seed-{seed}": [gears.screen(SCREENED)] for seed, gears in enumerate(models, 1)}  # the same chunks
    whole = summarise_models(tables)
    pd.testing.assert_frame_equal(read_table(out), whole, check_exact=True)
    assert f"screen over 3 models: 15 pairs summarised in {out}" in printed
    counts = confident_counts(whole)["magnitude_type"]
    assert (
        f"magnitude_type: additive {counts['additive']}, synergy {counts['synergy']}, suppressor "
        f"{counts['suppressor']}" in printed
    )
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    assert sorted(path.name for path in out.with_suffix(".models").glob("*.csv")) == [
        "seed-1.csv",
        "seed-2.csv",
        "seed-3.csv",
    ]
    two = [
        "screen",
        "--run",
        str(replicates / "seed-1"),
        str(replicates / "seed-2"),
        "--genes",
        *SCREENED[:3],
        "--out",
        str(tmp_path / "two.csv"),
        "--cpu-processes",
        "1",
    ]
    assert main(two) == 0 and (read_table(tmp_path / "two.csv")["models"] == 2).all()


def test_all_perturbable_genes_over_replicates_are_those_of_the_first_models_vocabulary(
    replicates, tmp_path, capsys, command_logging, monkeypatch
):
    loaded = []

    def load_with_a_short_vocabulary(folder, overrides=()):
        gears = load_run(folder, overrides)
        gears.pert_list = gears.pert_list[len(loaded) : len(loaded) + 4]  # each model another list: the first counts
        loaded.append(gears)
        return gears

    monkeypatch.setattr(pair_screens_module, "load_run", load_with_a_short_vocabulary)
    out = tmp_path / "all.csv"
    command = ["screen", "--run", str(replicates), "--all-perturbable", "--out", str(out), "--cpu-processes", "1"]
    assert main(command) == 0
    assert json.loads(out.with_suffix(".json").read_text())["genes"] == loaded[0].pert_list
    assert len(read_table(out)) == 6


@pytest.mark.parametrize(
    "options, message",
    [
        (
            ["--out", "{tmp}/a_file/screen.csv"],
            "the screen's table cannot be written to {tmp}/a_file/screen.csv: {tmp}/a_file is a file, not a folder",
        ),
        (["--run", "{replicates}", "--out", "{tmp}/a_file/screen.csv"], "{tmp}/a_file is a file, not a folder"),
        (["--out", "{tmp}/screen.tsv"], r"the screen's table is written as CSV: name it *.csv (got {tmp}/screen.tsv)"),
        (["--out", "{tmp}/folder.csv"], "{tmp}/folder.csv is a folder; the screen's table needs a file name"),
        (["--figure", "{tmp}/map.jpgx"], "--figure is written as a picture: name it *."),
        (
            ["--figure", "{tmp}/a_file/map.png"],
            "--figure cannot be written to {tmp}/a_file/map.png: {tmp}/a_file is a file",
        ),
        (["--changes-out", "{tmp}/changes.csv"], "--changes-out is written as AnnData: name it *.h5ad"),
        (["--changes-out", "{tmp}/a_file/changes.h5ad"], "{tmp}/a_file is a file, not a folder"),
        (
            ["--run", "{replicates}", "--changes-out", "{tmp}/changes.h5ad"],
            "--changes-out writes the changes one model predicts: give it with one run folder",
        ),
        (["--seed", "3"], "--seed draws control cells for --change drawn-cells-minus-control-mean only"),
        (
            ["--seed", "3", "4", "--change", DRAWN_CELLS_CHANGE],
            r"several --seed values ([3, 4]) measure the drawn cells' "
            "noise within the models of a screen over replicates",
        ),
        (
            ["--seed", "-1", "--change", DRAWN_CELLS_CHANGE],
            "seed of the drawn control cells must be a non-negative integer, got -1",
        ),
        (["--run", "{replicates}/seed-1", "{replicates}/seed-1"], r"run folders given more than once"),
        (["--run", "{tmp}/a_file"], "{tmp}/a_file is not a run folder: it has no config.yaml"),
        (["--run", "{replicates}", "--cpu-processes", "0"], "cpu_processes must be an integer >= 1, got 0"),
        (
            ["--out", "{tmp}/single.csv"],
            "{tmp}/single.json is the record of another kind of screen ('gears_ddp screen 1', "
            "not 'gears_ddp replicate screen 1'): pass overwrite=True (--overwrite)",
        ),
    ],
)
def test_every_mistake_with_the_pair_screen_command_gets_one_line_and_status_2(
    replicates, models, tmp_path, capsys, command_logging, options, message
):
    (tmp_path / "a_file").write_text("mine")
    (tmp_path / "folder.csv").mkdir()
    models[0].screen(SCREENED[:3], out=tmp_path / "single.csv")  # a screen of one model
    single = (tmp_path / "single.csv").read_bytes()
    run = ["--run", str(replicates / "seed-1")] if "--run" not in options else []
    if "{tmp}/single.csv" in options:
        run = ["--run", str(replicates)]
    command = ["screen", *run, "--genes", *SCREENED[:3], "--out", str(tmp_path / "new.csv"), "--cpu-processes", "1"]
    command += [option.format(tmp=tmp_path, replicates=replicates) for option in options]
    assert main(command) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert message.format(tmp=tmp_path, replicates=replicates) in error[-1]
    assert error[-1].startswith("gears-ddp screen: ") and not any("Traceback" in line for line in error)
    assert not (tmp_path / "new.csv").exists() and not (tmp_path / "new.models").exists()
    assert (tmp_path / "a_file").read_text() == "mine" and (tmp_path / "single.csv").read_bytes() == single


@pytest.mark.parametrize("one_model", [True, False])
def test_genes_outside_the_model_are_refused_before_any_model_is_loaded(
    replicates, tmp_path, capsys, command_logging, monkeypatch, one_model
):
    """The genes are checked against the saved model's vocabulary.json before the run and its
    data load (a screen of a large run spent its loading first); a gene that differs from
    one of the vocabulary only in case is shown beside it."""

    def never(*args, **kwargs):
        raise AssertionError("a run was loaded before the genes were checked")

    monkeypatch.setattr("gears_ddp.runs.saved_runs.load_run", never)
    monkeypatch.setattr(pair_screens_module, "load_run", never)
    run = replicates / "seed-1" if one_model else replicates
    command = ["screen", "--run", str(run), "--genes", "G0", "g1", "NOPE", "--out", str(tmp_path / "s.csv")]
    assert main(command) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    vocabulary = replicates / "seed-1" / "vocabulary.json"
    assert error == (
        f"gears-ddp screen: 2 gene(s) not in the perturbation vocabulary of the model in {replicates / 'seed-1'} "
        f"({vocabulary}): 'NOPE', 'g1' (gene symbols are case-sensitive: g1 -> G1)"
    )


def test_a_folder_the_command_may_not_write_in_gets_one_line_and_status_2(
    replicates, tmp_path, capsys, command_logging, monkeypatch
):
    def refuse(folder, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(folder.partial))

    monkeypatch.setattr(PairScreenFolder, "prepare", refuse)
    command = [
        "screen",
        "--run",
        str(replicates),
        "--genes",
        *SCREENED[:3],
        "--out",
        str(tmp_path / "screen.csv"),
        "--cpu-processes",
        "1",
    ]
    assert main(command) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == f"gears-ddp screen: [Errno 13] Permission denied: '{tmp_path / 'screen.models' / 'seed-1.partial'}'"


def test_the_command_help_says_what_every_column_means(capsys):
    with pytest.raises(SystemExit):
        main(["screen", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for meanings in (
        GI_SCORE_MEANINGS,
        INTERACTION_TYPE_MEANINGS,
        PAIR_SCREEN_COLUMN_MEANINGS,
        SUMMARY_COLUMN_MEANINGS,
    ):
        for name, meaning in meanings.items():
            assert f"{name} {' '.join(meaning.split())}" in text
    assert set(GI_SCORE_MEANINGS) == set(GI_SCORE_NAMES) and set(INTERACTION_TYPE_MEANINGS) == set(CALL_ORDER)


# ----------------------------------------------------------------------------- the picture


def test_the_picture_keeps_the_colour_of_confident_calls_and_greys_out_the_rest(tmp_path):
    summary = summarise_models({f"seed-{model}": [_table(model)] for model in range(3)})
    figure = figures.plot_replicate_pair_screen(summary, tmp_path / "map.png", top=3)
    assert (tmp_path / "map.png").stat().st_size > 20_000
    image = figure.axes[0].images[0].get_array()  # RGBA
    layout = figures._PairMap(summary, "mag_mean")  # where each pair is, and the colour scale
    colours, scale = figures._colours(), Normalize(-layout.limit, layout.limit)
    rank = np.argsort(layout.order)
    for pair, row in enumerate(summary.itertuples()):
        place = rank[layout.first[pair]], rank[layout.second[pair]]
        colour = np.asarray(colours(scale(np.log2(row.mag_mean))))[:3]
        if not row.magnitude_type_confident:
            colour = figures.GREYED_WEIGHT * colour + (1 - figures.GREYED_WEIGHT) * figures.GREYED_TO
        np.testing.assert_allclose(image[place][:3], colour, atol=1e-12)
        np.testing.assert_allclose(image[place[::-1]][:3], colour, atol=1e-12)
    assert sum(summary["magnitude_type_confident"]) == 3 < len(summary)
    text = figure.axes[1].texts[0].get_text()
    assert "confident synergy: 1 pair (" in text and "A0+B0" in text and "confident suppressor: 1 pair (" in text
    assert figure.axes[0].get_title().endswith(", 3 confident magnitude calls")
    assert "A5+B5" not in text.split("confident calls")[0]  # synergy in every model, but not confident
    assert "magnitude_type: additive 1, synergy 1, suppressor 1" in text
