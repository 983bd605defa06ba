"""What the verdicts' intervals add to a run: the paired bootstraps of ``verdicts.compare``
over a test set of N perturbations, in a fresh process (its first call included).

    python benchmarks/bench_verdicts.py [--perturbations 100] [--repeats 5] [--record]

A run computes the verdicts once, when it scores the test set (``Trainer.score_test``:
every headline metric, over all test conditions and each subgroup, against each baseline);
its report page reads them back from the report's records (``verdicts.report_verdicts``)
and draws one forest plot per subgroup shown (every headline metric over all test
conditions, ``pearson_delta`` and ``mse_de`` per subgroup). The test set here: N perturbations in 4 subgroups of a
simulation split, 5 baselines (no change, mean effect, additive, linear, linear_pretrained),
each method's value of every headline metric drawn at random per perturbation (the cost does
not depend on the values). Printed: the first call's seconds (the interval's quantile
function imported then) and the median of the repeats, for the scoring's verdicts, the
page's and both; then the forest plots' seconds, for information (drawing, not bootstrapping).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from harness.record import add_record_argument, recorded
from harness.tables import format_number, print_table

BASELINES = ("no_change", "mean_effect", "additive", "linear", "linear_pretrained")
SUBGROUPS = ("combo_seen0", "combo_seen1", "combo_seen2", "unseen_single")


def test_report(perturbations: int, seed: int = 0) -> dict:
    """A report as ``Trainer.score_test`` writes it, its values drawn at random."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from verdict_reports import report_from_values

    from gears_ddp.report.verdicts import HEADLINE_METRICS

    rng = np.random.default_rng(seed)
    subgroups = {name: list(rows) for name, rows in zip(SUBGROUPS, np.array_split(np.arange(perturbations), 4))}

    def values():
        return {metric: rng.normal(0.3, 0.1, perturbations) for metric in HEADLINE_METRICS}

    return report_from_values(values(), {name: values() for name in BASELINES}, subgroups)


def seconds(call, repeats: int) -> tuple[float, float]:
    """The first call's wall seconds and the median of ``repeats`` more."""
    started = time.perf_counter()
    call()
    first = time.perf_counter() - started
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return first, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--perturbations", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    add_record_argument(parser)
    options = parser.parse_args()
    report = test_report(options.perturbations)
    from gears_ddp.evaluation.paired_bootstrap import RESAMPLES
    from gears_ddp.report.verdicts import SUBGROUP_METRICS, compare, report_verdicts, shown_subgroups, verdict_records

    shown = (None, *shown_subgroups(report["model"]))
    scoring = seconds(lambda: compare(report), options.repeats)
    verdicts = compare(report)
    written = {**report, "verdicts": verdict_records(verdicts)}
    page = seconds(lambda: report_verdicts(written, shown), options.repeats)
    comparisons = sum(len(verdict.comparisons) for verdict in verdicts)

    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        from gears_ddp.report.plots import plot_intervals

        for subgroup in shown:
            rows = [
                (v.metric, v.higher_is_better, v.comparisons)
                for v in verdicts
                if v.subgroup == subgroup and (subgroup is None or v.metric in SUBGROUP_METRICS)
            ]
            plot_intervals(rows, str(subgroup), Path(folder) / f"{subgroup}.png")
        drawing = time.perf_counter() - started
    with recorded(options.record):
        print(
            f"{options.perturbations} test perturbations in 4 subgroups, {len(BASELINES)} baselines, "
            f"{len(verdicts)} verdicts ({comparisons} paired comparisons) over all test conditions and the "
            f"subgroups, {RESAMPLES:,} resamples each; median of {options.repeats} repeats after the first call\n"
        )
        print_table(
            ["verdicts", "first call (s)", "median (s)"],
            [
                ["scoring the test set (every subgroup)", format_number(scoring[0]), format_number(scoring[1])],
                ["the report page: read back from the records", format_number(page[0]), format_number(page[1])],
                [
                    "both: what the intervals add to a run",
                    format_number(scoring[0] + page[1]),
                    format_number(scoring[1] + page[1]),
                ],
            ],
        )
        print(f"\nfor information, drawing the {len(shown)} forest plots: {drawing:.2f} s")


if __name__ == "__main__":
    main()
