"""The summary of a run's replicates, in the top-level run folder (each replicate's own run
folder lies below it):

- ``report.json``: the replicates (seeds, status, error of a failed one) and, per metric and
  subgroup, each method's values, mean and sd and each baseline's paired difference with its
  interval and verdict (``replicate_summary``);
- ``replicates.csv``: one row per replicate, metric, subgroup and method (GEARS and each
  baseline);
- ``plots/replicates_<metric>.png``: every replicate's value, GEARS beside the baselines;
  ``plots/differences_<subgroup>.png``: each paired comparison with its interval (a forest
  plot per test subgroup shown);
- ``report.html``: all of it on one page, with links to each replicate's own report
  (``replicate_page``).

``replicates`` describes each replicate as plain data: ``name``, ``seed``, ``split_seed``,
``folder`` (its run folder), ``status`` (``'finished'``, ``'failed'``, ``'interrupted'`` or
``'not started'``), ``error`` and ``seconds`` (its wall time, None when it did not run now); ``reports`` holds the
run report of each finished one.
"""

from __future__ import annotations

import csv
from pathlib import Path

from gears_ddp.data.io import atomic_path
from gears_ddp.evaluation.paired_bootstrap import INTERVAL_METHOD
from gears_ddp.report.replicate_page import render_replicate_page
from gears_ddp.report.replicate_summary import GEARS, ReplicateVerdict, summarise_replicates, summary_records
from gears_ddp.report.run_files import PAGE_FILE, REPORT_FILE, write_json
from gears_ddp.report.verdicts import SUBGROUP_METRICS, SUBGROUP_NAMES, shown_subgroups, whole_test_set_name

TABLE_FILE = "replicates.csv"
PICTURE_FOLDER = "plots"
TABLE_COLUMNS = ("replicate", "seed", "split_seed", "subgroup", "metric", "method", "value", "higher_is_better")


def write_replicate_report(folder, settings: dict, replicates: list[dict], reports: dict[str, dict]) -> Path:
    """Write the summary files in ``folder`` and return the page's path. The page and its
    pictures show a test subgroup only where it differs from all test conditions
    (``verdicts.shown_subgroups`` over the replicates' summaries); the files hold them all."""
    # matplotlib is imported here, by the process that writes the summary only
    from gears_ddp.report.plots import plot_intervals, plot_replicate_values

    folder = Path(folder)
    verdicts = summarise_replicates(reports)
    write_json(
        folder / REPORT_FILE,
        {
            "interval_method": INTERVAL_METHOD,
            "replicates": replicates,
            "finished": len(reports),
            "metrics": summary_records(verdicts),
        },
    )
    write_replicate_table(
        folder / TABLE_FILE, [r for name in reports for r in replicates if r["name"] == name], verdicts
    )
    models = {key: value for report in reports.values() for key, value in report.get("model", {}).items()}
    shown = [verdict for verdict in verdicts if verdict.subgroup in (None, *shown_subgroups(models))]
    whole = whole_test_set_name(models)
    pictures = {}
    for metric, by_subgroup in _by_metric(shown).items():
        relative = f"{PICTURE_FOLDER}/replicates_{metric.replace('/', '_')}.png"
        plot_replicate_values(by_subgroup, folder / relative, whole)
        pictures[f"{metric}: every replicate's value (points) and the mean (bar)"] = relative
    for subgroup in dict.fromkeys(verdict.subgroup for verdict in shown):
        name = whole if subgroup is None else SUBGROUP_NAMES.get(subgroup, subgroup)
        title = f"GEARS against each baseline over the replicates and their test perturbations: {name}"
        relative = f"{PICTURE_FOLDER}/differences_{subgroup or 'all'}.png"
        plot_intervals(
            [
                (v.metric, v.higher_is_better, v.differences)
                for v in shown
                if v.subgroup == subgroup and (subgroup is None or v.metric in SUBGROUP_METRICS)
            ],
            title,
            folder / relative,
        )
        pictures[title] = relative
    page = folder / PAGE_FILE
    with atomic_path(page) as tmp:
        Path(tmp).write_text(
            render_replicate_page(settings, replicates, shown, pictures, folder, whole), encoding="utf-8"
        )
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
                    writer.writerow(
                        [
                            replicate["name"],
                            replicate["seed"],
                            replicate["split_seed"],
                            verdict.subgroup or "all",
                            verdict.metric,
                            method,
                            value,
                            verdict.higher_is_better,
                        ]
                    )
    return Path(path)


def _by_metric(verdicts: list[ReplicateVerdict]) -> dict[str, list[ReplicateVerdict]]:
    grouped: dict[str, list[ReplicateVerdict]] = {}
    for verdict in verdicts:
        grouped.setdefault(verdict.metric, []).append(verdict)
    return grouped
