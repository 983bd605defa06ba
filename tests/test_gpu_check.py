"""``benchmarks/gpu_check.sh --small``: every stage of the GPU check, at small sizes on the
CPU, run as the two device calls its header gives, and the archives they write; and how a
GPU run's archive is recorded in ``benchmarks/RESULTS.md`` (what it measures on a GPU is
recorded there, never asserted here)."""

import importlib
import json
import math
import os
import re
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
STAGES = {
    "environment",
    "wheels",
    "data",
    "demo",
    "published",
    "epoch",
    "resume",
    "profile",
    "tests",
    "precision",
    "width",
    "screen",
}
SEVEN_MINUTES = 420


def _budgets() -> dict[str, int]:
    """The stage budgets the script declares (``BUDGET=([name]=seconds ...)``)."""
    declared = re.search(r"declare -A BUDGET=\((.*?)\)", SCRIPT.read_text(encoding="utf-8"), re.DOTALL).group(1)
    return {name: int(seconds) for name, seconds in re.findall(r"\[(\w+)\]=(\d+)", declared)}


def _data_stages() -> set[str]:
    """The stages the script starts the data stage for (``DATA_STAGES=" a b "``)."""
    return set(re.search(r'^DATA_STAGES="([\w ]+)"', SCRIPT.read_text(encoding="utf-8"), re.MULTILINE).group(1).split())


def _documented_calls() -> list[set[str]]:
    """The stages of each device call the script's header gives (``--stages a,b,c`` lines)."""
    return [
        set(names.split(","))
        for names in re.findall(r"^#\s+--stages ([\w,]+)\s", SCRIPT.read_text(encoding="utf-8"), re.MULTILINE)
    ]


def test_the_documented_calls_cover_every_stage_and_each_fits_in_seven_minutes():
    budgets = _budgets()
    assert set(budgets) == STAGES
    calls = _documented_calls()
    assert len(calls) == 2 and set.union(*calls) == STAGES - {"environment", "wheels", "data"}
    for chosen in calls:  # environment and wheels run in each; the data stage beside the others
        assert sum(budgets[name] for name in chosen | {"environment", "wheels"}) <= SEVEN_MINUTES - 15, chosen


def _small_check(folder: Path, *options: str) -> subprocess.CompletedProcess:
    environment = {
        **os.environ,
        "OUT": str(folder / "out"),
        "GPU_CHECK_WORK": str(folder / "work"),
        "GPU_CHECK_WHEELS": str(folder / "no-wheels"),
        "PYTHON": sys.executable,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), "--small", *options],
        cwd=folder,
        env=environment,
        capture_output=True,
        text=True,
        timeout=1500,
    )


def test_an_unknown_stage_is_refused_before_any_stage_runs(tmp_path):
    refused = _small_check(tmp_path, "--stages", "tests,epochs")
    assert refused.returncode == 2 and "no stage 'epochs'" in refused.stderr
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """The small check run as the header's two device calls, one after the other: for each,
    (its stages, its completed process, the archive's extracted folder, $OUT)."""
    calls = []
    for number, chosen in enumerate(_documented_calls()):
        folder = tmp_path_factory.mktemp(f"gpu_check_call_{number}")
        out = folder / "out"
        done = _small_check(folder, "--stages", ",".join(sorted(chosen)))
        extracted = folder / "extracted"
        if (out / "gpu_check.tar.gz").exists():
            with tarfile.open(out / "gpu_check.tar.gz") as archive:
                archive.extractall(extracted, filter="data")
        calls.append((chosen, done, extracted / "gpu_check", out))
    return calls


def _json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _read(small_run, name: str) -> dict:
    """The JSON file ``name`` of the archive of the call that wrote it."""
    return _json(_archived(small_run, name))


def _archived(small_run, name: str) -> Path:
    """``name`` in the archive of the call that wrote it (environment and wheels: the first)."""
    found = [results / name for _, _, results, _ in small_run if (results / name).exists()]
    assert found, f"{name} is in neither call's archive"
    return found[0]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(1500)
