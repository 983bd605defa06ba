"""The run report page, ``report.html``: one page a biologist can open after a run.

It shows together what otherwise lies in several files: the outcome in one line, each
test metric beside the baselines with a verdict (green where GEARS beats every baseline,
red where it loses to one), the pictures, the per-epoch history and the run's settings.
The page is plain HTML with inline CSS, no JavaScript and nothing fetched from elsewhere;
pictures are linked by their path relative to the page, so the run folder can be moved or
copied whole. Every string taken from the data is HTML-escaped.
"""
from __future__ import annotations

import math
from html import escape
from pathlib import Path

from gears_ddp.report.learning import learning_checks
from gears_ddp.report.verdicts import MEANINGS, SUBGROUP_NAMES, MetricVerdict, compare

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1200px; padding: 0 1em; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2em; }
.outcome { font-size: 1.25em; margin: 0.4em 0; }
.facts { color: #555; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.92em; }
th, td { border-bottom: 1px solid #ddd; padding: 0.3em 0.7em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
tr.subgroup th { background: #e8eef5; }
.meaning { color: #666; font-size: 0.88em; }
td.win { background: #e3f4e1; color: #1b5e20; font-weight: 600; }
td.lose { background: #fbe3e1; color: #b71c1c; font-weight: 600; }
td.unknown { color: #777; }
td.beats-gears { color: #b71c1c; font-weight: 600; }
tr.best td { font-weight: 600; background: #fff7d6; }
figure { margin: 1em 0 2em; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; }
.wide { overflow-x: auto; }
.note { background: #f6f6f6; padding: 0.6em 1em; border-left: 4px solid #999; }
"""

ONE_SEED_NOTE = ("These verdicts come from one run: one model seed and one split seed. Seed to seed, the metrics "
                 "can move by more than the gaps judged here. For verdicts that hold across seeds, run replicates "
                 "(gears-ddp train --config config.yaml --seeds 1 2 3 4 5 --set args.save_path=NEW_FOLDER): their "
                 "summary gives each difference with a 95% interval (docs/replicates.md).")


def write_report_page(path, settings: dict, report: dict, pictures: dict[str, str]) -> Path:
    """Write the page to ``path`` (a run folder's ``report.html``) and return the path.

    ``settings`` is the run's resolved configuration (nested dicts), ``report`` what the
    training returns (``model`` and ``baselines`` test summaries when the split has a test
    set, ``best_epoch``, ``history``, ``world_size``, optionally ``model_path``) and
    ``pictures`` maps each picture's title to its path relative to the page's folder.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report_page(settings, report, pictures), encoding="utf-8")
    return path


def render_report_page(settings: dict, report: dict, pictures: dict[str, str]) -> str:
    """The page's HTML text."""
    dataset = escape(str(settings.get("dataset_name", "unknown dataset")))
    verdicts = compare(report["model"], report.get("baselines", {})) if "model" in report else []
    sections = [_heading(settings, report, verdicts), _learning_section(report), _verdict_section(report, verdicts),
                _pictures_section(pictures), _history_section(report), settings_section(settings)]
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f"<title>GEARS run report: {dataset}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
            + "\n".join(sections) + "\n</body>\n</html>\n")


def format_number(value) -> str:
    """4 significant digits (thousands as whole numbers); ``n/a`` for a missing value or NaN."""
    if value is None:
        return "n/a"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


def format_duration(seconds: float) -> str:
    """``'1 h 02 min'``, ``'12 min 05 s'`` or ``'42 s'``."""
    whole = int(round(seconds))
    hours, minutes, secs = whole // 3600, whole % 3600 // 60, whole % 60
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def outcome_line(verdicts: list[MetricVerdict]) -> str:
    """``'GEARS beats every baseline on 2 of 7 metrics (all test conditions)'``; counted as the
    console summary (``verdicts.verdict_table``) counts it, so both say the same."""
    overall = [verdict for verdict in verdicts if verdict.subgroup is None]
    if not any(verdict.beats for verdict in overall):
        return "GEARS was tested; there is no baseline to compare it with"
    won = sum(verdict.beats_every_baseline for verdict in overall)
    return f"GEARS beats every baseline on {won} of {len(overall)} metrics (all test conditions)"


def _heading(settings: dict, report: dict, verdicts: list[MetricVerdict]) -> str:
    """Title, dataset and split, the outcome and the run's key facts."""
    dataset = escape(str(settings.get("dataset_name", "unknown dataset")))
    split = (settings.get("split_config") or {}).get("split")
    outcome = outcome_line(verdicts) if "model" in report else "No test set: the model was not tested"
    facts = _run_facts(report)
    return (f"<h1>GEARS run report: {dataset}</h1>\n"
            f"<p>Dataset <b>{dataset}</b>{f', split <b>{escape(str(split))}</b>' if split else ''}</p>\n"
            f'<p class="outcome">{escape(outcome)}</p>\n<p class="facts">{" &middot; ".join(facts)}</p>')


def _learning_section(report: dict) -> str:
    """Whether the model learned: ``report.learning.learning_checks`` as a list."""
    items = "".join(f"<li>{escape(line)}</li>" for line in learning_checks(report))
    return f"<h2>Did the model learn?</h2>\n<ul>{items}</ul>" if items else ""


def _run_facts(report: dict) -> list[str]:
    """Best epoch, world size, training time and the model's folder, as escaped phrases."""
    history = report.get("history") or []
    facts = [f"model kept from epoch {escape(str(report.get('best_epoch')))} of {len(history)} "
             "(lowest validation mse_de)",
             f"world size {escape(str(report.get('world_size', 1)))} (training processes)"]
    seconds = [record.get("seconds") for record in history if record.get("seconds") is not None]
    if seconds:
        facts.append(f"training time {format_duration(sum(seconds))}")
    if report.get("model_path"):
        facts.append(f"model saved in <code>{escape(str(report['model_path']))}</code>")
    return facts


def _verdict_section(report: dict, verdicts: list[MetricVerdict]) -> str:
    """The test metrics beside the baselines, or a note that there is no test set."""
    if "model" not in report:
        return ('<h2>Test metrics</h2>\n<p class="note">This split has no test set, so the model was not '
                "scored on test conditions nor compared with the baselines.</p>")
    names = list(dict.fromkeys(name for verdict in verdicts for name in verdict.beats))
    header = "".join(f"<th>{escape(name)}</th>" for name in names)
    rows = rows_by_subgroup(verdicts, lambda verdict: verdict_row(verdict, names), len(names) + 4)
    return ("<h2>Test metrics beside the baselines</h2>\n"
            "<p>Each baseline predicts from the training data only: <i>no_change</i> the control mean, "
            "<i>mean_effect</i> control plus the average effect of all training perturbations, "
            "<i>additive</i> control plus the sum of each gene's single-gene effect. A baseline value in red "
            "is at least as good as GEARS.</p>\n"
            f'<p class="note">{escape(ONE_SEED_NOTE)}</p>\n'
            f"<table>\n<tr><th>metric</th><th>better</th><th>GEARS</th>{header}<th>verdict</th></tr>\n"
            + "\n".join(rows) + "\n</table>")


def rows_by_subgroup(verdicts: list, row, columns: int) -> list[str]:
    """Each verdict's table row (``row(verdict)``), under a heading row spanning ``columns``
    columns where a new subgroup starts."""
    rows, subgroup = [], object()
    for verdict in verdicts:
        if verdict.subgroup != subgroup:
            subgroup = verdict.subgroup
            heading = SUBGROUP_NAMES.get(subgroup, subgroup).capitalize()
            rows.append(f'<tr class="subgroup"><th colspan="{columns}">{escape(str(heading))}</th></tr>')
        rows.append(row(verdict))
    return rows


def verdict_row(verdict: MetricVerdict, names: list[str]) -> str:
    """One metric: its meaning, direction, GEARS and each baseline, and the verdict in green
    (beats every baseline compared), red (loses to one) or grey (nothing to compare)."""
    meaning = MEANINGS.get(verdict.metric, "")
    cells = []
    for name in names:
        lost_to = ' class="number beats-gears"' if verdict.beats.get(name) is False else ' class="number"'
        cells.append(f"<td{lost_to}>{format_number(verdict.baselines.get(name))}</td>")
    cue = "lose" if False in verdict.beats.values() else "win" if verdict.beats_every_baseline else "unknown"
    return (f'<tr><td><b>{escape(verdict.metric)}</b><br><span class="meaning">{escape(meaning)}</span></td>'
            f"<td>{escape(verdict.direction)}</td><td class=\"number\">{format_number(verdict.model)}</td>"
            + "".join(cells) + f'<td class="{cue}">{escape(verdict.summary)}</td></tr>')


def _pictures_section(pictures: dict[str, str]) -> str:
    """Each picture under its title, linked by its path relative to the page."""
    figures = [f'<figure><img src="{escape(Path(relative).as_posix())}" alt="{escape(title)}">'
               f"<figcaption>{escape(title)}</figcaption></figure>" for title, relative in pictures.items()]
    return "<h2>Pictures</h2>\n" + ("\n".join(figures) if figures else "<p>No pictures were drawn.</p>")


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
    return ("<h2>Training history</h2>\n<p>Highlighted: the epoch whose model was kept. Seconds are wall-clock "
            f'time per epoch (training, then evaluation).</p>\n<div class="wide"><table>\n<tr>{header}</tr>\n'
            + "\n".join(rows) + "\n</table></div>")


def settings_section(settings: dict) -> str:
    """The run's configuration, one row per setting, nested keys dotted as ``--set`` writes them."""
    if not settings:
        return "<h2>Settings</h2>\n<p>The run's settings were not recorded (no config.yaml).</p>"
    rows = [f"<tr><td><code>{escape(key)}</code></td><td>{escape(value)}</td></tr>"
            for key, value in flatten_settings(settings)]
    return ("<h2>Settings</h2>\n<p>Each setting as <code>gears-ddp train --set key=value</code> names it; "
            "<code>config.yaml</code> in this folder repeats the run.</p>\n"
            "<table>\n<tr><th>setting</th><th>value</th></tr>\n" + "\n".join(rows) + "\n</table>")


def flatten_settings(settings: dict, prefix: str = "") -> list[tuple[str, str]]:
    """``{'args': {'epochs': 20}}`` -> ``[('args.epochs', '20')]``; an empty mapping stays ``{}``."""
    rows = []
    for key, value in settings.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            rows.extend(flatten_settings(value, name + "."))
        else:
            rows.append((name, setting_text(value)))
    return rows


def setting_text(value) -> str:
    """A setting's value written as YAML would (``null``, ``true``, ``[0, 1]``)."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(setting_text(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{}"
    return str(value)
