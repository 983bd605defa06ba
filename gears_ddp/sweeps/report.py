"""A sweep's report, in the sweep folder:

- ``trials.csv``: every trial's number, state, validation value (its best epoch's ``mse_de``),
  settings, epochs trained, wall seconds, folder and note;
- ``run.yaml``: the best trial's run file, ready to train again into a folder of its own
  (``gears-ddp train --config <sweep>/run.yaml``);
- ``report.json``: the summary ``train_sweep`` returns;
- ``plots/`` and ``report.html``: the optimisation history, each setting against the
  validation value, the settings' importances (Optuna's, PED-ANOVA) and the best trial's
  test verdicts, the ones that stand for the sweep: the best trial was chosen on validation
  alone (every trial, an ordinary run, scores its test set too, in its own report).
"""

from __future__ import annotations

import csv
import math
import os
import warnings
from html import escape
from pathlib import Path

import numpy as np

from gears_ddp.data.io import atomic_path, write_yaml
from gears_ddp.report.numbers import format_number
from gears_ddp.report.page_builder import pictures_section, report_page
from gears_ddp.report.run_files import PAGE_FILE, REPORT_FILE, SWEEP_FILE, read_settings, write_json
from gears_ddp.training.save_folder import finished_report

TRIALS_FILE = "trials.csv"
BEST_RUN_FILE = "run.yaml"
PICTURES = {
    "history": "plots/sweep_history.png",
    "settings": "plots/sweep_settings.png",
    "importances": "plots/sweep_importances.png",
}
STATE_COLOURS = {
    "COMPLETE": "#2e7d32",
    "PRUNED": "#ef6c00",
    "FAIL": "#b71c1c",
    "RUNNING": "#1565c0",
    "WAITING": "#777777",
}


def trial_rows(study) -> list[dict]:
    """One row per trial of the study, in number order: a complete trial's value is its best
    epoch's validation mse_de, a pruned one's its last reported epoch's; a trial interrupted
    and retried says by which trial (its folder is the retry's now). A retry not started yet
    (a sweep stopped by a signal queues it) has the settings of the trial it retries."""
    trials = study.get_trials(deepcopy=False)
    by_number = {trial.number: trial for trial in trials}
    retried_by = {trial.user_attrs["retry_of"]: trial.number for trial in trials if "retry_of" in trial.user_attrs}
    rows = []
    for trial in trials:
        settings = trial if trial.distributions else by_number.get(trial.user_attrs.get("retry_of"), trial)
        folder = Path(trial.user_attrs.get("folder", ""))
        epochs, value, note = None, None, trial.user_attrs.get("note")
        if trial.number in retried_by:
            note = f"interrupted when its sweep stopped; retried as trial {retried_by[trial.number]}, in its folder"
        else:
            if (folder / "metrics.csv").is_file():
                with open(folder / "metrics.csv", newline="", encoding="utf-8") as table:
                    epochs = sum(1 for _ in csv.DictReader(table))
            if trial.state.name == "COMPLETE":
                value = trial.value
            elif trial.state.name == "PRUNED" and trial.intermediate_values:
                value = trial.intermediate_values[max(trial.intermediate_values)]
            if "retry_of" in trial.user_attrs and not note:
                note = f"retry of trial {trial.user_attrs['retry_of']}, continued in its folder"
        rows.append(
            {
                "number": trial.number,
                "state": trial.state.name,
                "value": value,
                **{key: settings.params.get(key) for key in sorted(settings.distributions)},
                "epochs": epochs,
                "seconds": trial.user_attrs.get("seconds"),
                "folder": str(folder),
                "note": note,
                "retried": trial.number in retried_by,
            }
        )
    return rows


def write_sweep_report(folder, plan, study) -> dict:
    """Write the report's files in ``folder`` and return the summary."""
    folder = Path(folder)
    rows = trial_rows(study)
    keys = list(plan.space.record())
    with atomic_path(folder / TRIALS_FILE) as tmp, open(tmp, "w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(
            out,
            fieldnames=["number", "state", "value", *keys, "epochs", "seconds", "folder", "note"],
            extrasaction="ignore",
        )
        writer.writeheader()
        writer.writerows(rows)
    complete = [row for row in rows if row["state"] == "COMPLETE"]
    best = min(complete, key=lambda row: row["value"]) if complete else None
    best_report = finished_report(Path(best["folder"])) if best else None
    if best is not None:
        _write_best_run(folder, Path(best["folder"]))
    counted = [row for row in rows if not row["retried"]]  # a retried trial counts as its retry
    counts = {
        state: sum(row["state"] == state for row in counted) for state in dict.fromkeys(r["state"] for r in counted)
    }
    retried = len(rows) - len(counted)
    importances = importances_of(study)
    summary = {
        "trials": rows,
        "counts": counts,
        "retried": retried,
        "metric": "val_mse_de",
        "best": best,
        "importances": importances,
        "best_verdicts": (best_report or {}).get("verdicts"),
        "report_path": str(folder / PAGE_FILE),
    }
    write_json(folder / REPORT_FILE, summary)
    pictures = _pictures(folder, rows, keys, plan, importances)
    page = folder / PAGE_FILE
    with atomic_path(page) as tmp:
        Path(tmp).write_text(_page(folder, plan, rows, best, best_report, counts, retried, pictures), encoding="utf-8")
    return summary


