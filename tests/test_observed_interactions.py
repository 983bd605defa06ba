"""The observed combinations' interaction calls beside a model's: the pairs found, their scores
equal to the published route (observed means in saved_pred, then GI_predict), the predicted
table equal to GI_predict's scores, the agreement on tables built by hand, the run report's
section, and the command for a dataset, one run and replicates."""

import json
import pickle

import numpy as np
import pandas as pd
import pytest
import toy_data
from test_interaction_scores import _published_scores
from test_pair_screen import _assert_close_scores
from test_pair_screen_replicates import models, replicates  # noqa: F401 (fixtures: three trained runs)

from gears_ddp import GEARS, PertData
from gears_ddp.cli import main
from gears_ddp.inference.pair_screen_job import read_table
from gears_ddp.inference.prediction import query_sets
from gears_ddp.interactions.agreement import compare_calls
from gears_ddp.interactions.observed import observed_changes, observed_interactions, observed_pairs
from gears_ddp.interactions.scores import GI_SCORE_NAMES
from gears_ddp.report.numbers import format_number

TYPES = ("magnitude_type", "neomorphic", "redundant", "epistasis")


def test_the_observed_pairs_are_the_combinations_whose_singles_were_observed():
    conditions = ["ctrl", "A+ctrl", "ctrl+B", "A+B", "A+C", "C+D", "D+ctrl", "C+ctrl", "E+F"]
    assert observed_pairs(conditions) == [
        ("A+B", "A+ctrl", "ctrl+B"),
        ("A+C", "A+ctrl", "C+ctrl"),
        ("C+D", "C+ctrl", "D+ctrl"),
    ]


def test_observed_scores_are_gi_predicts_of_the_observed_means(trained_toy):
    """The published route (paper/Ext_Fig_7.ipynb): each condition's mean in saved_pred of a
    model with random weights, GI_predict per pair. One call gives the same scores."""
    table = trained_toy.observed_interactions()
    assert list(table.columns[:4]) == ["pair", "first_gene", "second_gene", "set"]
    assert list(table["pair"]) == [c for c in trained_toy.pert_data.cells.conditions if "ctrl" not in c]  # toy: all
    assert set(table["set"]) <= {"train", "val", "test"} and (table["set"] == "test").any()
    scorer = GEARS(trained_toy.pert_data)
    scorer.model_initialize(hidden_size=8)
    cells = trained_toy.pert_data.cells
    for condition in cells.conditions:
        rows = cells.condition_codes == cells.conditions.index(condition)
        key = "_".join(g for g in condition.split("+") if g != "ctrl")
        scorer.saved_pred[key] = cells.expression[rows].double().mean(0).numpy()
    for row in table.itertuples():
        _assert_close_scores(row._asdict(), scorer.GI_predict([row.first_gene, row.second_gene]), row.pair)
    test_only = trained_toy.observed_interactions(split="test")
    assert list(test_only["pair"]) == list(table["pair"][table["set"] == "test"])
    with pytest.raises(ValueError, match="split must be one of"):
        trained_toy.observed_interactions(split="tests")


def test_the_agreement_of_tables_built_by_hand():
    def table(mag, corr_fit, dominance):
        frame = pd.DataFrame({"pair": ["A+B", "C+D", "E+F"], **{name: [0.5, 0.5, 0.5] for name in GI_SCORE_NAMES}})
        frame["mag"], frame["corr_fit"], frame["dominance"] = mag, corr_fit, dominance
        frame["magnitude_type"] = ["synergy" if m > 1.3 else "suppressor" if m < 0.7 else "additive" for m in mag]
        frame["neomorphic"], frame["redundant"] = [c < 0.85 for c in corr_fit], [False] * 3
        frame["epistasis"] = [d > 0.25 if np.isfinite(d) else False for d in dominance]
        return frame

    observed = table([1.5, 1.0, 0.5], [0.9, 0.8, 0.95], [0.1, 0.5, np.nan])
    predicted = table([1.4, 1.5, 1.0], [0.9, 0.9, 0.9], [0.2, 0.1, 0.3])
    agreement = compare_calls(observed, predicted)
    assert agreement["pairs"] == 3
    assert agreement["scores"]["mag"] == {
        "pearson": pytest.approx(np.corrcoef([1.5, 1.0, 0.5], [1.4, 1.5, 1.0])[0, 1]),
        "mean_absolute_error": pytest.approx(1.1 / 3),
        "pairs": 3,
    }
    assert agreement["scores"]["dominance"]["pairs"] == 2  # the NaN pair left out
    assert np.isnan(agreement["scores"]["c1"]["pearson"])  # a constant score has no correlation
    assert agreement["types"]["magnitude_type"] == {
        "agree": 1,
        "share": pytest.approx(1 / 3),
        "confusion": {
            "additive": {"additive": 0, "synergy": 1, "suppressor": 0},
            "synergy": {"additive": 0, "synergy": 1, "suppressor": 0},
            "suppressor": {"additive": 1, "synergy": 0, "suppressor": 0},
        },
    }
    assert agreement["types"]["neomorphic"]["confusion"] == {"no": {"no": 2, "yes": 0}, "yes": {"no": 1, "yes": 0}}
    with pytest.raises(ValueError, match="hold other pairs"):
        compare_calls(observed, predicted.iloc[::-1])


