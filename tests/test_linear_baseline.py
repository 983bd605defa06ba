"""The linear baseline of Ahlmann-Eltze, Huber and Anders (``evaluation.linear_baseline``):
its predictions are the formula computed directly from the cells of the training
conditions, nothing of the test conditions moves them, and a gene without a row in the PCA
or a two-gene condition is placed as docs/evaluation.md says."""

import numpy as np
import pytest
import toy_data

from gears_ddp import PertData
from gears_ddp.data.conditions import CONTROL, condition_genes
from gears_ddp.evaluation.baselines import baseline_predictions
from gears_ddp.evaluation.linear_baseline import LinearModel

K, LAMBDA = 10, 0.1  # the paper's number of components and ridge penalty


def _direct_means(pert_data, conditions) -> dict:
    """Each condition's mean expression (float64) over its cells, one boolean mask each."""
    cells = pert_data.cells
    expression, codes = cells.expression.numpy().astype(np.float64), cells.condition_codes.numpy()
    return {c: expression[codes == cells.conditions.index(c)].mean(axis=0) for c in conditions}


def _gene_scores_by_eigenvectors(matrix: np.ndarray, k: int) -> np.ndarray:
    """The scores of the rows of ``matrix`` (columns centred) on the top ``k`` components,
    from the eigenvectors of the centred matrix's Gram matrix (another route than the SVD)."""
    centred = matrix - matrix.mean(axis=0)
    values, vectors = np.linalg.eigh(centred.T @ centred)
    return centred @ vectors[:, np.argsort(values)[::-1][:k]]


def _formula(control, changes, gene_scores, embedding, embedding_test):
    """control + G W P + b with W = (GᵀG + λI)⁻¹ Gᵀ (Y − b) Pᵀ (PPᵀ + λI)⁻¹, by inverses."""
    b = changes.mean(axis=1, keepdims=True)
    k_genes, k_perts = gene_scores.shape[1], embedding.shape[0]
    w = (
        np.linalg.inv(gene_scores.T @ gene_scores + LAMBDA * np.eye(k_genes))
        @ gene_scores.T
        @ (changes - b)
        @ embedding.T
        @ np.linalg.inv(embedding @ embedding.T + LAMBDA * np.eye(k_perts))
    )
    return (control[:, None] + gene_scores @ w @ embedding_test + b).T


@pytest.fixture
def screen(data_root):
    """The toy dataset with singles of 30 of its 40 genes, its expression in memory (so a test
    can change it), simulation split."""
    pert_data = PertData(data_root, expression_storage="memory")
    pert_data.new_data_process("toy", toy_data.make_raw(singles=[f"G{i}+ctrl" for i in range(30)]))
    pert_data.prepare_split("simulation", seed=1)
    return pert_data


def test_the_linear_baseline_is_the_formula_on_the_training_conditions(screen):
    train, test = screen.set2conditions["train"], screen.set2conditions["test"]
    assert CONTROL in train and any("ctrl" not in c for c in test)  # control is fitted; combinations are tested
    means = _direct_means(screen, train)
    genes = list(screen.gene_names)
    matrix = np.stack([means[c] for c in train], axis=1)  # genes x training conditions
    assert matrix.shape[1] - 1 > K  # ten components of real variance
    gene_scores = _gene_scores_by_eigenvectors(matrix, K)  # G
    control = means[CONTROL]

    def p(condition):
        rows = [gene_scores[genes.index(gene)] for gene in condition_genes(condition)]
        return np.sum(rows, axis=0) if rows else np.zeros(K)

    changes = np.stack([means[c] - control for c in train], axis=1)
    expected = _formula(
        control, changes, gene_scores, np.stack([p(c) for c in train], axis=1), np.stack([p(c) for c in test], axis=1)
    )
    predicted = baseline_predictions(screen, test)["linear"]
    np.testing.assert_allclose(predicted, expected, rtol=1e-7, atol=1e-9)
    assert not np.allclose(predicted, baseline_predictions(screen, test)["mean_effect"], atol=1e-3)


def test_the_test_conditions_cells_do_not_move_it_and_the_training_cells_do(screen):
    test = screen.set2conditions["test"]
    before = baseline_predictions(screen, test)["linear"]
    cells = screen.cells
    codes = cells.condition_codes.numpy()
    test_cells = np.isin(codes, [cells.conditions.index(c) for c in test])
    cells.expression[test_cells] += 1.0
    np.testing.assert_array_equal(baseline_predictions(screen, test)["linear"], before)
    trained_on = next(c for c in screen.set2conditions["train"] if c != CONTROL)
    cells.expression[codes == cells.conditions.index(trained_on)] += 1.0
    assert not np.allclose(baseline_predictions(screen, test)["linear"], before, atol=1e-6)


def _small_means(seed=0, genes=("A", "B", "C", "D", "E", "F")):
    """Made-up training means over six measured genes: control, singles of A, B, C and of X
    (not measured), and the combination A+B."""
    rng = np.random.default_rng(seed)
    return {c: rng.normal(2.0, 1.0, len(genes)) for c in ("ctrl", "A+ctrl", "B+ctrl", "C+ctrl", "X+ctrl", "A+B")}


def test_a_condition_with_an_unmeasured_gene_is_left_out_of_the_fit_and_that_gene_adds_zero():
    genes = ["A", "B", "C", "D", "E", "F"]
    means = _small_means()
    model = LinearModel.fit(means, genes, n_components=3)
    assert model.fitted == ["ctrl", "A+ctrl", "B+ctrl", "C+ctrl", "A+B"]  # X+ctrl: X has no row
    control, b = means["ctrl"], model.offset
    np.testing.assert_allclose(b, np.mean([means[c] - control for c in model.fitted], axis=0))
    np.testing.assert_allclose(model.predict(["X+ctrl", "Y+ctrl"]), [control + b, control + b])
    np.testing.assert_allclose(model.predict(["D+X"]), model.predict(["D+ctrl"]))


def test_a_combination_is_placed_by_the_sum_of_its_genes_rows():
    model = LinearModel.fit(_small_means(seed=1), ["A", "B", "C", "D", "E", "F"], n_components=3)
    base = model.control + model.offset
    double, first, second = model.predict(["D+E", "D+ctrl", "ctrl+E"])
    np.testing.assert_allclose(double - base, (first - base) + (second - base), atol=1e-12)
    assert not np.allclose(first, second)
    np.testing.assert_allclose(model.predict(["E+D"]), model.predict(["D+E"]))


def test_fewer_conditions_than_components_take_as_many_as_there_are():
    means = _small_means()
    model = LinearModel.fit(means, ["A", "B", "C", "D", "E", "F"])  # K = 10 asked, 6 conditions
    assert model.gene_scores.shape == (6, 6) and np.isfinite(model.predict(["D+E"])).all()


def test_no_control_in_the_training_set_is_refused():
    means = {c: m for c, m in _small_means().items() if c != CONTROL}
    with pytest.raises(ValueError, match="control cells in the training set"):
        LinearModel.fit(means, ["A", "B", "C", "D", "E", "F"])