def _write_best_run(folder: Path, best_folder: Path) -> None:
    """``run.yaml``: the best trial's configuration, trained again into ``<sweep>-best``."""
    config = read_settings(best_folder)
    if config:
        config["args"] = {**config["args"], "save_path": f"{folder}-best", "resume_from": None}
        write_yaml(config, folder / BEST_RUN_FILE)


def importances_of(study) -> dict | None:
    """Optuna's importance of each setting (PED-ANOVA), or None where it cannot rank them:
    with too few finished trials it warns and gives every setting the same importance (0
    with one finished trial), which a picture would show as a finding."""
    import optuna

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            importances = dict(optuna.importance.get_param_importances(study))
        except (ValueError, RuntimeError, ZeroDivisionError):
            return None
    unranked = [warning for warning in caught if "importances will be equal" in str(warning.message)]
    for warning in caught:  # Optuna's other warnings, as they came
        if warning not in unranked:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return None if unranked else importances


def _pictures(folder: Path, rows: list[dict], keys: list[str], plan, importances: dict | None) -> dict[str, str]:
    """The pictures, drawn with matplotlib; their titles and paths relative to ``folder``."""
    from gears_ddp.report.plots import new_figure, save_figure

    pictures = {}
    finished = [row for row in rows if row["value"] is not None and math.isfinite(row["value"])]
    figure = new_figure(8, 4.2)
    axes = figure.subplots()
    for state, colour in STATE_COLOURS.items():
        chosen = [row for row in finished if row["state"] == state]
        if chosen:
            axes.scatter(
                [row["number"] for row in chosen],
                [row["value"] for row in chosen],
                color=colour,
                label={"PRUNED": "pruned (its last reported epoch)"}.get(state, state.lower()),
                zorder=3,
            )
    complete = sorted((row for row in finished if row["state"] == "COMPLETE"), key=lambda row: row["number"])
    if complete:
        best = np.minimum.accumulate([row["value"] for row in complete])
        axes.step([row["number"] for row in complete], best, where="post", color="#333333", label="best so far")
    _scale(axes, [row["value"] for row in finished])
    axes.set_xlabel("trial")
    axes.set_ylabel("validation mse_de (lower is better)")
    axes.set_title("Optimisation history")
    if finished:
        axes.legend(frameon=False)
    else:  # every trial failed, or waits to be retried
        axes.text(0.5, 0.5, "no trial has finished yet", ha="center", va="center", transform=axes.transAxes)
    save_figure(figure, folder / PICTURES["history"])
    pictures["Optimisation history: each trial's validation mse_de, and the best so far"] = PICTURES["history"]

    figure = new_figure(max(4 * len(keys), 8), 3.8)  # at least the title's width
    for axes, key in zip(np.atleast_1d(figure.subplots(1, len(keys))), keys):
        spec = plan.space.record()[key]
        categorical = spec["type"] == "categorical"
        if categorical:  # each choice at its own place, in the order given
            axes.set_xticks(range(len(spec["choices"])), labels=[str(choice) for choice in spec["choices"]])
        drawn = 0
        for state, colour in STATE_COLOURS.items():
            chosen = [row for row in finished if row["state"] == state and row[key] is not None]
            places = [spec["choices"].index(row[key]) if categorical else row[key] for row in chosen]
            axes.scatter(places, [row["value"] for row in chosen], color=colour, zorder=3)
            drawn += len(chosen)
        if spec.get("log") and drawn:  # an empty log axis cannot be drawn (its default limits reach 0)
            axes.set_xscale("log")
        _scale(axes, [row["value"] for row in finished])
        axes.set_xlabel(key.split(".")[-1])
        axes.set_ylabel("validation mse_de")
    figure.suptitle("Each setting against the validation value (green complete, orange pruned)")
    save_figure(figure, folder / PICTURES["settings"])
    pictures["Each setting against the validation value"] = PICTURES["settings"]

    if importances:
        figure = new_figure(7, 0.5 * len(importances) + 1.5)
        axes = figure.subplots()
        names = list(importances)[::-1]
        axes.barh([name.split(".")[-1] for name in names], [importances[name] for name in names], color="#5b7fa6")
        complete, pruned = (sum(row["state"] == state for row in rows) for state in ("COMPLETE", "PRUNED"))
        # Optuna ranks settings by complete trials alone: a pruned trial's settings weigh nothing here
        left_out = f"; the {pruned} pruned left out" if pruned else ""
        axes.set_xlabel(f"importance (Optuna's PED-ANOVA) over the {complete} complete trials{left_out}")
        axes.set_title("Which settings mattered")
        save_figure(figure, folder / PICTURES["importances"])
        pictures["Which settings mattered"] = PICTURES["importances"]
    return pictures


