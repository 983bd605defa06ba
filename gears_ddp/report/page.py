"""The run report page, ``report.html``: one page a biologist can open after a run.

It shows together what otherwise lies in several files: the outcome in one line, whether
the model learned, each test metric beside the baselines with a verdict, the pictures, the
per-epoch history and the run's settings. The frame, the verdict table and the pictures are
``page_builder``'s, shared with the replicates' summary page; this module adds what only a
run has: one value per method, the run's facts, the learning checks and the history.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from gears_ddp.evaluation.paired_bootstrap import BEATS, LOSES, NOT_APPLICABLE
from gears_ddp.evaluation.prediction_spread import spread_line, spread_warnings
from gears_ddp.report.equal_baselines import equal_baseline_groups, equal_baselines_notes, group_heading
from gears_ddp.report.interaction_section import interaction_section
from gears_ddp.report.learning import learning_checks
from gears_ddp.report.not_applicable import not_applicable_reason
from gears_ddp.report.numbers import format_comparison, format_duration, format_number
from gears_ddp.report.page_builder import (
    NO_PICTURES,
    not_applicable_cell,
    pictures_section,
    report_page,
    verdict_section,
)
from gears_ddp.report.verdicts import (
    MetricVerdict,
    interval_basis,
    outcome_line,
    report_verdicts,
    shown_subgroups,
    whole_test_set_name,
)

TITLE = "GEARS run report"
PICTURES_NOT_ASKED = "The pictures were not drawn: the run set <code>args.report_pictures</code> to false."
BASELINES_NOTE = (
    "Each baseline predicts from the training data only: <i>no_change</i> the control mean, "
    "<i>mean_effect</i> control plus the average effect of all training perturbations, "
    "<i>additive</i> control plus the sum of each gene's single-gene effect, <i>linear</i> the linear "
    "model of Ahlmann-Eltze et al. (Nature Methods 2025) on the principal components of the training "
    "conditions (<i>linear_pretrained</i>: perturbations placed by another screen's). "
    "n/a marks a comparison that is no verdict, as the baseline's value there is fixed by how it "
    "predicts (or there is no interval, as the cell says)."
)
HOW_TO_READ = (
    "Each baseline's cell: its value, then GEARS minus it, perturbation by perturbation, signed so that + "
    "favours GEARS: the mean difference, its 95% interval (a bootstrap over the test perturbations) and "
    "the perturbations GEARS won. GEARS beats a baseline (green) when the whole interval lies above 0, "
    "loses to it (red) when it lies below 0; an interval that holds 0 is no clear difference (grey): the "
    "test perturbations cannot tell the two apart. The picture below draws the same intervals."
)
ONE_SEED_NOTE = (
    "These intervals cover the test perturbations of one run: one model seed and one split seed. Seed "
    "to seed, the model itself moves; for intervals that cover the seeds too, run replicates "
    "(gears-ddp train --config config.yaml --seeds 1 2 3 4 5 --set args.save_path=NEW_FOLDER; "
    "docs/replicates.md)."
)
NO_TEST_SET = (
    '<h2>Test metrics</h2>\n<p class="note">This split has no test set, so the model was not scored on '
    "test conditions nor compared with the baselines.</p>"
)


def write_report_page(
    path, settings: dict, report: dict, pictures: dict[str, str] | None, verdicts: list[MetricVerdict] | None = None
) -> Path:
    """Write the page to ``path`` (a run folder's ``report.html``) and return the path.

    ``settings`` is the run's resolved configuration (nested dicts), ``report`` what the
    training returns (``model`` and ``baselines`` test summaries when the split has a test
    set, ``best_epoch``, ``history``, ``world_size``, optionally ``model_path``) and
    ``pictures`` maps each picture's title to its path relative to the page's folder (None:
    none drawn, as the run asked: ``args.report_pictures`` false);
    ``verdicts``: those of the report's shown subgroups, when the caller has them already
    (else read from the report: ``verdicts.report_verdicts``).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report_page(settings, report, pictures, verdicts), encoding="utf-8")
    return path


def render_report_page(
    settings: dict, report: dict, pictures: dict[str, str] | None, verdicts: list[MetricVerdict] | None = None
) -> str:
    """The page's HTML text."""
    tested = "model" in report
    baselines = report.get("baselines", {})
    if verdicts is None:
        verdicts = report_verdicts(report, (None, *shown_subgroups(report["model"]))) if tested else []
    outcome = outcome_line(verdicts, interval_basis(verdicts)) if tested else "No test set: the model was not tested"
    figures = [(relative, title, title) for title, relative in (pictures or {}).items()]
    sections = [
        _learning_section(report),
        _verdict_section(
            verdicts,
            equal_baseline_groups(baselines),
            whole_test_set_name(report["model"]),
            report.get("prediction_spread") or {},
        )
        if tested
        else NO_TEST_SET,
        interaction_section(report.get("interactions")),
        pictures_section("Pictures", figures, PICTURES_NOT_ASKED if pictures is None else NO_PICTURES),
        _history_section(report),
    ]
    facts = f'<p class="facts">{" &middot; ".join(_run_facts(report))}</p>'
    return report_page(TITLE, settings, outcome, sections, below=facts)


