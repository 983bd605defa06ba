"""The files a run leaves in its ``save_path`` besides the model, written by the main rank:

- ``config.yaml``: the resolved configuration (``gears_ddp.configuration.run_options``), which
  ``gears-ddp train --config`` reads back;
- ``metrics.csv``: one row per epoch (training loss, train and val metrics, seconds),
  rewritten after every epoch, so it is complete after a resume too;
- ``train.log``: the library's log records of the main rank (appended across resumes), and
  how a stopped or failed run ended;
- ``report.json``: the final report (NaN written as null), with ``timing``, the wall
  seconds of the run's phases (``runtime.phase_clock``), and, with a test set, the
  per-perturbation values, the spread of each method's predictions and the verdicts against
  the baselines with their intervals (``training.trainer.Trainer.score_test``);
- ``plots/*.png`` and ``report.html``: the curves, the test metrics beside the baselines,
  the paired differences with their intervals (one forest plot per test subgroup),
  predicted against true changes, and one page that shows them with the run's settings.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
from pathlib import Path

import yaml

from gears_ddp._logging import LIBRARY_LOGGER_NAME
from gears_ddp.data.io import atomic_path
from gears_ddp.data.stop_signals import Stopped
from gears_ddp.evaluation.paired_bootstrap import NOT_APPLICABLE
from gears_ddp.report.equal_baselines import equal_baseline_groups, group_heading
from gears_ddp.report.page import write_report_page
from gears_ddp.report.verdicts import (
    SUBGROUP_METRICS,
    SUBGROUP_NAMES,
    report_verdicts,
    shown_subgroups,
    whole_test_set_name,
)
from gears_ddp.runtime.phase_clock import PhaseClock
from gears_ddp.runtime.stopping import TrainingInterrupted

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.csv"
LOG_FILE = "train.log"
REPORT_FILE = "report.json"
PAGE_FILE = "report.html"
SWEEP_FILE = "sweep.yaml"  # a sweep folder's plan (sweeps.train_sweep), written before its first trial
PICTURES = {
    "Training": "plots/training_curves.png",
    "Test metrics beside the baselines": "plots/test_metrics.png",
    "Predicted and true change at the top DE genes": "plots/predictions.png",
}
INTERVALS_PICTURE = "plots/differences_{}.png"  # per test subgroup ('all': all test conditions)


def write_history(folder, history: list[dict]) -> Path:
    """``folder/metrics.csv``: one row per epoch, one column per key of the records."""
    path = Path(folder) / METRICS_FILE
    columns = list(dict.fromkeys(key for record in history for key in record))
    with atomic_path(path) as tmp, open(tmp, "w", newline="", encoding="utf-8") as out:
        writer = csv.DictWriter(out, fieldnames=columns)
        writer.writeheader()
        writer.writerows(history)
    return path


@contextlib.contextmanager
def log_file(folder):
    """While active, the library's log records also go to ``folder/train.log``. A block
    ended by an exception writes how it ended as the file's last record (``ending_record``),
    there only: the console already says it, and without it a stopped or failed run's log
    would end mid-epoch with no word of why."""
    handler = logging.FileHandler(Path(folder) / LOG_FILE, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    logger = logging.getLogger(LIBRARY_LOGGER_NAME)
    previous = logger.level
    if previous == logging.NOTSET or previous > logging.INFO:
        logger.setLevel(logging.INFO)  # the file gets the progress even when the console does not
    logger.addHandler(handler)
    try:
        yield handler
    except BaseException as ended:
        handler.handle(ending_record(logger, ended))
        raise
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
        handler.close()


def ending_record(logger: logging.Logger, ended: BaseException) -> logging.LogRecord:
    """The log record of a run ended by ``ended``: a stop (a signal at a step boundary, with
    the checkpoint to continue from; a signal outside the steps; Ctrl-C) a warning with its
    message; anything else an error with its traceback."""
    if isinstance(ended, (TrainingInterrupted, Stopped, KeyboardInterrupt)):
        message = str(ended) or "stopped by Ctrl-C"
        return logger.makeRecord(logger.name, logging.WARNING, __file__, 0, message, (), None)
    message = f"the run ended with {type(ended).__name__}: {ended}"
    return logger.makeRecord(
        logger.name, logging.ERROR, __file__, 0, message, (), (type(ended), ended, ended.__traceback__)
    )


def read_settings(folder) -> dict:
    """The run's configuration as ``config.yaml`` holds it (empty when there is none)."""
    path = Path(folder) / CONFIG_FILE
    return yaml.safe_load(path.read_text(encoding="utf-8")) or {} if path.exists() else {}


