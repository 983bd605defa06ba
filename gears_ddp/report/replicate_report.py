"""The summary of a run's replicates, in the top-level run folder (each replicate's own run
folder lies below it):

- ``report.json``: the replicates (seeds, status, error of a failed one) and, per metric and
  subgroup, each method's values, mean and sd and each baseline's paired difference with its
  interval and verdict (``replicate_summary``);
- ``replicates.csv``: one row per replicate, metric, subgroup and method (GEARS and each
  baseline);
- ``plots/replicates_<metric>.png``: every replicate's value, GEARS beside the baselines;
- ``report.html``: all of it on one page, with links to each replicate's own report.

``replicates`` describes each replicate as plain data: ``name``, ``seed``, ``split_seed``,
``folder`` (its run folder), ``status`` (``'finished'``, ``'failed'``, ``'interrupted'`` or
``'not started'``), ``error`` and ``seconds`` (its wall time, None when it did not run now); ``reports`` holds the run report of each finished one.
"""
from __future__ import annotations

import csv
import os
from html import escape
from pathlib import Path

from gears_ddp.data.io import atomic_path
from gears_ddp.report.page import STYLE, format_duration, format_number, rows_by_subgroup, settings_section
from gears_ddp.report.replicate_summary import (BEATS, GEARS, INTERVAL_METHOD, LOSES, ReplicateVerdict,
                                                summarise_replicates, summary_records)
from gears_ddp.report.run_folder import PAGE_FILE, REPORT_FILE, write_json
from gears_ddp.report.verdicts import MEANINGS

TABLE_FILE = "replicates.csv"
PICTURE_FOLDER = "plots"
TABLE_COLUMNS = ("replicate", "seed", "split_seed", "subgroup", "metric", "method", "value", "higher_is_better")


def write_replicate_report(folder, settings: dict, replicates: list[dict], reports: dict[str, dict]) -> Path:
    """Write the summary files in ``folder`` and return the page's path."""
    # matplotlib is imported here, by the process that writes the summary only
    from gears_ddp.report.plots import plot_replicate_values

    folder = Path(folder)
    verdicts = summarise_replicates(reports)
    write_json(folder / REPORT_FILE, {"interval_method": INTERVAL_METHOD, "replicates": replicates,
                                      "finished": len(reports), "metrics": summary_records(verdicts)})
    write_replicate_table(folder / TABLE_FILE, [r for name in reports for r in replicates if r["name"] == name],
                          verdicts)
    pictures = {}
    for metric, by_subgroup in _by_metric(verdicts).items():
        relative = f"{PICTURE_FOLDER}/replicates_{metric.replace('/', '_')}.png"
        plot_replicate_values(by_subgroup, folder / relative)
        pictures[metric] = relative
    page = folder / PAGE_FILE
    with atomic_path(page) as tmp:
        Path(tmp).write_text(render_replicate_page(settings, replicates, verdicts, pictures, folder), encoding="utf-8")
    return page


def write_replicate_table(path, finished: list[dict], verdicts: list[ReplicateVerdict]) -> Path:
    """``replicates.csv``: one row per replicate, metric, subgroup and method; ``finished``
    are the replicates whose values the verdicts hold, in the same order."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(TABLE_COLUMNS)
        for verdict in verdicts:
            for method, spread in {GEARS: verdict.gears, **verdict.baselines}.items():
                for replicate, value in zip(finished, spread.values):
                    writer.writerow([replicate["name"], replicate["seed"], replicate["split_seed"],
                                     verdict.subgroup or "all", verdict.metric, method, value,
                                     verdict.higher_is_better])
    return Path(path)


def _by_metric(verdicts: list[ReplicateVerdict]) -> dict[str, list[ReplicateVerdict]]:
    grouped: dict[str, list[ReplicateVerdict]] = {}
    for verdict in verdicts:
        grouped.setdefault(verdict.metric, []).append(verdict)
    return grouped


def render_replicate_page(settings: dict, replicates: list[dict], verdicts: list[ReplicateVerdict],
                          pictures: dict[str, str], folder: Path) -> str:
    """The page's HTML text; ``folder`` is where it lies (replicate links are relative to it)."""
    dataset = escape(str(settings.get("dataset_name", "unknown dataset")))
    sections = [_heading(dataset, settings, replicates, verdicts), _failures_section(replicates),
                _verdict_section(verdicts), _pictures_section(pictures), _replicates_section(replicates, folder),
                settings_section(settings)]
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>GEARS replicates: {dataset}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
            + "\n".join(section for section in sections if section) + "\n</body>\n</html>\n")


def outcome_line(verdicts: list[ReplicateVerdict], finished: int) -> str:
    """``'Over 5 replicates, GEARS beats every baseline on 2 of 7 metrics (all test conditions)'``."""
    overall = [verdict for verdict in verdicts if verdict.subgroup is None]
    if not overall or not any(verdict.differences for verdict in overall):
        return f"{finished} replicate(s) finished; there is no test metric and baseline to compare"
    won = sum(all(d.verdict == BEATS for d in verdict.differences.values()) for verdict in overall)
    lost = sum(any(d.verdict == LOSES for d in verdict.differences.values()) for verdict in overall)
    return (f"Over {finished} replicates, GEARS beats every baseline on {won} of {len(overall)} metrics and loses "
            f"to one on {lost} (all test conditions, 95% intervals)")