def test_each_documented_call_runs_its_stages_alone_and_together_they_run_every_stage(small_run):
    ran = set()
    for chosen, done, results, out in small_run:
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
        summary = _json(results / "summary.json")
        names = [stage["stage"] for stage in summary["stages"]]
        # environment and wheels first; the data stage beside the stages that read its datasets
        data = {"data"} if chosen & _data_stages() else set()
        assert names[:2] == ["environment", "wheels"] and set(names[2:]) == chosen | data, names
        assert all(stage["rc"] == 0 for stage in summary["stages"]), summary["stages"]
        assert summary["failed"] == [] and _json(out / "summary.json") == summary
        for stage in summary["stages"]:
            assert 0 < stage["seconds"] <= stage["limit_s"], stage
            assert (results / f"{stage['stage']}.log").exists()
        table = done.stdout[done.stdout.index("| stage") :]
        assert all(f"| {name}" in table for name in names) and "all passed" in table
        ran |= set(names)
    assert ran == STAGES


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(1500)
def test_the_archive_holds_each_stage_s_figures(small_run):
    env = _read(small_run, "env.json")
    assert env["torch"] and env["python"] and env["gpu"] is None  # a CPU machine
    assert _read(small_run, "wheels.json")["missing"] == []
    suite = ElementTree.parse(_archived(small_run, "tests.xml")).getroot().find("testsuite")
    assert int(suite.get("tests")) > 0 and int(suite.get("failures")) == int(suite.get("errors")) == 0

    runs = [
        run
        for name in ("epoch_graphs.json", "epoch_fp16.json", "epoch_256.json")
        for run in _read(small_run, name)["results"]
    ]
    assert sorted((r["batch_size"], r["amp"]) for r in runs) == sorted(
        [(32, "off"), (32, "bf16"), (32, "fp16"), (256, "off"), (256, "bf16")]
    )
    assert {r["cuda_graphs"] for r in runs} == {"on"} and {r["steps"] for r in runs} == {"eager"}  # no graph on a CPU
    assert all(r["epoch_s"] > 0 for r in runs)
    profile = _read(small_run, "profile.json")["settings"]
    assert [(s["compile"], s["amp"], s["replayed"]) for s in profile] == [(False, "off", False)]  # no graph on a CPU
    assert all(s["step_ms"] > 0 and s["floor_ms"] > 0 and len(s["kernels"]) == 15 for s in profile)
    assert all(0 < k["share"] <= 1 and k["calls_per_step"] > 0 for s in profile for k in s["kernels"])
    # each operator with its input shapes, their megabytes at 4 bytes a value, and its time
    operators = [row for s in profile for row in s["operators"]]
    assert len(operators) == 15 and all(
        row["name"].startswith("aten::") and row["us_per_step"] > 0 for row in operators
    )
    shaped = [row for row in operators if row["shapes"]]
    assert shaped and all(
        row["input_mb"] == pytest.approx(4e-6 * sum(math.prod(shape) for shape in row["shapes"])) for row in shaped
    )

    width = _read(small_run, "width.json")
    assert set(width["step_s"]) == {"off", "bf16"} and width["vcc_epoch_s"]["off"] > 0
    screen = _read(small_run, "screen.json")["screen"]
    assert screen["pairs"] == 45 and screen["pairs_per_s"] > 0  # 10 genes
    larger = screen["larger"]  # then 12 genes, on the same model: projected well within its 30 s
    assert larger["pairs"] == 66 and larger["pairs_per_s"] > 0 and "skipped" not in larger
    assert larger["projected_seconds"] == pytest.approx(66 / screen["pairs_per_s"])
    published = _read(small_run, "published.json")
    assert published["gears_ddp"]["epoch"] > 0
    # each benchmark child's own output, as it ran (BENCH_CHILD_LOGS): gears_ddp's side of
    # the published stage ends with its timing line
    assert "where the time went:" in _archived(small_run, "children/ours.log").read_text()
    assert (
        published["published"] is not None
        if published["published_installed"]
        else "not installed" in _archived(small_run, "published.log").read_text()
    )


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(1500)
def test_the_demo_reports_and_the_killed_job_resumes_from_its_newest_checkpoint(small_run):
    report = _read(small_run, "demo_report.json")
    assert len(report["history"]) == 1 and "test_pearson_delta" in report["model"]
    resume = _read(small_run, "resume.json")
    killed, resumed = resume["killed"], resume["resumed"]
    assert resume["failures"] == []
    # torchrun and its one worker killed mid-run (SIGKILL: exit -9), none left running, after step 6's checkpoint
    assert killed["killed"] and killed["exit"] == -9 and killed["processes_killed"] == 2 and killed["survivors"] == 0
    newest = max(killed["checkpoints"])
    assert newest >= 6 and newest % 3 == 0
    assert resumed["resumed_from"]["checkpoint"] == f"checkpoint-{newest:09d}.pt" and resumed["epochs"] == 2
    logged = _archived(small_run, "resume/resumed.log").read_text()
    assert re.search(rf"resuming from \S+checkpoint-{newest:09d}\.pt: epoch [12], after optimiser step \d+", logged)
    assert "resuming from" not in _archived(small_run, "resume/killed.log").read_text()


