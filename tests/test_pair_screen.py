"""In-silico combinatorial screens: the change vectors scored (exact, or the published
drawn-cells ones, equal to the published GI_predict), the screen's table, its resumable
output, its refusals, several processes, the command and the picture."""

import copy
import json
import logging
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from reference_package import published_gears

from gears_ddp import PertData
from gears_ddp.cli import main
from gears_ddp.configuration.run_options import resolved_config, write_run_config
from gears_ddp.configuration.sections import SplitConfig, TrainingArgs
from gears_ddp.distributed import pair_screen_workers
from gears_ddp.distributed.pair_screen_workers import SCREEN_CTRL_C_NOTICE, SCREEN_ENDED, pair_screen_on_devices
from gears_ddp.gears import GEARS
from gears_ddp.inference.figures import _clustered_order, plot_pair_screen
from gears_ddp.inference.pair_screen_job import PairScreenFolder, checked_pair_screen_genes, read_table, write_table
from gears_ddp.inference.prediction import DRAWN_CELLS_CHANGE, PREDICTION_CELLS, control_draws, query_sets
from gears_ddp.interactions.calls import interaction_types
from gears_ddp.interactions.scores import GI_SCORE_NAMES

GENES = [f"G{i}" for i in range(9)]  # 36 pairs
NO_EDGES = (torch.zeros(2, 0, dtype=torch.long), torch.zeros(0))


def _trained(data_folder, seed=0, epochs=2):
    """A small GEARS trained on the toy data, without co-expression edges: the published model
    gives only the first cell of a batch the co-expression messages, so without edges its
    predictions of 300 cells equal ours cell by cell."""
    pert_data = PertData(data_folder)
    pert_data.load(data_path=data_folder / "toy")
    pert_data.prepare_split("simulation", seed=1)
    pert_data.get_dataloader(16, test_batch_size=64)
    torch.manual_seed(seed)
    gears = GEARS(pert_data)
    gears.model_initialize(hidden_size=8, G_coexpress=NO_EDGES[0], G_coexpress_weight=NO_EDGES[1])
    gears.train(epochs=epochs)
    return gears


@pytest.fixture(scope="module")
def gears(data_folder):
    return _trained(data_folder)


@pytest.fixture(scope="module")
def table(gears):
    """The screen of ``GENES`` in this process, in chunks of 5 pairs (8 chunks)."""
    return gears.screen(GENES, chunk_pairs=5)


def _assert_close_scores(got, expected, what="", distance=1e-5):
    """Scores of change vectors that differ by float32 rounding. The distance correlations
    move by about that much (``distance``). The Theil-Sen coefficients are a spatial median
    that stops at the first step under 1e-3 (scikit-learn's tolerance): inputs moved by 1e-9
    change the step it stops at and the coefficients by up to about 5e-4, so they agree to
    1e-3, ``dominance`` (``|log10(c1 / c2)|``) to what that implies, and ``corr_fit``, the
    correlation of the fit ``c1 * A + c2 * B`` with the combination's change, which moves
    with them, to 1e-4 (1.6e-5 where the coefficients moved by 2.9e-4 and 2.3e-4)."""
    tolerance = {
        "c1": 1e-3,
        "c2": 1e-3,
        "mag": 1e-3,
        "corr_fit": 1e-4,
        "dominance": 1e-3 * (1 / abs(expected["c1"]) + 1 / abs(expected["c2"])) / np.log(10),
    }
    for name in GI_SCORE_NAMES:
        assert got[name] == pytest.approx(float(expected[name]), abs=tolerance.get(name, distance), nan_ok=True), (
            what,
            name,
        )


# ----------------------------------------------------------------------------- change vectors


def test_exact_change_is_the_prediction_over_control_cells_minus_their_mean(gears):
    """In float64, as the predictor evaluates the model."""
    sets = query_sets([["G3"], ["G3", "G8"]], gears.node_map_pert)
    changes = gears.change_predictor().changes(sets)
    cells = gears.pert_data.cells.rows(gears.pert_data.cells.control_cells()[:50]).double()
    model = copy.deepcopy(gears.best_model).double()
    with torch.no_grad():
        for row, query in enumerate(sets):
            predicted = model(cells, query.repeat(len(cells), 1))
            torch.testing.assert_close(changes[row], (predicted - cells).mean(0), rtol=0, atol=1e-12)
            float32 = gears.best_model(cells.float(), query.repeat(len(cells), 1)) - cells.float()
            torch.testing.assert_close(changes[row].float(), float32.mean(0), rtol=0, atol=2e-6)