def _scale(axes, values: list[float]) -> None:
    """A log scale for values that span more than a hundredfold (a diverging trial among
    sound ones), else linear."""
    positive = [value for value in values if value > 0]
    if positive and len(positive) == len(values) and max(positive) > 100 * min(positive):
        axes.set_yscale("log")


def _page(
    folder: Path,
    plan,
    rows: list[dict],
    best: dict | None,
    best_report: dict | None,
    counts: dict,
    retried: int,
    pictures: dict[str, str],
) -> str:
    keys = list(plan.space.record())
    trials = sum(counts.values())
    if best is None:
        outcome = f"No trial finished yet ({', '.join(f'{n} {s.lower()}' for s, n in counts.items())})"
    else:
        settings = ", ".join(f"{key.split('.')[-1]} = {best[key]!r}" for key in keys)
        outcome = f"Best of {trials} trials: trial {best['number']}, validation mse_de {best['value']:.4g} ({settings})"
    header = "".join(
        f"<th>{escape(text)}</th>"
        for text in [
            "trial",
            "state",
            "validation mse_de",
            *(key.split(".")[-1] for key in keys),
            "epochs",
            "seconds",
            "note",
        ]
    )
    lines = []
    for row in rows:
        page = Path(row["folder"]) / PAGE_FILE
        link = (
            f'<a href="{escape(Path(os.path.relpath(page, folder)).as_posix())}">{row["number"]}</a>'
            if page.is_file()
            else str(row["number"])
        )
        cells = [
            link,
            escape(row["state"].lower()),
            format_number(row["value"]),
            *(escape(str(row[key])) for key in keys),
            format_number(row["epochs"]),
            format_number(row["seconds"]),
            escape(row["note"] or ""),
        ]
        mark = ' class="best"' if best is not None and row["number"] == best["number"] else ""
        lines.append(f"<tr{mark}>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    sections = [
        f"<h2>Trials</h2>\n<p>{escape(_how_to_read(plan, counts, retried))}</p>\n<table>\n<tr>{header}</tr>\n"
        + "\n".join(lines)
        + "\n</table>",
        pictures_section("Pictures", [(relative, title, title) for title, relative in pictures.items()]),
        _best_section(folder, best, best_report),
    ]
    return report_page(
        "GEARS sweep",
        read_settings(folder) or plan.config,
        outcome,
        sections,
        settings_from=f"this is the sweep's run file, from which each trial starts before the settings drawn for "
        f"it replace its own; <code>{SWEEP_FILE}</code> in this folder holds it with the search space, "
        f"and <code>{escape(BEST_RUN_FILE)}</code> trains the best trial's settings again.",
    )


def _how_to_read(plan, counts: dict, retried: int) -> str:
    return (
        f"{plan.trials} trials asked for; "
        + ", ".join(f"{n} {state.lower()}" for state, n in counts.items())
        + (f" ({retried} more interrupted and retried)" if retried else "")
        + ". Each trial trains the run with the settings drawn by Optuna's TPE sampler (seed "
        f"{plan.seed}); its value is its best epoch's validation mse_de (lower is better), reported after every "
        "epoch, and a trial behind the median of the earlier trials at the same epoch is pruned (stopped). The "
        "test set is never used to choose. Highlighted: the best trial; each number links to its run report."
    )


def _best_section(folder: Path, best: dict | None, report: dict | None) -> str:
    """The best trial's test verdicts, the sweep's, with its forest plot."""
    if best is None or report is None:
        return "<h2>The best trial on test</h2>\n<p>No trial finished with a test report.</p>"
    from gears_ddp.report.verdicts import interval_basis, outcome_line, report_verdicts

    verdicts = report_verdicts(report, (None,)) if "model" in report else []
    picture = Path(best["folder"]) / "plots" / "differences_all.png"
    image = (
        f'<figure><img src="{escape(Path(os.path.relpath(picture, folder)).as_posix())}" alt="the best '
        f'trial against each baseline"></figure>'
        if picture.is_file()
        else ""
    )
    outcome = outcome_line(verdicts, interval_basis(verdicts)) if verdicts else "its split has no test set"
    return (
        '<h2>The best trial on test</h2>\n<p class="note">The best trial was chosen on validation alone; its '
        "test verdicts are the ones that stand for the sweep. Every trial, an ordinary run, scores its test "
        "set too (its own report has its verdicts): choosing a trial by those would be choosing on test, "
        f"and would overstate them.</p>\n<p>Trial {best['number']}: {escape(outcome)}. Its "
        f'<a href="{escape(Path(os.path.relpath(Path(best["folder"]) / PAGE_FILE, folder)).as_posix())}">run '
        f"report</a> has every metric; <code>{escape(BEST_RUN_FILE)}</code> trains its settings again.</p>\n" + image
    )
