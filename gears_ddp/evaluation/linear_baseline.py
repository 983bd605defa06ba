"""The linear baseline of Ahlmann-Eltze, Huber and Anders ("Deep-learning-based gene
perturbation effect prediction does not yet outperform simple linear baselines", Nature
Methods 2025), from the training conditions only.

On the mean log-normalised expression of each training condition (control among them):

- ``Y`` (genes x fitted conditions): each condition's mean minus the control mean;
- ``G`` (genes x K): the genes' scores on the top K = 10 principal components of the
  training conditions' means, genes as rows (each condition's column centred over the
  genes, as R's ``prcomp`` of that matrix centres it);
- ``P`` (K x fitted conditions): for each condition the sum of its perturbed genes' rows of
  ``G`` (zero for control), so an unseen gene is placed by its own measured expression;
- ``b``: the row means of ``Y``; ``W = (GᵀG + λI)⁻¹ Gᵀ (Y − b) Pᵀ (PPᵀ + λI)⁻¹``, λ = 0.1;
- the prediction of condition ``p``: control mean + ``G W P_p + b``.

Their best model takes ``P`` from another screen instead (``screen_embedding``): the PCA of
that screen's condition means with conditions as rows (each gene centred over the
conditions), a gene's row being the scores of that screen's condition perturbing it, and
control's row that of its control condition.

Where their code leaves a choice (the conditions fitted, a two-gene condition's ``P`` as
the sum of its genes' rows, a gene without a row adding zero), docs/evaluation.md ("The
baselines") says what is chosen here and why.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gears_ddp._logging import get_logger
from gears_ddp.data.conditions import CONTROL, condition_genes, genes_of_conditions, is_single
from gears_ddp.data.raw_screens import listed
from gears_ddp.data.screen_means import ScreenMeans, read_screen_means

logger = get_logger(__name__)

N_COMPONENTS = 10
RIDGE_PENALTY = 0.1


def principal_component_scores(matrix: np.ndarray, n_components: int = N_COMPONENTS) -> np.ndarray:
    """The scores (rows x components) of the rows of ``matrix`` on its top ``n_components``
    principal components, its columns centred and not scaled (R's ``prcomp(matrix)$x``):
    ``U_K S_K`` of the centred matrix's singular value decomposition. At most as many
    components as the matrix has rows or columns. A component's sign is arbitrary; the linear
    model's prediction does not depend on it."""
    centred = matrix - matrix.mean(axis=0)
    left, singular, _ = np.linalg.svd(centred, full_matrices=False)
    kept = min(n_components, len(singular))
    return left[:, :kept] * singular[:kept]


@dataclass(frozen=True)
class PerturbationEmbedding:
    """Where the perturbations lie in a PCA: ``rows``, the K coordinates of each perturbed
    gene that has them, and ``control``'s; ``source`` names the data of the PCA (the
    training data, or the file of another screen)."""

    rows: dict[str, np.ndarray]
    control: np.ndarray
    source: str

    def covers(self, condition: str) -> bool:
        """Whether every gene of ``condition`` has a row (control has)."""
        return all(gene in self.rows for gene in condition_genes(condition))

    def of(self, condition: str) -> np.ndarray:
        """``P`` of ``condition``: control's row for control, else the sum of its genes' rows
        (a gene without a row adds zero)."""
        if condition == CONTROL:
            return self.control
        zero = np.zeros_like(self.control)
        return sum((self.rows.get(gene, zero) for gene in condition_genes(condition)), zero)


def screen_embedding(screen: ScreenMeans, n_components: int = N_COMPONENTS) -> PerturbationEmbedding:
    """The perturbations of another screen as their PCA places them: the scores of its
    conditions' means (conditions as rows) on their top ``n_components`` components; a gene's
    row is that of the screen's single-gene condition perturbing it (the mean where it is
    written twice, ``A+ctrl`` and ``ctrl+A``), control's that of its control condition (zero
    when it has none)."""
    scores = principal_component_scores(screen.means, n_components)
    by_gene: dict[str, list[np.ndarray]] = {}
    for condition, row in zip(screen.conditions, scores):
        if is_single(condition):
            by_gene.setdefault(condition_genes(condition)[0], []).append(row)
    control = scores[screen.conditions.index(CONTROL)] if CONTROL in screen.conditions else np.zeros(scores.shape[1])
    return PerturbationEmbedding(
        {gene: np.mean(rows, axis=0) for gene, rows in by_gene.items()}, control, screen.source
    )


def other_screen_embedding(path, training_conditions) -> PerturbationEmbedding:
    """``screen_embedding`` of the screen at ``path`` (a processed data folder or an h5ad
    file: ``screen_means.read_screen_means``), checked to perturb at least one gene of
    ``training_conditions``: without one, the fit would see control alone."""
    embedding = screen_embedding(read_screen_means(path))
    genes = genes_of_conditions(training_conditions)
    if not any(gene in embedding.rows for gene in genes):
        raise ValueError(
            f"{embedding.source} perturbs none of the {len(genes)} genes "
            f"of this screen's training conditions ({listed(genes)}) in a single-gene condition, so its "
            "PCA places none of them; give a screen that perturbs some of the same genes (gene names "
            "as this screen writes them)"
        )
    return embedding


def ridge_weights(
    gene_scores: np.ndarray, changes: np.ndarray, embedding: np.ndarray, ridge: float = RIDGE_PENALTY
) -> np.ndarray:
    """``W = (GᵀG + λI)⁻¹ Gᵀ Y Pᵀ (PPᵀ + λI)⁻¹`` for ``G`` = ``gene_scores`` (genes x K),
    ``Y`` = ``changes`` (genes x conditions, centred) and ``P`` = ``embedding`` (K' x
    conditions), by two linear solves (``PPᵀ + λI`` is symmetric)."""
    left = np.linalg.solve(
        gene_scores.T @ gene_scores + ridge * np.eye(gene_scores.shape[1]), gene_scores.T @ changes @ embedding.T
    )
    return np.linalg.solve(embedding @ embedding.T + ridge * np.eye(embedding.shape[0]), left.T).T


@dataclass(frozen=True)
class LinearModel:
    """The fitted linear baseline: the control mean, ``G``, ``W``, ``b`` and the embedding
    that gives ``P``; ``fitted`` lists the training conditions it was fitted on."""

    control: np.ndarray
    gene_scores: np.ndarray
    weights: np.ndarray
    offset: np.ndarray
    embedding: PerturbationEmbedding
    fitted: list[str]

    @classmethod
    def fit(
        cls,
        training_means: dict[str, np.ndarray],
        gene_names,
        embedding: PerturbationEmbedding | None = None,
        n_components: int = N_COMPONENTS,
        ridge: float = RIDGE_PENALTY,
    ) -> "LinearModel":
        """Fit on ``training_means`` (each training condition's mean expression, control among
        them; genes in the order of ``gene_names``). ``embedding`` gives ``P``; None: the rows
        of the training data's own PCA for the perturbed genes that are measured."""
        if CONTROL not in training_means:
            raise ValueError("the linear baseline needs control cells in the training set")
        names = list(training_means)
        means = np.stack([training_means[name] for name in names])
        gene_scores = principal_component_scores(means.T, n_components)
        if embedding is None:
            embedding = PerturbationEmbedding(
                dict(zip(gene_names, gene_scores)), np.zeros(gene_scores.shape[1]), "the training data"
            )
        fitted = [name for name in names if embedding.covers(name)]
        control = training_means[CONTROL]
        changes = np.stack([training_means[name] - control for name in fitted], axis=1)
        offset = changes.mean(axis=1)
        perturbations = np.stack([embedding.of(name) for name in fitted], axis=1)
        weights = ridge_weights(gene_scores, changes - offset[:, None], perturbations, ridge)
        return cls(control, gene_scores, weights, offset, embedding, fitted)

    def predict(self, conditions: list[str]) -> np.ndarray:
        """The predicted mean expression (conditions x genes): control mean + ``G W P_p + b``."""
        missing = [condition for condition in conditions if not self.embedding.covers(condition)]
        if missing:
            logger.info(
                "linear baseline (the PCA of %s): %d of %d conditions perturb a gene without a row there (not "
                "measured, or not perturbed in that screen), which adds nothing to P; one of such genes "
                "alone is predicted as control + b: %s",
                self.embedding.source,
                len(missing),
                len(conditions),
                listed(missing),
            )
        perturbations = np.stack([self.embedding.of(condition) for condition in conditions], axis=1)
        return self.control + (self.gene_scores @ self.weights @ perturbations).T + self.offset