def test_drawn_cells_change_is_the_mean_over_drawn_cells_minus_the_control_mean(gears):
    sets = query_sets([["G3"], ["G8", "G3"], ["G3", "G8"]], gears.node_map_pert)
    table = gears.pert_data.cells
    controls = table.control_cells()
    draws = control_draws(sets, len(controls), seed=4)
    assert draws.shape == (3, PREDICTION_CELLS) and torch.equal(draws[1], draws[2])  # a set, in either order
    assert not torch.equal(draws[0], draws[1])
    changes = gears.change_predictor(DRAWN_CELLS_CHANGE, seed=4).changes(sets)
    model = copy.deepcopy(gears.best_model).double()
    with torch.no_grad():
        for row, query in enumerate(sets):
            cells = table.rows(controls[draws[row]]).double()
            expected = model(cells, query.repeat(len(cells), 1)).mean(0) - table.control_mean().double()
            torch.testing.assert_close(changes[row], expected, rtol=0, atol=1e-5)  # the cells summed in float32
    exact = gears.change_predictor().changes(sets)
    assert float((changes - exact).abs().max()) > 1e-3  # the drawn cells' noise


def test_published_option_equals_the_published_gi_predict_with_the_same_control_cells(gears, monkeypatch):
    """The published GI_predict, unchanged, on the same weights, fed the control cells our
    option draws (its np.random.randint answers with them, in its order: A, B, A+B).

    Its predictions are float32 means over 300 cells; ours are the same sums in another
    order, so the changes differ by float32 rounding (about 1e-6 of the expression). That,
    not dcor's float32 arithmetic (1e-7 here), sets the tolerance (``_assert_close_scores``):
    the distance correlations and the fit's correlation move by about 1e-6. On identical
    change vectors the scores agree to 1e-9 (test_interaction_scores.py)."""
    combo = ["G2", "G7"]
    sets = query_sets([[combo[0]], [combo[1]], combo], gears.node_map_pert)
    draws = iter(control_draws(sets, len(gears.pert_data.cells.control_cells()), seed=3).numpy())
    published = published_gears(gears)
    monkeypatch.setattr(np.random, "randint", lambda *args, **kwargs: next(draws))
    theirs = published.GI_predict(combo, GI_genes_file=None)
    monkeypatch.undo()
    ours = gears.GI_predict(combo, change=DRAWN_CELLS_CHANGE, seed=3)
    exact = gears.GI_predict(combo)
    _assert_close_scores(ours, theirs, "published GI_predict")
    assert max(abs(exact[name] - ours[name]) for name in GI_SCORE_NAMES) > 0.05  # the noise the option keeps


# ----------------------------------------------------------------------------- the screen's table


def test_pair_screen_table_rows_are_the_gi_predict_scores_of_each_pair(gears, table):
    assert len(table) == 36 and list(table["pair"][:3]) == ["G0+G1", "G0+G2", "G0+G3"]
    assert list(table.columns[:3]) == ["pair", "first_gene", "second_gene"]
    for row in table.sample(4, random_state=0).itertuples():
        single = gears.GI_predict([row.first_gene, row.second_gene])  # another forward pass: float32 rounding
        _assert_close_scores(row._asdict(), single, row.pair, distance=1e-7)
    train = set(gears.pert_data.set2conditions["train"])
    for row in table.itertuples():
        assert row.seen_in_training == (
            f"{row.first_gene}+{row.second_gene}" in train or f"{row.second_gene}+{row.first_gene}" in train
        )
        assert row.singles_in_training == sum(f"{g}+ctrl" in train for g in (row.first_gene, row.second_gene))
    assert table["seen_in_training"].any() and not table["seen_in_training"].all()
    types = interaction_types(table)
    assert all((table[name] == values).all() for name, values in types.items())


