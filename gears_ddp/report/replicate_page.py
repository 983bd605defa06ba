"""The replicates' summary page, ``report.html`` in the top-level run folder.

The frame, the verdict table and the pictures are ``page_builder``'s, shared with a run's
own page; this module adds what only replicates have: each method's mean ± sd and each
baseline's paired difference with its interval in the table's cells, the replicates that
did not finish, and a link to each replicate's own report.
"""

from __future__ import annotations

import os
from html import escape
from pathlib import Path

from gears_ddp.evaluation.paired_bootstrap import BEATS, INTERVAL_METHOD, LOSES, NOT_APPLICABLE
from gears_ddp.report.numbers import format_comparison, format_duration
from gears_ddp.report.page_builder import not_applicable_cell, pictures_section, report_page, verdict_section
from gears_ddp.report.replicate_summary import ReplicateVerdict
from gears_ddp.report.run_files import PAGE_FILE
from gears_ddp.report.verdicts import SUBGROUP_NAMES, outcome_line

TITLE = "GEARS replicates"


def render_replicate_page(
    settings: dict,
    replicates: list[dict],
    verdicts: list[ReplicateVerdict],
    pictures: dict[str, str],
    folder: Path,
    whole: str = SUBGROUP_NAMES[None],
) -> str:
    """The page's HTML text; ``pictures`` maps each picture's title to its path relative to
    ``folder``, where the page lies (replicate links are relative to it too); ``whole``
    names all test conditions."""
    finished = sum(replicate["status"] == "finished" for replicate in replicates)
    names = ", ".join(escape(replicate["name"]) for replicate in replicates)
    outcome = f"Over {finished} replicates, " + outcome_line(verdicts, "all test conditions, 95% intervals")
    figures = [(relative, title, title) for title, relative in pictures.items()]
    sections = [
        _failures_section(replicates),
        _verdict_section(verdicts, whole),
        pictures_section("Every replicate", figures),
        _replicates_section(replicates, folder),
    ]
    return report_page(
        TITLE,
        settings,
        outcome,
        sections,
        about=f"; {finished} of {len(replicates)} replicates finished ({names})",
        below=f'<p class="note">{_how_to_read()}</p>',
    )


def _how_to_read() -> str:
    return (
        "How to read it: each replicate trains the same configuration with its own seed and scores GEARS and "
        "the baselines on its test perturbations. For each baseline the page gives the mean and standard "
        "deviation over the replicates, then the paired difference GEARS minus the baseline, perturbation by "
        "perturbation and replicate by replicate, signed so that + favours GEARS: its mean, its interval (a "
        f"{escape(INTERVAL_METHOD)}) and the perturbations GEARS won. GEARS <i>beats</i> a baseline when the "
        "whole interval lies above zero, <i>loses to</i> it when it lies below, and there is <i>no clear "
        "difference</i> when the interval holds zero; n/a marks a comparison without an interval, with the "
        "reason."
    )


def _failures_section(replicates: list[dict]) -> str:
    """Every replicate that did not finish, with its error; empty when all finished."""
    unfinished = [replicate for replicate in replicates if replicate["status"] != "finished"]
    if not unfinished:
        return ""
    items = [
        f"<li><b>{escape(r['name'])}</b>: {escape(r['status'])}"
        + (f"<pre>{escape(str(r['error']))}</pre>" if r.get("error") else "")
        + "</li>"
        for r in unfinished
    ]
    return (
        '<h2>Replicates that did not finish</h2>\n<p class="note">The summary below covers the finished '
        "replicates only. Run the same command again: finished replicates are skipped and an interrupted one "
        "continues from its newest checkpoint.</p>\n<ul>\n" + "\n".join(items) + "\n</ul>"
    )


def _verdict_section(verdicts: list[ReplicateVerdict], whole: str) -> str:
    """The test metrics: GEARS's mean ± sd, and per baseline its mean ± sd and the paired
    comparison with its interval and won count, coloured by its verdict (n/a, with the
    reason, where there is no interval)."""
    if not verdicts:
        return "<h2>Test metrics</h2>\n<p>No finished replicate has test metrics to summarise.</p>"
    names = list(verdicts[0].baselines)

    def values(verdict: ReplicateVerdict) -> list[str]:
        cells = [f'<td class="number">{verdict.gears.text}</td>']
        for name in names:
            spread, difference = verdict.baselines[name], verdict.differences[name]
            cue = {BEATS: "win", LOSES: "lose"}.get(difference.verdict, "unknown")
            cells.append(
                not_applicable_cell(difference.reason)
                if difference.verdict == NOT_APPLICABLE
                else f'<td class="number {cue}">{spread.text}<br>{escape(format_comparison(difference))}<br>'
                f"{escape(difference.verdict)}</td>"
            )
        return cells

    headings = ["GEARS: mean ± sd"] + [f"{escape(name)}: mean ± sd<br>difference [95% interval] won" for name in names]
    return verdict_section("Test metrics over the replicates", "", verdicts, headings, values, whole)


def _replicates_section(replicates: list[dict], folder: Path) -> str:
    """One row per replicate: its seeds, status, wall time and a link to its own report."""
    rows = []
    for replicate in replicates:
        seconds = replicate.get("seconds")
        page = Path(replicate["folder"]) / PAGE_FILE
        link = (
            f'<a href="{escape(Path(os.path.relpath(page, folder)).as_posix())}">report</a>'
            if replicate["status"] == "finished"
            else ""
        )
        rows.append(
            f"<tr><td>{escape(replicate['name'])}</td><td>{escape(str(replicate['seed']))}</td>"
            f"<td>{escape(str(replicate['split_seed']))}</td><td>{escape(replicate['status'])}</td>"
            f"<td>{format_duration(seconds) if seconds is not None else 'not run now'}</td><td>{link}</td></tr>"
        )
    return (
        "<h2>Replicates</h2>\n<p>Each is a complete run folder with its own model, metrics, log and "
        "report.</p>\n<table>\n<tr><th>replicate</th><th>model seed</th><th>split seed</th><th>status</th>"
        "<th>wall time, start to end</th><th>its report</th></tr>\n" + "\n".join(rows) + "\n</table>"
    )