@pytest.fixture(scope="module")
def reported_run(trained_toy, tmp_path_factory):
    """A model of the toy data trained one epoch with a run folder: (its GEARS, the report
    train returned, the folder)."""
    folder = tmp_path_factory.mktemp("reported") / "run"
    gears = GEARS(trained_toy.pert_data)
    gears.model_initialize(hidden_size=8)
    return gears, gears.train(epochs=1, save_path=folder), folder


def test_the_predicted_calls_are_gi_predicts_and_the_run_report_shows_the_agreement(trained_toy, reported_run):
    check = trained_toy.interaction_agreement()
    observed, predicted = check["observed"], check["predicted"]
    assert list(predicted["pair"]) == list(observed["pair"]) and (observed["set"] == "test").all()
    for row in predicted.itertuples():
        _assert_close_scores(row._asdict(), trained_toy.GI_predict([row.first_gene, row.second_gene]), row.pair)
    assert check["agreement"] == compare_calls(observed, predicted)
    unreported = GEARS(trained_toy.pert_data)
    unreported.model_initialize(hidden_size=8)
    assert "interactions" not in unreported.train(epochs=0)  # without a run report they are left to be asked for

    gears, report, folder = reported_run
    written = json.loads((folder / "report.json").read_text())["interactions"]
    assert written["set"] == "test" and len(written["pairs"]) == len(observed)
    assert [record["pair"] for record in written["pairs"]] == list(observed["pair"])
    assert written["pairs"][0]["observed"]["mag"] == pytest.approx(observed["mag"].iloc[0])
    assert set(written["pairs"][0]["predicted"]) == {*GI_SCORE_NAMES, *TYPES}
    assert written["agreement"]["pairs"] == report["interactions"]["agreement"]["pairs"]
    page = (folder / "report.html").read_text()
    assert "Genetic interactions of the test combinations, observed and predicted" in page
    assert f"magnitude_type: {written['agreement']['types']['magnitude_type']['agree']} of {len(observed)}" in page


def test_the_run_reports_interaction_numbers_are_the_published_packages(reported_run):
    """Every score of the report's test pairs, observed and predicted, and the agreement
    over them, read as the report writes them (4 significant digits) the same as the
    published ``get_GI_params``, pair by pair, gives them from the same changes: the
    batched, on-device scores change nothing the report shows."""
    gears, _, folder = reported_run
    written = json.loads((folder / "report.json").read_text())["interactions"]
    cells = gears.pert_data.cells
    pairs = [pair for pair in observed_pairs(cells.conditions) if pair[0] in gears.pert_data.set2conditions["test"]]
    assert [record["pair"] for record in written["pairs"]] == [pair[0] for pair in pairs] and pairs
    doubles, firsts, seconds = (observed_changes(cells, list(column)) for column in zip(*pairs))
    genes = [pair[0].split("+") for pair in pairs]
    queries = [[a] for a, _ in genes] + [[b] for _, b in genes] + genes
    predicted = gears.change_predictor().changes(query_sets(queries, gears.node_map_pert)).cpu().numpy()
    published = {
        side: [_published_scores(*changes) for changes in zip(*sides)]
        for side, sides in (("observed", (firsts, seconds, doubles)), ("predicted", np.split(predicted, 3)))
    }
    for row, record in enumerate(written["pairs"]):
        for side in ("observed", "predicted"):
            for name in GI_SCORE_NAMES:
                assert format_number(record[side][name]) == format_number(published[side][row][name]), (
                    record["pair"],
                    side,
                    name,
                )
    for name in GI_SCORE_NAMES:
        seen, called = (np.array([float(scores[name]) for scores in published[side]]) for side in published)
        finite = np.isfinite(seen) & np.isfinite(called)  # (dominance is infinite where a coefficient is 0)
        seen, called = seen[finite], called[finite]
        varied = len(seen) >= 2 and np.ptp(seen) > 0 and np.ptp(called) > 0
        expected = {
            "mean_absolute_error": np.abs(seen - called).mean() if len(seen) else None,
            "pearson": np.corrcoef(seen, called)[0, 1] if varied else None,
        }
        for measure, value in expected.items():
            assert format_number(written["agreement"]["scores"][name][measure]) == format_number(value), (name, measure)