@pytest.fixture
def gpu_check_report(monkeypatch, tmp_path):
    """benchmarks/gpu_check_report.py as a module, recording into a RESULTS.md of its own."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    module = importlib.import_module("gpu_check_report")
    monkeypatch.setattr(module, "RESULTS", tmp_path / "RESULTS.md")
    return module


def _archive_of(folder: Path, gpu: str | None, stages: tuple = ()) -> Path:
    """An extracted archive's folder as gpu_check.sh leaves it, with the files record reads
    (``stages``: those summary.json lists)."""
    folder.mkdir()
    (folder / "env.json").write_text(
        json.dumps(
            {
                "machine": "a test machine",
                "gpu": gpu,
                "cuda": "13.0",
                "cudnn": 91000,
                "nccl": "2.27.7",
                "nvidia_smi": f"name, driver_version\n{gpu}, 580.159.04" if gpu else None,
            }
        )
    )
    (folder / "summary.json").write_text(
        json.dumps({"date": "2026-11-27", "stages": [{"stage": stage} for stage in stages]})
    )
    (folder / "summary.txt").write_text("| stage | key figures |\n|---|---|\n| epoch | an epoch 1.2 s |\n")
    (folder / "epoch.log").write_text("data: ready\n| batch | epoch s |\n|---:|---:|\n| 32 | 1.20 |\nprogress\n")
    return folder


def test_the_wheels_stage_checks_every_requirement_of_setup_py(gpu_check_report, tmp_path):
    # the packages the GPU machine lacks are carried as wheels: one that setup.py asks for and
    # nobody carried (optuna, once) must fail the wheels stage, not a later stage's imports
    assert {requirement.name for requirement in gpu_check_report.runtime_requirements()} >= {"torch", "optuna"}
    setup_py = tmp_path / "setup.py"
    setup_py.write_text('setup(name="x", install_requires=["numpy>=1.0", "numpy-too-new>=1", "pytest>=999"])\n')
    assert gpu_check_report.packages(tmp_path / "wheels.json", None, setup_py) == 1
    found = json.loads((tmp_path / "wheels.json").read_text())
    assert found["missing"] == ["numpy-too-new", "pytest"]
    assert found["versions"]["numpy-too-new"].startswith("not importable: PackageNotFoundError")
    assert found["versions"]["pytest"].endswith("but setup.py asks for pytest>=999")
    assert not found["versions"]["numpy"].startswith("not importable")
    setup_py.write_text('setup(name="x", install_requires=["numpy>=1.0"])\n')
    assert gpu_check_report.packages(tmp_path / "wheels.json", None, setup_py) == 0


def test_the_wheels_stage_s_figures_hold_scanpy_and_read_a_record_without_it(gpu_check_report, tmp_path):
    # scanpy is no requirement of gears_ddp (the tests compare with it): its version is still
    # reported, and a wheels.json of a check that did not report it is still summarised
    gpu_check_report.packages(tmp_path / "wheels.json", None)
    assert "scanpy" in json.loads((tmp_path / "wheels.json").read_text())["versions"]
    (tmp_path / "wheels.json").write_text(json.dumps({"wheels": [], "versions": {"pandas": "2.3.3"}, "missing": []}))
    assert gpu_check_report._wheels(tmp_path)[1] == "0 wheels installed; pandas 2.3.3"


def _bash_array(script: Path, name: str) -> set[str]:
    """The distributions a script's bash array ``name=( ... )`` names (``pkg==1.0``,
    ``"pkg>=3,<4"``; comments left out), canonical."""
    body = re.search(rf"^{name}=\((.*?)^\)", script.read_text(encoding="utf-8"), re.MULTILINE | re.DOTALL).group(1)
    words = " ".join(line.split("#")[0] for line in body.splitlines()).split()
    return {canonicalize_name(Requirement(word.strip('"')).name) for word in words}


def test_every_requirement_of_setup_py_is_carried_to_the_gpu_machine_or_in_its_image(gpu_check_report):
    # a requirement added to setup.py must be carried as a wheel (gpu_check.sh's WHEELS) unless
    # the machine's image has it (the rehearsal's IMAGE, read from the workplace's notes)
    carried = _bash_array(SCRIPT, "WHEELS")
    image = _bash_array(ROOT / "benchmarks" / "gpu_check_rehearsal.sh", "IMAGE")
    assert {"pandas", "anndata", "cell-gears"} <= carried and {"torch", "numpy"} <= image
    needed = {canonicalize_name(r.name) for r in gpu_check_report.runtime_requirements()}
    assert needed - carried - image == set()


def test_a_gpu_run_is_recorded_with_its_gpu_and_tables_and_a_cpu_run_is_not(gpu_check_report, tmp_path):
    gpu_check_report.record(_archive_of(tmp_path / "gpu", "NVIDIA H100 80GB HBM3"))
    recorded = (tmp_path / "RESULTS.md").read_text()
    assert "## 2026-11-27: `bash benchmarks/gpu_check.sh`" in recorded
    assert "NVIDIA H100 80GB HBM3, 580.159.04" in recorded and "CUDA 13.0" in recorded
    assert "| epoch | an epoch 1.2 s |" in recorded and "| 32 | 1.20 |" in recorded and "progress" not in recorded
    with pytest.raises(SystemExit, match="only a GPU's figures are recorded"):
        gpu_check_report.record(_archive_of(tmp_path / "cpu", None))
    assert (tmp_path / "RESULTS.md").read_text() == recorded


def test_a_run_of_chosen_stages_is_recorded_with_its_command(gpu_check_report, tmp_path):
    every = ("environment", "wheels", "data", *sorted(STAGES - {"environment", "wheels", "data"}))
    gpu_check_report.record(_archive_of(tmp_path / "all", "NVIDIA H200", every))
    gpu_check_report.record(
        _archive_of(tmp_path / "two", "NVIDIA H200", ("environment", "wheels", "published", "tests"))
    )
    headers = re.findall(r"^## .*$", (tmp_path / "RESULTS.md").read_text(), re.MULTILINE)
    assert headers == [
        "## 2026-11-27: `bash benchmarks/gpu_check.sh`",
        "## 2026-11-27: `bash benchmarks/gpu_check.sh --stages published,tests`",
    ]


def test_a_failed_compile_is_a_recorded_setting_of_the_profile(gpu_check_report, tmp_path):
    kernels = [{"name": "ampere_sgemm", "calls_per_step": 2.0, "us_per_step": 40.0, "share": 0.4}]
    (tmp_path / "profile.json").write_text(
        json.dumps(
            {
                "settings": [
                    {
                        "compile": False,
                        "amp": "off",
                        "replayed": True,
                        "step_ms": 3.75,
                        "floor_ms": 0.5,
                        "kernels": kernels,
                    },
                    {"compile": True, "amp": "off", "failed": "BackendCompilerFailed: backend='inductor' raised:"},
                ]
            }
        )
    )
    figures, headline = gpu_check_report._profile(tmp_path)
    assert figures["compile on, fp32"] == {"failed": "BackendCompilerFailed: backend='inductor' raised:"}
    assert figures["compile off, fp32"]["step_ms"] == 3.75
    assert headline == "a step compile off 3.75 ms (7.5x its products; top: ampere_sgemm 40%); compile on fp32: failed"


def test_a_larger_screen_that_would_not_end_in_its_limit_is_not_run_and_says_why(monkeypatch, capsys):
    """bench_screen.py's larger screen (Norman's 5,151 pairs after 1,225 in the GPU check):
    at the first screen's 49 pairs/s (the H200 of 2026-12-04) it would take 105 s, above its
    30 s, so no pair of it is screened and its figures say why; at 500 pairs/s it runs."""
    import argparse

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    bench_screen = importlib.import_module("bench_screen")
    genes = [f"G{index}" for index in range(102)]
    monkeypatch.setattr(bench_screen, "perturbed_genes", lambda gears: genes)
    screened = []

    def screen(gears, chosen, processes, gpu_ids):
        screened.append(len(chosen))
        pairs = len(chosen) * (len(chosen) - 1) // 2
        return bench_screen.Timing("stand-in", pairs, pairs / 500, 1.0), list(range(pairs))

    monkeypatch.setattr(bench_screen, "our_pair_screen", screen)
    args = argparse.Namespace(larger_screen_genes=102, larger_screen_limit_s=30.0, gpu_ids=[0])
    slow = bench_screen.larger_screen(None, bench_screen.Timing("first", 1225, 1225 / 49, 1.0), args, 1)
    assert screened == [] and slow["pairs"] == 5151 and "seconds" not in slow
    assert slow["projected_seconds"] == pytest.approx(5151 / 49)
    assert slow["skipped"] == (
        "5,151 pairs not screened: about 105 s at the first screen's 49 pairs/s, above --larger-screen-limit-s 30"
    )
    assert slow["skipped"] in capsys.readouterr().out
    fast = bench_screen.larger_screen(None, bench_screen.Timing("first", 1225, 1225 / 500, 1.0), args, 1)
    assert screened == [102] and fast["pairs"] == 5151 and fast["pairs_per_s"] == pytest.approx(500)
    assert fast["projected_seconds"] == pytest.approx(5151 / 500)


def test_the_screen_s_key_figures_name_the_larger_screen_or_why_it_was_not_run(gpu_check_report, tmp_path):
    first = {"pairs": 1225, "seconds": 25.0, "pairs_per_s": 49.0}
    for larger, said in (
        (
            {"pairs": 5151, "seconds": 10.3, "pairs_per_s": 500.0},
            "1,225 pairs in 25.0 s, 49 pairs/s; 5,151 pairs in 10.3 s, 500 pairs/s",
        ),
        (
            {"pairs": 5151, "projected_seconds": 5151 / 49.0, "skipped": "..."},
            "1,225 pairs in 25.0 s, 49 pairs/s; 5,151 not screened (about 105 s)",
        ),
    ):
        (tmp_path / "screen.json").write_text(json.dumps({"screen": {**first, "larger": larger}}))
        assert gpu_check_report._pair_screen(tmp_path)[1] == said


def _timed_setting(compile: bool, amp: str) -> dict:
    """What ``bench_step_profile.profile_setting`` returns, for a step of 2 ms."""
    return {
        "compile": compile,
        "amp": amp,
        "sets_per_batch": 4,
        "replayed": False,
        "step_ms": 2.0,
        "floor_ms": 1.0,
        "kernels": [],
        "operators": [],
    }


def _profiled(monkeypatch, tmp_path, setting, compile: list[str]) -> list[dict]:
    """``bench_step_profile.measure`` over the ``compile`` settings with ``setting`` standing
    in for ``profile_setting`` (no data, no model): the settings of its JSON."""
    import argparse
    import types

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    profile = importlib.import_module("bench_step_profile")
    monkeypatch.setattr(profile, "profile_setting", setting)
    monkeypatch.setattr(
        profile, "load_synthetic", lambda *_: types.SimpleNamespace(adata=types.SimpleNamespace(n_obs=100, n_vars=10))
    )
    out = tmp_path / "profile.json"
    arguments = {"device": "cpu", "data_path": None, "amp": ["off"], "batch_size": 32, "steps": 2, "top": 5}
    profile.measure(argparse.Namespace(compile=compile, json=str(out), **arguments))
    return json.loads(out.read_text())["settings"]


def test_the_profile_records_a_failed_compile_and_measures_the_other_settings(monkeypatch, tmp_path, capsys):
    """bench_step_profile.py: a setting whose torch.compile fails (as on the H200 of
    2026-11-28) is a row of its JSON with the error, and the settings after it still run."""
    import torch

    def setting(pert_data, device, batch_size, steps, compile, amp, top):
        if compile:
            error = RuntimeError("element 2 of tensors does not require grad")
            try:  # the frame to name: an argument of newer releases (2.13), not of 2.4
                raise torch._dynamo.exc.BackendCompilerFailed(lambda: None, error, None)
            except TypeError:
                raise torch._dynamo.exc.BackendCompilerFailed(lambda: None, error) from None
        return _timed_setting(False, amp)

    settings = _profiled(monkeypatch, tmp_path, setting, ["on", "off"])
    assert settings[0] == {
        "compile": True,
        "amp": "off",
        "failed": "backend='<lambda>' raised: RuntimeError: element 2 of tensors does not require grad",
    }
    assert settings[1]["compile"] is False and settings[1]["step_ms"] == 2.0
    assert "compile on, amp off: torch.compile failed" in capsys.readouterr().out


def test_the_profile_does_not_time_a_compiled_step_under_a_release_where_train_refuses_it(monkeypatch, tmp_path):
    """bench_step_profile.py under a torch release of ``COMPILE_FAILS_UNDER_TORCH`` (2.11.0,
    whose compiled step computes zero gradients for most layers): ``compile on`` is a row
    saying it was refused and why, never a timed step; ``compile off`` is timed as always."""
    import torch

    from gears_ddp.training import training_options

    monkeypatch.setattr(training_options, "COMPILE_FAILS_UNDER_TORCH", (torch.__version__.split("+")[0],))
    timed = []

    def setting(pert_data, device, batch_size, steps, compile, amp, top):
        timed.append(compile)
        return _timed_setting(compile, amp)

    settings = _profiled(monkeypatch, tmp_path, setting, ["off", "on"])
    assert timed == [False]
    assert settings[1]["compile"] is True
    assert settings[1]["failed"].startswith(
        "refused: --compile on is True, but torch.compile fails on the GEARS network"
    )


def test_a_table_in_a_log_stays_whole_when_a_warning_lands_between_its_rows(gpu_check_report, tmp_path):
    """A benchmark prints a table's header, then its rows as they are measured, while its
    stderr (the same log) gets a warning in between: the recorded table is the header and
    every row; a second table, after its own header, is a table of its own."""
    log = tmp_path / "epoch.log"
    log.write_text(
        "data: 100 cells\n"
        "| batch | amp |\n|------:|----:|\n"
        "graph_conv.py:162: UserWarning: Sparse invariant checks are implicitly disabled.\n"
        "  torch.sparse_coo_tensor(...)\n"
        "|    32 | off |\n|    32 | bf16 |\n"
        "done\n"
        "| kernel | share |\n|---|---:|\n| gemm | 40% |\n",
        encoding="utf-8",
    )
    assert gpu_check_report.printed_tables(log) == (
        "| batch | amp |\n|------:|----:|\n|    32 | off |\n|    32 | bf16 |\n"
        "\n| kernel | share |\n|---|---:|\n| gemm | 40% |"
    )
