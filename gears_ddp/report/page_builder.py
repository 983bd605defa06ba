"""The parts both report pages are built of: a run's ``report.html`` (``page``) and the
summary of its replicates (``replicate_page``).

Both pages have the same frame, so a reader who knows one reads the other: a title naming
the dataset, the split and the outcome in one line; a table of the test metrics, grouped by
test subgroup, each with its meaning, its direction, GEARS's figure beside each baseline's
(n/a, with the reason, where the comparison is not applicable) and a verdict (green where
GEARS beats every baseline compared, red where it loses to one, grey otherwise); the
pictures; and last the run's settings. What differs is what a cell of
that table holds (one value, or a mean ± sd with an interval) and the page's own sections.

Pages are plain HTML with inline CSS, no JavaScript and nothing fetched from elsewhere;
pictures are linked by their path relative to the page, so a run folder can be moved or
copied whole. Every string taken from the data is HTML-escaped here or by the caller that
builds a cell.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Callable, Protocol, Sequence, TypeVar

from gears_ddp.report.verdicts import MEANINGS, SUBGROUP_NAMES

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
td.na { color: #777; }
tr.best td { font-weight: 600; background: #fff7d6; }
figure { margin: 1em 0 2em; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; }
.wide { overflow-x: auto; }
.note { background: #f6f6f6; padding: 0.6em 1em; border-left: 4px solid #999; }
"""


# where the settings a page lists come from, and what repeats them: a run's or replicates' folder
REPEATED_BY_CONFIG = "<code>config.yaml</code> in this folder repeats the run."


NO_PICTURES = "No pictures were drawn."


def report_page(
    title: str,
    settings: dict,
    outcome: str,
    sections: Sequence[str],
    about: str = "",
    below: str = "",
    settings_from: str = REPEATED_BY_CONFIG,
) -> str:
    """A whole page: its title (``title: dataset``), the dataset and split followed by
    ``about``, the ``outcome`` in one line, ``below`` it, then ``sections`` (HTML; empty
    ones left out) and last the settings, with ``settings_from`` (HTML: which file of the
    folder holds them). ``about`` and ``below`` are HTML."""
    dataset = escape(str(settings.get("dataset_name", "unknown dataset")))
    split = (settings.get("split_config") or {}).get("split")
    heading = (
        f"<h1>{escape(title)}: {dataset}</h1>\n"
        f"<p>Dataset <b>{dataset}</b>{f', split <b>{escape(str(split))}</b>' if split else ''}{about}</p>\n"
        f'<p class="outcome">{escape(outcome)}</p>' + (f"\n{below}" if below else "")
    )
    body = [heading, *sections, settings_section(settings, settings_from)]
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{escape(title)}: {dataset}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        + "\n".join(part for part in body if part)
        + "\n</body>\n</html>\n"
    )


class ShownVerdict(Protocol):
    """What a verdicts table shows of a verdict (a run's ``MetricVerdict``, the replicates'
    ``ReplicateVerdict``)."""

    @property
    def subgroup(self) -> str | None: ...
    @property
    def metric(self) -> str: ...
    @property
    def direction(self) -> str: ...
    @property
    def summary(self) -> str: ...
    @property
    def beats_every_baseline(self) -> bool: ...
    @property
    def loses_to_a_baseline(self) -> bool: ...


V = TypeVar("V", bound=ShownVerdict)


def verdict_section(
    title: str,
    intro: str,
    verdicts: Sequence[V],
    value_headings: Sequence[str],
    value_cells: Callable[[V], Sequence[str]],
    whole: str = SUBGROUP_NAMES[None],
) -> str:
    """The test metrics table under the heading ``title`` and the ``intro`` (HTML): per
    verdict (a run's ``MetricVerdict`` or the replicates' ``ReplicateVerdict``), the metric
    and its meaning, its direction, the page's own cells (``value_cells(verdict)``, one
    ``<td>`` per heading of ``value_headings``, both HTML) and the verdict, coloured; a
    heading row where a new subgroup starts (``whole``: the name of all test conditions)."""
    columns = len(value_headings) + 3
    header = "".join(f"<th>{heading}</th>" for heading in value_headings)
    rows, subgroup = [], object()
    for verdict in verdicts:
        if verdict.subgroup != subgroup:
            subgroup = verdict.subgroup
            name = (whole if subgroup is None else SUBGROUP_NAMES.get(subgroup, subgroup)).capitalize()
            rows.append(f'<tr class="subgroup"><th colspan="{columns}">{escape(str(name))}</th></tr>')
        rows.append(
            f"<tr><td><b>{escape(verdict.metric)}</b><br>"
            f'<span class="meaning">{escape(MEANINGS.get(verdict.metric, ""))}</span></td>'
            f"<td>{escape(verdict.direction)}</td>"
            + "".join(value_cells(verdict))
            + f'<td class="{verdict_cue(verdict)}">{escape(verdict.summary)}</td></tr>'
        )
    return (
        f"<h2>{escape(title)}</h2>\n{intro}"
        f"<table>\n<tr><th>metric</th><th>better</th>{header}<th>verdict</th></tr>\n" + "\n".join(rows) + "\n</table>"
    )


def verdict_cue(verdict: ShownVerdict) -> str:
    """The colour class of a verdict: ``lose`` (loses to a baseline), ``win`` (beats every
    baseline compared) or ``unknown``."""
    if verdict.loses_to_a_baseline:
        return "lose"
    return "win" if verdict.beats_every_baseline else "unknown"


def not_applicable_cell(reason: str | None) -> str:
    """The cell of a baseline whose comparison with GEARS is no verdict: n/a and why (none
    where a saved comparison gives no reason)."""
    return f'<td class="na">n/a<br><span class="meaning">{escape(reason or "")}</span></td>'


def pictures_section(title: str, figures: Sequence[tuple[str, str, str]], none_drawn: str = NO_PICTURES) -> str:
    """Each picture, given as ``(path relative to the page, alt text, caption)``, under the
    heading ``title``; ``none_drawn`` (HTML) where there is none."""
    shown = [
        f'<figure><img src="{escape(Path(relative).as_posix())}" alt="{escape(alt)}">'
        f"<figcaption>{escape(caption)}</figcaption></figure>"
        for relative, alt, caption in figures
    ]
    return f"<h2>{escape(title)}</h2>\n" + ("\n".join(shown) if shown else f"<p>{none_drawn}</p>")


def settings_section(settings: dict, settings_from: str = REPEATED_BY_CONFIG) -> str:
    """The run's configuration, one row per setting, nested keys dotted as ``--set`` writes
    them, and ``settings_from`` (HTML: which file of the folder holds them)."""
    if not settings:
        return "<h2>Settings</h2>\n<p>The run's settings were not recorded (no config.yaml).</p>"
    rows = [
        f"<tr><td><code>{escape(key)}</code></td><td>{escape(value)}</td></tr>"
        for key, value in flatten_settings(settings)
    ]
    return (
        "<h2>Settings</h2>\n<p>Each setting as <code>gears-ddp train --set key=value</code> names it; "
        f"{settings_from}</p>\n"
        "<table>\n<tr><th>setting</th><th>value</th></tr>\n" + "\n".join(rows) + "\n</table>"
    )


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