def write_json(path, value) -> Path:
    """Write ``value`` as strict JSON (NaN and infinities as null) at ``path``, atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        Path(tmp).write_text(json.dumps(json_safe(value), indent=1), encoding="utf-8")
    return path


def json_safe(value):
    """``value`` with NaN and infinities (nested in dicts and lists) as None."""
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_run_report(
    folder, report: dict, examples: list[dict], clock: PhaseClock | None = None, draw_pictures: bool = True
) -> Path:
    """The pictures (unless ``draw_pictures`` is False: ``args.report_pictures``, the page then
    says they were not drawn), ``report.html`` and ``report.json`` (the report and its verdicts, and
    with ``clock`` its ``timing`` up to the moment it is written: last, so that the
    pictures and the page are counted in, and written even when they fail); returns the
    page's path. ``examples`` are the test conditions of the predictions picture
    (``report.examples.prediction_examples``); without a test set there are only curves.
    With a test set, one forest plot of the paired differences per test subgroup shown
    (``plots.figure_intervals``: ``INTERVALS_PICTURE``): every headline metric over all test
    conditions, ``SUBGROUP_METRICS`` per subgroup, as the console shows them; none for a
    subgroup without any interval (fewer than 3 perturbations)."""
    folder = Path(folder)
    try:
        if not draw_pictures:
            return write_report_page(folder / PAGE_FILE, read_settings(folder), report, None)
        # matplotlib is imported here, by the main rank only, not by every rank that imports this module
        from gears_ddp.report.plots import plot_intervals, plot_predictions, plot_test_metrics, plot_training_curves

        titles = list(PICTURES)
        pictures = {titles[0]: PICTURES[titles[0]]}
        plot_training_curves(report["history"], report["best_epoch"], folder / PICTURES[titles[0]])
        verdicts = None
        if "model" in report:
            plot_test_metrics(report["model"], report["baselines"], folder / PICTURES[titles[1]])
            pictures[titles[1]] = PICTURES[titles[1]]
            verdicts = report_verdicts(report, (None, *shown_subgroups(report["model"])))
            groups = equal_baseline_groups(report["baselines"])
            for subgroup in dict.fromkeys(verdict.subgroup for verdict in verdicts):
                name = whole_test_set_name(report["model"]) if subgroup is None else SUBGROUP_NAMES.get(subgroup)
                title = f"GEARS against each baseline, perturbation by perturbation: {name}"
                rows = [
                    (
                        v.metric,
                        v.higher_is_better,
                        {
                            group_heading(group): v.comparisons[group[0]]
                            for group in groups
                            if group[0] in v.comparisons
                        },
                    )
                    for v in verdicts
                    if v.subgroup == subgroup and (subgroup is None or v.metric in SUBGROUP_METRICS)
                ]
                if not any(c.verdict != NOT_APPLICABLE for _, _, comparisons in rows for c in comparisons.values()):
                    continue  # no interval to draw (fewer than 3 perturbations): the table says why
                relative = INTERVALS_PICTURE.format(subgroup or "all")
                plot_intervals(rows, title, folder / relative)
                pictures[title] = relative
            if examples:
                plot_predictions(examples, folder / PICTURES[titles[2]])
                pictures[titles[2]] = PICTURES[titles[2]]
        return write_report_page(folder / PAGE_FILE, read_settings(folder), report, pictures, verdicts)
    finally:
        written = dict(report)
        if clock is not None:
            written["timing"] = clock.so_far()
        write_json(folder / REPORT_FILE, written)