def _heading(dataset: str, settings: dict, replicates: list[dict], verdicts: list[ReplicateVerdict]) -> str:
    finished = sum(replicate["status"] == "finished" for replicate in replicates)
    split = (settings.get("split_config") or {}).get("split")
    seeds = ", ".join(escape(replicate["name"]) for replicate in replicates)
    return (f"<h1>GEARS replicates: {dataset}</h1>\n"
            f"<p>Dataset <b>{dataset}</b>{f', split <b>{escape(str(split))}</b>' if split else ''}; "
            f"{finished} of {len(replicates)} replicates finished ({seeds})</p>\n"
            f'<p class="outcome">{escape(outcome_line(verdicts, finished))}</p>\n'
            f'<p class="note">How to read it: each replicate trains the same configuration with its own seed and '
            f"scores GEARS and the baselines on its test set. For each baseline the page gives the mean and "
            f"standard deviation over the replicates and the mean paired difference GEARS - baseline with its "
            f"interval, a {escape(INTERVAL_METHOD)}. GEARS <i>beats</i> a baseline when the whole interval lies on its better "
            f"side of zero, <i>loses to</i> it when the interval lies wholly on the worse side, and there is <i>no "
            f"clear difference</i> when the interval holds zero.</p>")


def _failures_section(replicates: list[dict]) -> str:
    """Every replicate that did not finish, with its error; empty when all finished."""
    unfinished = [replicate for replicate in replicates if replicate["status"] != "finished"]
    if not unfinished:
        return ""
    items = [f"<li><b>{escape(r['name'])}</b>: {escape(r['status'])}"
             + (f"<pre>{escape(str(r['error']))}</pre>" if r.get("error") else "") + "</li>" for r in unfinished]
    return ('<h2>Replicates that did not finish</h2>\n<p class="note">The summary below covers the finished '
            "replicates only. Run the same command again: finished replicates are skipped and an interrupted one "
            "continues from its newest checkpoint.</p>\n<ul>\n" + "\n".join(items) + "\n</ul>")


def _verdict_section(verdicts: list[ReplicateVerdict]) -> str:
    if not verdicts:
        return "<h2>Test metrics</h2>\n<p>No finished replicate has test metrics to summarise.</p>"
    names = list(verdicts[0].baselines)
    header = "".join(f"<th>{escape(name)}: mean ± sd<br>GEARS - {escape(name)} [95% interval]</th>" for name in names)
    rows = rows_by_subgroup(verdicts, lambda verdict: _verdict_row(verdict, names), len(names) + 4)
    return ("<h2>Test metrics over the replicates</h2>\n"
            f"<table>\n<tr><th>metric</th><th>better</th><th>GEARS: mean ± sd</th>{header}<th>verdict</th></tr>\n"
            + "\n".join(rows) + "\n</table>")


def _mean_sd(spread) -> str:
    return f"{format_number(spread.mean)} ± {format_number(spread.sd)} (n={spread.n})"


def _verdict_row(verdict: ReplicateVerdict, names: list[str]) -> str:
    """One metric: GEARS's spread, each baseline's spread and paired difference, coloured by
    its verdict, and the summary."""
    cells = []
    for name in names:
        difference = verdict.differences[name]
        cue = {BEATS: "win", LOSES: "lose"}.get(difference.verdict, "unknown")
        cells.append(f'<td class="number {cue}">{_mean_sd(verdict.baselines[name])}<br>'
                     f"{_signed(difference.mean)} [{_signed(difference.low)}, {_signed(difference.high)}]<br>"
                     f"{escape(difference.verdict)}</td>")
    verdicts = [d.verdict for d in verdict.differences.values()]
    cue = "lose" if LOSES in verdicts else "win" if verdicts and all(v == BEATS for v in verdicts) else "unknown"
    meaning = MEANINGS.get(verdict.metric, "")
    return (f'<tr><td><b>{escape(verdict.metric)}</b><br><span class="meaning">{escape(meaning)}</span></td>'
            f'<td>{escape(verdict.direction)}</td><td class="number">{_mean_sd(verdict.gears)}</td>'
            + "".join(cells) + f'<td class="{cue}">{escape(verdict.summary)}</td></tr>')


def _signed(value: float) -> str:
    text = format_number(value)
    return text if text == "n/a" or text.startswith("-") else "+" + text


def _pictures_section(pictures: dict[str, str]) -> str:
    figures = [f'<figure><img src="{escape(relative)}" alt="{escape(metric)} in every replicate">'
               f"<figcaption>{escape(metric)}: every replicate's value (points) and the mean (bar)</figcaption>"
               "</figure>" for metric, relative in pictures.items()]
    return "<h2>Every replicate</h2>\n" + ("\n".join(figures) if figures else "<p>No pictures were drawn.</p>")


def _replicates_section(replicates: list[dict], folder: Path) -> str:
    rows = []
    for replicate in replicates:
        seconds = replicate.get("seconds")
        page = Path(replicate["folder"]) / PAGE_FILE
        link = (f'<a href="{escape(Path(os.path.relpath(page, folder)).as_posix())}">report</a>'
                if replicate["status"] == "finished" else "")
        rows.append(f"<tr><td>{escape(replicate['name'])}</td><td>{escape(str(replicate['seed']))}</td>"
                    f"<td>{escape(str(replicate['split_seed']))}</td><td>{escape(replicate['status'])}</td>"
                    f"<td>{format_duration(seconds) if seconds is not None else 'not run now'}</td><td>{link}</td></tr>")
    return ("<h2>Replicates</h2>\n<p>Each is a complete run folder with its own model, metrics, log and "
            "report.</p>\n<table>\n<tr><th>replicate</th><th>model seed</th><th>split seed</th><th>status</th>"
            "<th>wall time, start to end</th><th>its report</th></tr>\n" + "\n".join(rows) + "\n</table>")
