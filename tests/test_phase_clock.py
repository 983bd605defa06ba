"""Where a run's time went: the phases of ``runtime.phase_clock``, the line that ends a run's
log and the ``timing`` of its report."""

import json
import time

import pytest
import torch

from gears_ddp import GEARS
from gears_ddp.runtime.phase_clock import PhaseClock

RUN_PHASES = ["set-up", "epochs", "test", "baselines", "interactions", "report"]


def test_phases_add_up_in_the_order_they_first_ran():
    clock = PhaseClock()
    with clock.phase("set-up"):
        pass
    clock.add("epochs", 2.0)
    with clock.phase("set-up"):
        time.sleep(0.01)
        assert list(clock.so_far()) == ["set-up", "epochs"] and clock.so_far()["set-up"] > clock.seconds["set-up"]
    clock.add("epochs", 0.5)
    assert list(clock.seconds) == ["set-up", "epochs"]
    assert clock.seconds["epochs"] == 2.5 and clock.seconds["set-up"] >= 0.01
    line = clock.line()
    assert line.startswith("where the time went: set-up 0.0") and ", epochs 2.50 s (" in line
    assert line.endswith(f"({sum(clock.seconds.values()):.2f} s in all)")


def test_a_run_ends_its_log_and_its_report_with_where_the_time_went(trained_toy, tmp_path):
    gears = GEARS(trained_toy.pert_data)
    torch.manual_seed(0)
    gears.model_initialize(hidden_size=8)
    started = time.perf_counter()
    report = gears.train(epochs=1, save_path=tmp_path / "run")
    wall = time.perf_counter() - started
    assert list(report["timing"]) == RUN_PHASES
    assert all(seconds >= 0 for seconds in report["timing"].values()) and sum(report["timing"].values()) <= wall
    written = json.loads((tmp_path / "run" / "report.json").read_text())["timing"]
    assert list(written) == RUN_PHASES  # written last, inside the report phase: all but the file itself
    assert written["report"] <= report["timing"]["report"]
    assert {k: v for k, v in written.items() if k != "report"} == pytest.approx(
        {k: v for k, v in report["timing"].items() if k != "report"}, abs=0
    )
    last = (tmp_path / "run" / "train.log").read_text().strip().splitlines()[-1]
    assert "where the time went: set-up " in last
    assert [part.split()[0] for part in last.split("where the time went: ")[1].split(", ")] == RUN_PHASES

    untested = GEARS(trained_toy.pert_data)
    untested.model_initialize(hidden_size=8)
    assert list(untested.train(epochs=0)["timing"]) == ["set-up", "epochs", "test", "baselines"]  # no report