def test_scores_on_a_gene_list_are_those_of_gi_genes_file(gears, tmp_path):
    listed = tmp_path / "genes.txt"
    listed.write_text("\n".join(f"G{i}" for i in range(0, 40, 2)) + "\nNOT_A_GENE\n")
    table = gears.screen(GENES[:4], GI_genes_file=listed)
    everything = gears.screen(GENES[:4])
    for row in table.itertuples():
        _assert_close_scores(
            row._asdict(),
            gears.GI_predict([row.first_gene, row.second_gene], GI_genes_file=listed),
            row.pair,
            distance=1e-7,
        )
    assert not np.allclose(table["dcor"], everything["dcor"], atol=1e-6)
    listed.write_text("G1\nG2\n")
    with pytest.raises(ValueError, match=r"genes.txt names 2 of the data's genes.*at least 3"):
        gears.screen(GENES[:4], GI_genes_file=listed)


def test_interaction_types_follow_the_published_thresholds():
    scores = {
        "mag": np.array([1.31, 1.29, 0.71, 0.69, 1.0]),
        "corr_fit": np.array([0.84, 0.85, np.nan, 0.9, 0.9]),
        "dcor": np.array([0.81, 0.8, 0.5, 0.9, 0.2]),
        "dominance": np.array([0.26, 0.25, np.inf, np.nan, 0]),
    }
    types = interaction_types(scores)
    assert list(types["magnitude_type"]) == ["synergy", "additive", "additive", "suppressor", "additive"]
    assert list(types["neomorphic"]) == [True, False, False, False, False]
    assert list(types["redundant"]) == [True, False, False, True, False]
    assert list(types["epistasis"]) == [True, False, True, False, False]


# ----------------------------------------------------------------------------- resumable output


class Interrupted(Exception):
    pass


def test_an_interrupted_pair_screen_resumes_to_the_same_table(gears, table, tmp_path, monkeypatch):
    whole = table
    out = tmp_path / "screen.csv"
    written = []
    original = PairScreenFolder.write_chunk

    def write_then_stop(folder, chunk, scores):
        if len(written) == 3:
            raise Interrupted
        original(folder, chunk, scores)
        written.append(chunk)

    monkeypatch.setattr(PairScreenFolder, "write_chunk", write_then_stop)
    with pytest.raises(Interrupted):
        gears.screen(GENES, out=out, chunk_pairs=5)
    assert not out.exists() and len(list((tmp_path / "screen.partial").glob("chunk-*.npz"))) == 3
    monkeypatch.undo()
    computed = []
    monkeypatch.setattr(
        PairScreenFolder,
        "write_chunk",
        lambda folder, chunk, scores: (computed.append(chunk), original(folder, chunk, scores)),
    )
    resumed = gears.screen(GENES, out=out, chunk_pairs=5)
    assert sorted(computed) == [3, 4, 5, 6, 7]  # only what was missing
    pd.testing.assert_frame_equal(resumed, whole, check_exact=True)
    pd.testing.assert_frame_equal(read_table(out), whole, check_exact=True)  # the file holds every digit
    record = json.loads((tmp_path / "screen.json").read_text())
    assert record["genes"] == GENES and record["pairs"] == 36 and record["change"] == "exact"
    assert not (tmp_path / "screen.partial").exists()
    computed.clear()
    pd.testing.assert_frame_equal(gears.screen(GENES, out=out, chunk_pairs=5), whole, check_exact=True)
    assert computed == []  # a finished screen is read back, not computed again