def test_the_command_scores_a_dataset_one_run_and_replicates(data_folder, replicates, tmp_path, capsys):  # noqa: F811
    assert (
        main(
            ["interactions", "--data-path", str(data_folder), "--name", "toy", "--out", str(tmp_path / "observed.csv")]
        )
        == 0
    )
    observed = read_table(tmp_path / "observed.csv")
    assert len(observed) == 8 and "magnitude_type: " in capsys.readouterr().out

    one = replicates / "seed-1"
    assert main(["interactions", "--run", str(one), "--out", str(tmp_path / "one.csv")]) == 0
    out = capsys.readouterr().out
    table = read_table(tmp_path / "one.csv")
    assert {f"{side}_{name}" for side in ("observed", "predicted") for name in (*GI_SCORE_NAMES, *TYPES)} <= set(
        table.columns
    )
    assert (table["set"] == "test").all() and "observed pairs" in out and "mag: Pearson r" in out
    assert list(table.columns[4:6]) == ["seen_in_training", "singles_in_training"]
    assert not table["seen_in_training"].any() and set(table["singles_in_training"]) <= {0, 1, 2}
    agreement = json.loads((tmp_path / "one.json").read_text())
    assert agreement["pairs"] == len(table)

    assert main(["interactions", "--run", str(replicates), "--pairs", "all", "--out", str(tmp_path / "all.csv")]) == 0
    table = read_table(tmp_path / "all.csv")
    agreement = json.loads((tmp_path / "all.json").read_text())
    assert len(table) == 8 and list(agreement["models"]) == ["seed-1", "seed-2", "seed-3"]
    trained_by = np.where(table["set"] == "train", 3, 0)  # the three models share one split
    assert (table["seen_in_training"].to_numpy() == trained_by).all() and trained_by.any()
    means = np.mean([[m["scores"]["mag"]["pairs"] for m in agreement["models"].values()]])
    assert means == 8
    pd.testing.assert_series_equal(table["observed_mag"], observed["mag"], check_names=False)

    assert main(["interactions", "--data-path", str(data_folder), "--out", str(tmp_path / "x.csv")]) == 2
    assert "--data-path needs --name" in capsys.readouterr().err
    assert main(["interactions", "--run", str(one), "--out", str(tmp_path / "x.txt")]) == 2
    assert "name it *.csv" in capsys.readouterr().err


def test_observed_interactions_need_nothing_but_the_data(data_folder):
    pert_data = PertData(data_folder)
    pert_data.load(data_path=data_folder / "toy")
    table = observed_interactions(pert_data)
    assert len(table) == 8 and (table["set"] == "").all()  # no split: no set
    with pytest.raises(ValueError, match="no test set"):
        observed_interactions(pert_data, "test")


def test_the_command_names_a_mistyped_dataset_and_a_screen_without_pairs(data_folder, tmp_path, capsys):
    """A mistyped --data-path or --name is named before anything is fetched into it; a screen
    of single genes has no pair to score, which the command says rather than printing a
    table of none."""
    out = str(tmp_path / "observed.csv")
    typo = tmp_path / "dat"
    assert main(["interactions", "--data-path", str(typo), "--name", "toy", "--out", out]) == 2
    assert f"there is no folder {typo}/toy" in capsys.readouterr().err and not typo.exists()
    assert main(["interactions", "--data-path", str(data_folder), "--name", "TOY", "--out", out]) == 2
    assert "processing names the folder in lower case" in capsys.readouterr().err

    singles = tmp_path / "singles"
    toy_data.write_go_files(singles)
    PertData(singles).new_data_process("singles", toy_data.make_raw(combos=()))
    assert main(["interactions", "--data-path", str(singles), "--name", "singles", "--out", out]) == 2
    error = capsys.readouterr().err
    assert "no two-gene combination A+B whose singles A and B were observed too in dataset 'singles'" in error
    assert not (tmp_path / "observed.csv").exists()


def test_the_command_says_a_run_s_test_set_holds_no_pair_and_writes_strict_json(replicates, tmp_path, capsys):  # noqa: F811
    """Loaded with a split whose test set holds single genes only, a run has no test pair to
    compare: the command says so and how to take every pair. With one test pair, too few
    for a correlation, the agreement file holds null there, not JSON's invalid NaN."""
    one, out = str(replicates / "seed-1"), tmp_path / "one.csv"
    singles_test = _custom_split(tmp_path / "singles_test.pkl", test=[toy_data.SINGLES[0]])
    assert main(["interactions", "--run", one, *singles_test, "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert f"in the test set of {one}: nothing to compare (--pairs all takes every observed pair" in error
    assert not out.exists()

    one_pair_test = _custom_split(tmp_path / "one_pair_test.pkl", test=[toy_data.COMBOS[0]])
    assert main(["interactions", "--run", one, *one_pair_test, "--out", str(out)]) == 0
    text = out.with_suffix(".json").read_text()
    written = json.loads(text)
    assert "NaN" not in text and written["pairs"] == 1 and written["scores"]["mag"]["pearson"] is None


def _custom_split(path, test: list[str]) -> list[str]:
    """The --set options of a custom split of the toy data, written to ``path``: ``test`` its
    test set, one other single its validation set, the rest (control included) training."""
    val = next(single for single in toy_data.SINGLES if single not in test)
    train = [c for c in ["ctrl", *toy_data.SINGLES, *toy_data.COMBOS] if c not in test and c != val]
    path.write_bytes(pickle.dumps({"train": train, "val": [val], "test": test}))
    return ["--set", "split_config.split=custom", "--set", f"split_config.split_dict_path={path}"]