def _learning_section(report: dict) -> str:
    """Whether the model learned: ``report.learning.learning_checks`` as a list."""
    items = "".join(f"<li>{escape(line)}</li>" for line in learning_checks(report))
    return f"<h2>Did the model learn?</h2>\n<ul>{items}</ul>" if items else ""


def _run_facts(report: dict) -> list[str]:
    """Best epoch, world size, training time and the model's folder, as escaped phrases."""
    history = report.get("history") or []
    kept = (
        f"model kept from epoch {escape(str(report.get('best_epoch')))} of {len(history)} (lowest validation mse_de)"
        if history
        else "no epoch trained: the model as it was"
    )
    facts = [kept, f"world size {escape(str(report.get('world_size', 1)))} (training processes)"]
    seconds = [record.get("seconds") for record in history if record.get("seconds") is not None]
    if seconds:
        facts.append(f"training time {format_duration(sum(seconds))}")
    if report.get("model_path"):
        facts.append(f"model saved in <code>{escape(str(report['model_path']))}</code>")
    return facts


def _verdict_section(
    verdicts: list[MetricVerdict], groups: list[tuple[str, ...]], whole: str, spreads: dict[str, float]
) -> str:
    """The test metrics: GEARS's value beside each baseline's (one column for the baselines of
    a group, which predicted the same: ``equal_baselines``) with the paired difference, its
    95% interval and the perturbations GEARS won, coloured by that comparison's verdict; n/a,
    with the reason, where there is no interval; ``whole`` names all test conditions. Above
    the table, how to read it and whether predictions differ between perturbations
    (``spreads``: each method's spread ratio)."""

    def values(verdict: MetricVerdict) -> list[str]:
        cells = [f'<td class="number">{format_number(verdict.model)}</td>']
        for name in (group[0] for group in groups):
            comparison = verdict.comparisons.get(name)
            if comparison is None:
                cells.append('<td class="na">-</td>')
            elif not_applicable_reason(name, verdict.metric):
                cells.append(not_applicable_cell(comparison.reason))
            else:
                cue = {BEATS: "win", LOSES: "lose"}.get(comparison.verdict, "unknown")
                shown = (
                    escape(format_comparison(comparison))
                    if comparison.verdict != NOT_APPLICABLE
                    else f'n/a<br><span class="meaning">{escape(comparison.reason or "")}</span>'
                )
                cells.append(f'<td class="number {cue}">{format_number(verdict.baselines.get(name))}<br>{shown}</td>')
        return cells

    notes = [*equal_baselines_notes(groups), *spread_warnings(spreads), ONE_SEED_NOTE]
    intro = (
        f"<p>{BASELINES_NOTE}</p>\n<p>{escape(HOW_TO_READ)}</p>\n"
        + (f"<p>{escape(spread_line(spreads)[0].upper() + spread_line(spreads)[1:])}</p>\n" if spreads else "")
        + "".join(f'<p class="note">{escape(note)}</p>\n' for note in notes)
    )
    return verdict_section(
        "Test metrics beside the baselines",
        intro,
        verdicts,
        ["GEARS", *(f"{escape(group_heading(group))}<br>difference [95% interval] won" for group in groups)],
        values,
        whole,
    )


def _history_section(report: dict) -> str:
    """One row per epoch, every recorded value; the kept epoch's row highlighted."""
    history = report.get("history") or []
    if not history:
        return "<h2>Training history</h2>\n<p>No epoch was recorded.</p>"
    columns = list(dict.fromkeys(key for record in history for key in record))
    header = "".join(f"<th>{escape(str(column))}</th>" for column in columns)
    rows = []
    for record in history:
        best = ' class="best"' if record.get("epoch") == report.get("best_epoch") else ""
        cells = "".join(f'<td class="number">{escape(format_number(record.get(column)))}</td>' for column in columns)
        rows.append(f"<tr{best}>{cells}</tr>")
    return (
        "<h2>Training history</h2>\n<p>Highlighted: the epoch whose model was kept. Seconds are wall-clock "
        f'time per epoch (training, then evaluation).</p>\n<div class="wide"><table>\n<tr>{header}</tr>\n'
        + "\n".join(rows)
        + "\n</table></div>"
    )