def test_a_pair_screen_of_another_model_or_options_is_refused_unless_overwritten(gears, data_folder, tmp_path):
    out = tmp_path / "screen.csv"
    gears.screen(GENES[:4], out=out)
    other = _trained(data_folder, seed=1, epochs=1)
    with pytest.raises(
        FileExistsError,
        match=r"screen.json holds a screen that differs in the model's weights and graphs "
        r"\(training there, training here\); pass overwrite=True \(gears-ddp screen --overwrite\)",
    ):
        other.screen(GENES[:4], out=out)
    with pytest.raises(
        FileExistsError,
        match=r"differs in the screened genes \(4 there, 5 here; only here: G4\); the change vectors scored "
        rf"\(exact there, {DRAWN_CELLS_CHANGE} here\); the seed of the drawn control cells \(none there, 0 here\); "
        r"pass overwrite=True \(gears-ddp screen --overwrite\) to replace it",
    ):
        gears.screen(GENES[:5], out=out, change=DRAWN_CELLS_CHANGE)
    with pytest.raises(
        FileExistsError,
        match=r"the screened genes \(the same genes in another order, which orders the pairs otherwise\)",
    ):
        gears.screen(GENES[3::-1], out=out)
    with pytest.raises(FileExistsError, match=r"the chunk size \(256 there, 5 here\)"):
        gears.screen(GENES[:4], out=out, chunk_pairs=5)
    replaced = other.screen(GENES[:4], out=out, overwrite=True)
    pd.testing.assert_frame_equal(read_table(out), replaced, check_exact=True)
    assert (
        json.loads((tmp_path / "screen.json").read_text())["model"]["weights"]
        != gears.pair_screen_job(GENES[:4]).model["weights"]
    )
    foreign = tmp_path / "mine.csv"
    foreign.write_text("my,own\n1,2\n")
    with pytest.raises(FileExistsError, match=r"mine.csv exists and is not a screen's table"):
        gears.screen(GENES[:4], out=foreign)
    assert foreign.read_text() == "my,own\n1,2\n"
    with pytest.raises(ValueError, match=r"name it \*.csv"):
        gears.screen(GENES[:4], out=tmp_path / "screen.tsv")


@pytest.mark.parametrize(
    "record, message",
    [
        ("{broken", r"cannot read the screen record .*screen.json: .*; remove it, or pass overwrite=True "),
        ('{"format": "other"}', r"not the record of a screen of one model .*; remove it, or pass overwrite=True "),
        ("[1]", r"screen.json is not a screen record; remove it, or pass overwrite=True "),
    ],
)
def test_a_broken_record_names_both_forms_of_overwrite_and_overwrite_replaces_it(gears, tmp_path, record, message):
    out = tmp_path / "screen.csv"
    gears.screen(GENES[:3], out=out)
    (tmp_path / "screen.json").write_text(record)
    with pytest.raises(ValueError, match=message + r"\(gears-ddp screen --overwrite\)"):
        gears.screen(GENES[:3], out=out)
    replaced = gears.screen(GENES[:3], out=out, overwrite=True)  # the fix the message names works
    assert json.loads((tmp_path / "screen.json").read_text())["genes"] == GENES[:3]
    pd.testing.assert_frame_equal(read_table(out), replaced, check_exact=True)


@pytest.mark.parametrize(
    "genes, message",
    [
        (["G1"], r"at least 2 genes .* got 1: \['G1'\]"),
        ("G1 G2", "must be a list of gene names"),
        (["G1", "G2", "G1"], r"named more than once: \['G1'\]"),
        (
            ["G1", "NOPE", "G2", "ALSO_NOT"],
            r"2 of the 4 genes cannot be perturbed by this model; without GO annotation "
            r".*\['NOPE', 'ALSO_NOT'\]",
        ),
    ],
)
def test_bad_gene_lists_are_refused_naming_the_problem(gears, genes, message):
    with pytest.raises(ValueError, match=message):
        gears.screen(genes)


