"""Which of a screen's perturbations a perturbation vocabulary covers.

GEARS embeds a perturbed gene through the GO graph, so it can only learn or predict the
perturbations whose genes are in the perturbation vocabulary (genes with GO terms). The
conditions with a gene outside it are dropped, as the published GEARS drops them, or, when
the user asked to keep every cell, the screen is refused; both ways the genes are named.
``PertData`` applies this when it loads or processes a dataset, and ``screen_check`` when it
checks one, with the same texts.
"""

from __future__ import annotations

from dataclasses import dataclass

from gears_ddp.data.conditions import CONTROL, condition_genes, genes_of_conditions
from gears_ddp.data.screen_report import Problem, listed

GO_FILES_ADVICE = "gears-ddp process --go-annotation FILE.gaf or --go-gene-sets FILE.gmt"


@dataclass(frozen=True)
class GoCoverage:
    """A screen's conditions against a perturbation vocabulary: its perturbed genes
    (sorted), those outside the vocabulary, the conditions holding one (``dropped``, in the
    screen's order) and their cells, and the conditions that stay (``kept``, in order)."""

    perturbed: list[str]
    outside: list[str]
    dropped: list[str]
    cells_dropped: int
    kept: list[str]

    @property
    def kept_perturbations(self) -> list[str]:
        return [condition for condition in self.kept if condition != CONTROL]


def go_coverage(cells_per_condition: dict[str, int], vocabulary) -> GoCoverage:
    """The ``GoCoverage`` of the conditions (``cells_per_condition``: condition -> its
    cells, in the screen's order) by ``vocabulary`` (a set or mapping of genes)."""
    known = {
        condition: all(gene in vocabulary for gene in condition_genes(condition)) for condition in cells_per_condition
    }
    perturbed = [str(gene) for gene in genes_of_conditions(cells_per_condition)]
    dropped = [condition for condition, ok in known.items() if not ok]
    return GoCoverage(
        perturbed,
        [gene for gene in perturbed if gene not in vocabulary],
        dropped,
        sum(cells_per_condition[condition] for condition in dropped),
        [condition for condition, ok in known.items() if ok],
    )


def coverage_problems(coverage: GoCoverage, name: str, where: str, drop_unannotated: bool) -> list[Problem]:
    """What ``coverage`` means for dataset ``name``, whose GO terms come from ``where``:
    genes outside the vocabulary stop it without ``drop_unannotated``, and are a warning
    (their cells dropped) with it; a screen none of whose perturbations is covered stops."""
    problems = []
    if coverage.dropped and not drop_unannotated:
        problems.append(
            Problem(
                "GO terms",
                f"dataset {name!r}: {len(coverage.outside)} perturbed gene(s) are outside "
                f"the perturbation vocabulary (no GO annotation in {where}): "
                f"{listed(coverage.outside)}, in {coverage.cells_dropped} cells; drop "
                "those cells (drop_unannotated=True; gears-ddp process "
                "--drop-unannotated) or build the GO files from annotations that cover "
                f"them ({GO_FILES_ADVICE})",
            )
        )
    elif coverage.dropped:
        problems.append(
            Problem(
                "GO terms",
                f"dropping {len(coverage.dropped)} conditions whose genes are not in the "
                f"perturbation vocabulary (no GO annotation in {where}: "
                f"{listed(coverage.outside)}), so their effect cannot be predicted: "
                f"{listed(coverage.dropped)}, {coverage.cells_dropped} cells; to keep "
                f"them, build the GO files from annotations that cover them "
                f"({GO_FILES_ADVICE})",
                stops=False,
            )
        )
    if not coverage.kept_perturbations:
        problems.append(
            Problem(
                "GO terms",
                f"no perturbation of dataset {name!r} is in the perturbation vocabulary; "
                f"check gene symbols against the GO annotations ({where}), or build the "
                f"GO files from annotations that cover them ({GO_FILES_ADVICE})",
            )
        )
    return problems
