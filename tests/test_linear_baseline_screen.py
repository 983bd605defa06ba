"""``linear_pretrained``: the linear baseline with the perturbations placed by the PCA of
another screen (``linear_baseline_screen``), read from a processed data folder or an h5ad
file; what it computes, against the formula computed directly, and the errors that name a
bad path or a screen that shares no perturbed gene."""

import numpy as np
import pytest
import toy_data
from test_linear_baseline import K, _direct_means, _formula, _gene_scores_by_eigenvectors

from gears_ddp import PertData
from gears_ddp.data.conditions import CONTROL, condition_genes
from gears_ddp.data.screen_means import read_screen_means
from gears_ddp.evaluation.baselines import PRETRAINED, baseline_predictions
from gears_ddp.evaluation.linear_baseline import LinearModel, other_screen_embedding
from gears_ddp.training.training_options import TrainingOptions

OTHER_SINGLES = [f"G{i}+ctrl" for i in range(0, 40, 2)]  # every other gene perturbed: G0, G2, ..., G38


@pytest.fixture(scope="module")
def other_screen(tmp_path_factory):
    """Another screen of the same genes (other cells, other seed), its singles of every other
    gene and two combinations, as an h5ad file in the GEARS notation."""
    raw = toy_data.make_raw(seed=7, singles=OTHER_SINGLES, combos=["G0+G2", "G4+G6"])
    path = tmp_path_factory.mktemp("other") / "other.h5ad"
    raw.write_h5ad(path)
    return raw, path


def test_another_screen_places_the_perturbations_by_the_pca_of_its_conditions(toy, other_screen):
    raw, path = other_screen
    x, conditions = raw.X.toarray().astype(np.float64), raw.obs["condition"].to_numpy()
    names = list(dict.fromkeys(conditions))
    other_means = np.stack([x[conditions == c].mean(axis=0) for c in names])  # conditions x genes
    scores = _gene_scores_by_eigenvectors(other_means, K)  # conditions as rows
    row = dict(zip(names, scores))

    def p(condition):
        if condition == CONTROL:
            return row[CONTROL]
        placed = [row[f"{gene}+ctrl"] for gene in condition_genes(condition) if f"{gene}+ctrl" in row]
        return np.sum(placed, axis=0) if placed else np.zeros(K)

    train, test = toy.set2conditions["train"], toy.set2conditions["test"]
    fitted = [c for c in train if all(f"{gene}+ctrl" in row for gene in condition_genes(c))]
    assert CONTROL in fitted and 2 < len(fitted) < len(train)  # genes the other screen left alone are not fitted
    means = _direct_means(toy, train)
    gene_scores = _gene_scores_by_eigenvectors(np.stack([means[c] for c in train], axis=1), K)
    changes = np.stack([means[c] - means[CONTROL] for c in fitted], axis=1)
    expected = _formula(
        means[CONTROL],
        changes,
        gene_scores,
        np.stack([p(c) for c in fitted], axis=1),
        np.stack([p(c) for c in test], axis=1),
    )

    embedding = other_screen_embedding(path, train)
    assert LinearModel.fit(_direct_means(toy, train), list(toy.gene_names), embedding).fitted == fitted
    predictions = baseline_predictions(toy, test, embedding)
    np.testing.assert_allclose(predictions[PRETRAINED], expected, rtol=1e-6, atol=1e-8)
    assert not np.allclose(predictions[PRETRAINED], predictions["linear"], atol=1e-3)
    assert PRETRAINED not in baseline_predictions(toy, test)


def test_a_processed_data_folder_reads_as_its_screen(data_root, other_screen):
    raw, path = other_screen
    PertData(data_root).new_data_process("other", raw)
    folder = read_screen_means(data_root / "other")
    from_file = read_screen_means(path)
    assert folder.source.endswith("perturb_processed.h5ad") and folder.conditions == from_file.conditions
    np.testing.assert_allclose(folder.means, from_file.means, rtol=1e-6)


def test_bad_paths_and_screens_are_named(tmp_path, toy, other_screen):
    train = toy.set2conditions["train"]
    with pytest.raises(FileNotFoundError, match="train\\(linear_baseline_screen=...\\)='.*nowhere'"):
        TrainingOptions.from_dict({"linear_baseline_screen": str(tmp_path / "nowhere")}, "train")
    with pytest.raises(FileNotFoundError, match="args\\['linear_baseline_screen'\\]"):
        TrainingOptions.from_dict({"linear_baseline_screen": str(tmp_path / "nowhere")}, "args")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty is a folder without perturb_processed.h5ad"):
        other_screen_embedding(tmp_path / "empty", train)
    (tmp_path / "notes.h5ad").write_text("not a screen")
    with pytest.raises(ValueError, match="notes.h5ad is not an h5ad file"):
        other_screen_embedding(tmp_path / "notes.h5ad", train)

    raw, _ = other_screen
    unnamed = raw.copy()
    del unnamed.obs["condition"]
    unnamed.write_h5ad(tmp_path / "unnamed.h5ad")
    with pytest.raises(ValueError, match="unnamed.h5ad has no obs\\['condition'\\] column"):
        other_screen_embedding(tmp_path / "unnamed.h5ad", train)
    counts = raw.copy()
    counts.X = np.round(np.expm1(raw.X.toarray()))
    counts.write_h5ad(tmp_path / "counts.h5ad")
    with pytest.raises(ValueError, match="counts.h5ad holds raw counts"):
        other_screen_embedding(tmp_path / "counts.h5ad", train)
    elsewhere = toy_data.make_raw(seed=3, singles=[f"G{i}+ctrl" for i in range(20, 30)], combos=[])
    elsewhere.write_h5ad(tmp_path / "elsewhere.h5ad")
    with pytest.raises(ValueError, match="elsewhere.h5ad perturbs none of the .* genes of this screen's training"):
        other_screen_embedding(tmp_path / "elsewhere.h5ad", train)
