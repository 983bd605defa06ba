"""The run report's section on genetic interactions: the test combinations whose singles were
observed too, scored from their observed changes and from the model's predicted ones, and
how far the two agree (``report['interactions']``, written by ``GEARS.train_with`` from
``interactions.agreement.compare_calls``): per score the correlation and the mean
absolute difference over the pairs, per interaction type how many calls agree, with the
confusion table."""

from __future__ import annotations

from html import escape
from typing import Mapping

from gears_ddp.report.numbers import format_number

INTRO = (
    "Each test combination A+B whose singles A and B were observed too is scored twice, as GI_predict scores "
    "a pair: from its observed changes (each condition's mean expression minus the mean of the control cells) "
    "and from the changes GEARS predicts for A, B and A+B. The calls use the published thresholds (mag above "
    "1.3 synergy, below 0.7 suppressor; corr_fit below 0.85 neomorphic; dcor above 0.8 redundant; dominance "
    "above 0.25 epistasis; docs/observed-interactions.md)."
)


def interaction_section(interactions: Mapping | None) -> str:
    """The section's HTML ('' without observed test combinations)."""
    if not interactions:
        return ""
    agreement = interactions["agreement"]
    score_rows = "".join(
        f'<tr><td><code>{escape(name)}</code></td><td class="number">{format_number(values["pearson"])}</td>'
        f'<td class="number">{format_number(values["mean_absolute_error"])}</td>'
        f'<td class="number">{values["pairs"]}</td></tr>'
        for name, values in agreement["scores"].items()
    )
    parts = [
        f"<h2>Genetic interactions of the test combinations, observed and predicted</h2>\n<p>{escape(INTRO)}</p>",
        f"<p>{agreement['pairs']} test combinations with both singles observed.</p>",
        "<table>\n<tr><th>score</th><th>Pearson r, observed vs predicted</th><th>mean absolute difference</th>"
        f"<th>pairs</th></tr>\n{score_rows}\n</table>",
    ]
    for kind, values in agreement["types"].items():
        calls = list(values["confusion"])
        header = "".join(f"<th>predicted {escape(str(call))}</th>" for call in calls)
        rows = "".join(
            f"<tr><th>observed {escape(str(seen))}</th>"
            + "".join(f'<td class="number">{row[call]}</td>' for call in calls)
            + "</tr>"
            for seen, row in values["confusion"].items()
        )
        parts.append(
            f"<h3>{escape(kind)}: {values['agree']} of {agreement['pairs']} calls agree</h3>\n"
            f"<table>\n<tr><th></th>{header}</tr>\n{rows}\n</table>"
        )
    return "\n".join(parts)