def test_gpus_asked_for_without_cuda_are_refused_naming_the_cpu_processes_option(gears, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without CUDA
    with pytest.raises(
        ValueError,
        match=r"--gpu-ids / gpu_ids=\[0, 1\] asks for GPUs, but torch sees no CUDA GPU here .*pass --cpu-processes N "
        r"\(cpu_processes=N to pair_screen_on_devices or pair_screen_replicates\)",
    ):
        pair_screen_on_devices(gears, GENES[:3], gpu_ids=[0, 1])


def test_genes_without_go_and_outside_the_vocabulary_are_named_apart():
    with pytest.raises(
        ValueError,
        match=r"3 of the 4 genes cannot be perturbed by this model; without GO annotation "
        r".*: \['X', 'Z'\]; annotated in GO but not in the model's perturbation "
        r"vocabulary \(GEARS.pert_list\): \['Y'\]",
    ):
        checked_pair_screen_genes(["A", "X", "Y", "Z"], {"A": 0, "B": 1}, {"A": {"GO:1"}, "Y": {"GO:2"}})


# ----------------------------------------------------------------------------- several processes, the command


@pytest.mark.distributed
@pytest.mark.slow
def test_a_pair_screen_split_over_two_processes_equals_the_one_process_table(gears, table, tmp_path):
    """Chunks are shared between 2 spawned processes: sent to the parent, or written to the
    output (here with the published change vectors), the table is the one-process table."""
    pd.testing.assert_frame_equal(
        pair_screen_on_devices(gears, GENES, cpu_processes=2, chunk_pairs=5), table, check_exact=True
    )
    options = {"chunk_pairs": 3, "change": DRAWN_CELLS_CHANGE}
    written = pair_screen_on_devices(
        gears, GENES[:6], out=tmp_path / "screen.csv", cpu_processes=2, seeds=[2], **options
    )
    pd.testing.assert_frame_equal(written, gears.screen(GENES[:6], seed=2, **options), check_exact=True)
    assert json.loads((tmp_path / "screen.json").read_text())["seed"] == 2


def test_a_stop_tells_of_the_screen_s_chunks_not_of_training_steps(gears, tmp_path, monkeypatch):
    """The workers of a screen end at once on a stop; what is said of it is the screen's."""
    asked = {}

    def spawned(*args, **words):
        asked.update(words)
        raise InterruptedError  # as a stop would, before any chunk

    monkeypatch.setattr(pair_screen_workers, "spawn_workers", spawned)
    with pytest.raises(InterruptedError):
        pair_screen_on_devices(gears, GENES[:4], out=tmp_path / "screen.csv", cpu_processes=2)
    assert asked == {"ctrl_c_notice": SCREEN_CTRL_C_NOTICE, "ended": SCREEN_ENDED}
    assert "chunks" in SCREEN_CTRL_C_NOTICE and "checkpoint" not in SCREEN_CTRL_C_NOTICE + SCREEN_ENDED


def test_the_pair_screen_command_writes_the_table_record_picture_and_changes(
    gears, data_folder, tmp_path, capsys, monkeypatch
):
    import anndata

    library_logger = logging.getLogger("gears_ddp")  # the command's console handler leaves with the test
    monkeypatch.setattr(library_logger, "handlers", list(library_logger.handlers))
    monkeypatch.setattr(library_logger, "level", library_logger.level)

    run = tmp_path / "run"
    gears.save_model(run)
    args = TrainingArgs.from_dict({"batch_size": 16, "model_config": {"hidden_size": 8}})
    write_run_config(
        run, resolved_config(str(data_folder), "toy", SplitConfig.from_dict({"split": "simulation", "seed": 1}), args)
    )
    genes_file = tmp_path / "genes.txt"
    genes_file.write_text("\n".join(GENES[:6]))
    out = tmp_path / "out" / "screen.csv"
    command = [
        "screen",
        "--run",
        str(run),
        "--genes-file",
        str(genes_file),
        "--out",
        str(out),
        "--cpu-processes",
        "1",
        "--changes-out",
        str(tmp_path / "changes.h5ad"),
    ]
    assert main(command) == 0
    printed = capsys.readouterr().out
    table = read_table(out)
    expected = gears.screen(GENES[:6])
    pd.testing.assert_frame_equal(table, expected, check_exact=True)  # the same chunks and forward passes
    assert f"highest mag: {expected.at[expected['mag'].idxmax(), 'pair']}" in printed
    assert (tmp_path / "out" / "screen.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "out" / "screen.json").read_text())["genes"] == GENES[:6]
    changes = anndata.read_h5ad(tmp_path / "changes.h5ad")
    assert changes.X.dtype == np.float32  # as docs/screens.md says: half the size of float64
    assert list(changes.obs_names[:7]) == [f"{g}+ctrl" for g in GENES[:6]] + ["G0+G1"] and changes.n_obs == 6 + 15
    sets = query_sets([["G0"], ["G0", "G1"]], gears.node_map_pert)
    np.testing.assert_allclose(changes.X[[0, 6]], gears.change_predictor().changes(sets).numpy(), atol=1e-6)
    assert main(command[:3] + ["--genes", "G1", "NOPE", "--out", str(out)]) == 2
    assert f"1 gene(s) not in the perturbation vocabulary of the model in {run} " in capsys.readouterr().err
    other = command[:3] + ["--genes", "G1", "G2", "G3", "--out", str(out), "--cpu-processes", "1"]
    assert main(other) == 2 and (
        "holds a screen that differs in the screened genes (6 there, 3 here; only there: G0, G4, G5); "
        "pass overwrite=True (gears-ddp screen --overwrite)" in capsys.readouterr().err
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without CUDA
    assert main(other[:-2] + ["--gpu-ids", "0", "1"]) == 2
    refused = capsys.readouterr().err
    assert "asks for GPUs, but torch sees no CUDA GPU here" in refused and "pass --cpu-processes N" in refused
    assert main(other + ["--overwrite"]) == 0 and len(read_table(out)) == 3


def test_the_docs_name_the_partial_folder_and_the_record_the_code_writes():
    """An interrupted screen's chunks are where docs/screens.md sends the reader (the folder
    keeps its name: partial screens of earlier versions resume)."""
    folder = PairScreenFolder("screens/norman.csv")
    text = (Path(__file__).parents[1] / "docs" / "screens.md").read_text()
    assert folder.partial.as_posix() == "screens/norman.partial"
    assert f"`{folder.partial.as_posix()}/`" in text and f"`{folder.record_file.as_posix()}`" in text
    assert "<out>.partial" not in text and "<out>.json" not in text


def test_the_picture_names_the_most_synergistic_and_suppressive_pairs(table, tmp_path):
    figure = plot_pair_screen(table, tmp_path / "map.png", top=3)
    text = figure.axes[1].texts[0].get_text()
    by_mag = table.sort_values("mag")
    for pair in [*by_mag["pair"][:3], *by_mag["pair"][-3:]]:
        assert pair in text
    assert (tmp_path / "map.png").stat().st_size > 20_000
    heatmap = np.ma.filled(figure.axes[0].images[0].get_array(), np.nan)  # genes clustered: any order
    assert np.isnan(np.diag(heatmap)).all() and np.array_equal(heatmap, heatmap.T, equal_nan=True)
    np.testing.assert_allclose(np.sort(heatmap[np.triu_indices(len(GENES), 1)]), np.sort(np.log2(table["mag"])))


def test_a_small_screen_marks_and_names_each_pair_once(table, tmp_path):
    """Five pairs and the lists' 10: the higher three are the synergistic list, the lower two
    the suppressive one; no pair is marked twice or named in both."""
    small = table.sort_values("mag").iloc[::8].reset_index(drop=True)  # 5 pairs
    figure = plot_pair_screen(small, tmp_path / "small.png", top=10)
    up, down = (collection for collection in figure.axes[0].collections[1:3])
    assert (len(up.get_offsets()), len(down.get_offsets())) == (3, 2)
    text = figure.axes[1].texts[0].get_text()
    assert all(text.count(f"{pair} ") == 1 for pair in small["pair"])
    trained = figure.axes[0].collections[0]  # the dots of pairs seen in training, above the lists' marks
    assert trained.get_label() == "pair seen in training" and trained.get_zorder() > up.get_zorder()


def test_a_table_reads_back_to_the_very_floats_it_was_written_with_and_no_deprecated_option(tmp_path):
    # pandas before 3.1 reads a float's shortest text back exactly only with float_precision=
    # "round_trip"; 3.1 deprecates that option (every converter is exact): either way, exact
    # and without a warning
    rng = np.random.default_rng(0)
    values = rng.standard_normal(20_000) * 10.0 ** rng.integers(-30, 30, 20_000)
    table = pd.DataFrame({"pair": [f"G{i}+G{i + 1}" for i in range(len(values))], "score": values, "whole": 1.0})
    write_table(table, tmp_path / "screen.csv")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        read = read_table(tmp_path / "screen.csv")
    pd.testing.assert_frame_equal(read, table, check_exact=True)


def test_the_map_clusters_genes_by_their_rows_and_a_zero_diagonal_is_no_distance_matrix():
    # a pair-score map is symmetric with a zero diagonal, as a distance matrix is: its rows are
    # still each gene's profile, clustered as scipy clusters observations, without its warning
    from scipy.cluster.hierarchy import leaves_list, linkage

    rng = np.random.default_rng(1)
    halves = np.abs(rng.standard_normal((30, 30)))
    matrix = halves + halves.T
    np.fill_diagonal(matrix, 0.0)
    matrix[0, 1] = matrix[1, 0] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        as_observations = leaves_list(linkage(np.nan_to_num(matrix), method="average"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        order = _clustered_order(matrix)
    assert np.array_equal(order, as_observations) and sorted(order) == list(range(30))
    assert list(_clustered_order(matrix[:2, :2])) == [0, 1]
