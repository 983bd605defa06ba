"""Baselines that predict the same on a test set: one column and one bar for them, and why.

A baseline's predictions decide every one of its metrics, so two baselines whose test
summaries agree value for value predicted the same, and a page that shows both repeats a
column without a word. One case is expected: on a screen without two-gene combinations the
additive baseline is the mean-effect baseline. With no combination among the training
conditions, the mean effect is the mean single-gene effect; the additive baseline gives a
gene without a single-gene effect in training exactly that; and a simulation split tests
only genes not seen in training (docs/evaluation.md, the baselines).
"""

from __future__ import annotations

WHY_EQUAL = {
    frozenset(
        {"mean_effect", "additive"}
    ): "the training conditions hold no two-gene combination, so the mean effect is the mean single-gene "
    "effect, which the additive baseline gives each gene not seen in training, and the test set holds "
    "such genes only",
}


def equal_baseline_groups(baselines: dict[str, dict]) -> list[tuple[str, ...]]:
    """The baselines' names in order, those whose summaries are equal (every metric, NaN
    equal to NaN) put together in one group, at the place of the first; a group of one
    for a baseline like no other."""
    groups: list[list[str]] = []
    for name, summary in baselines.items():
        group = next((group for group in groups if _equal(baselines[group[0]], summary)), None)
        if group is None:
            groups.append([name])
        else:
            group.append(name)
    return [tuple(group) for group in groups]


def _equal(first: dict, second: dict) -> bool:
    return first.keys() == second.keys() and all(
        first[key] == second[key] or (first[key] != first[key] and second[key] != second[key]) for key in first
    )


def equal_baselines_notes(groups: list[tuple[str, ...]]) -> list[str]:
    """For each group of more than one baseline: that they predicted the same here, and why."""
    return [
        f"{' and '.join(group)} predicted the same on this test set, so they are shown as one: "
        + WHY_EQUAL.get(frozenset(group), "their test metrics are equal, every one")
        + "."
        for group in groups
        if len(group) > 1
    ]


def group_heading(group: tuple[str, ...]) -> str:
    """``'mean_effect = additive'``: a group's names as one column's heading."""
    return " = ".join(group)
