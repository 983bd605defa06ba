"""The JSON of ``benchmarks/gpu_check.sh`` that no benchmark writes: the machine
(``environment``), the Python packages it runs with (``packages``), and the summary of all
stages with a table of their key figures (``summary``); and, back on this machine, its
figures appended to ``benchmarks/RESULTS.md`` (``record``).

    python benchmarks/gpu_check_report.py environment RESULTS/env.json [--nvidia-smi RESULTS/nvidia-smi.csv]
    python benchmarks/gpu_check_report.py packages RESULTS/wheels.json [--wheels DIR]
    python benchmarks/gpu_check_report.py summary RESULTS
    python benchmarks/gpu_check_report.py record RESULTS     (RESULTS: the archive's gpu_check/, extracted)

``summary`` reads ``RESULTS/stages.tsv`` (a line per stage that ran: name, exit status,
wall seconds, CPU seconds of its processes, and the seconds it was allowed) and each
stage's files (the list in ``STAGE_FILES``), writes ``RESULTS/summary.json`` (per stage:
exit status, seconds, CPU seconds, limit, whether it ran out of time, its key figures and
a one-line headline) and prints a table of them. A figure that a stage's files do not hold
is left out of its headline, never guessed. On a shared CPU, wall seconds grow with the
load while CPU seconds hardly do.

``record`` appends to ``benchmarks/RESULTS.md`` a section headed with the date of the run
and the command, a line naming the machine it ran on (``env.json``: the GPU, its driver,
CUDA, cuDNN, NCCL and torch), the summary table (``summary.txt``) and the tables each
benchmark printed in its stage's log: no figure copied by hand.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import importlib
import json
import platform
import sys
import xml.etree.ElementTree as ElementTree
from importlib import metadata
from pathlib import Path

from harness.machine import describe_machine
from harness.record import RESULTS
from harness.tables import print_table
from packaging.requirements import Requirement

TIMED_OUT = 124  # the exit status of `timeout` when the budget ran out
SETUP_PY = Path(__file__).resolve().parents[1] / "setup.py"
# beside gears_ddp's own requirements, reported but not needed: the published GEARS (cell-gears,
# and dcor, which its genetic-interaction scores import), the tests' graph operator, and scanpy,
# whose processing the tests compare with (and the published GEARS imports)
PUBLISHED_SIDE = ("cell-gears", "dcor", "torch-geometric", "scanpy")
IMPORTED = ("numpy", "pandas", "anndata", "optuna")  # imported to prove they work: cheap (scanpy's numba code is not)
STAGE_FILES = {
    "environment": ["env.json"],
    "wheels": ["wheels.json"],
    "data": [],
    "tests": ["tests.xml"],
    "demo": ["demo_report.json"],
    "resume": ["resume.json"],
    "epoch": ["epoch_graphs.json"],
    "profile": ["profile.json"],
    "precision": ["epoch_fp16.json", "epoch_256.json"],
    "width": ["width.json"],
    "screen": ["screen.json"],
    "published": ["published.json"],
}


# ----------------------------------------------------------------------------- environment and packages


def environment(out: Path, nvidia_smi: Path | None) -> None:
    """The machine, Python, torch, CUDA, cuDNN and NCCL versions and the GPUs, to ``out``."""
    import torch

    cuda = torch.cuda.is_available()
    gpus = (
        [
            {
                "name": torch.cuda.get_device_name(i),
                "memory_gib": torch.cuda.get_device_properties(i).total_memory / 2**30,
                "multiprocessors": torch.cuda.get_device_properties(i).multi_processor_count,
            }
            for i in range(torch.cuda.device_count())
        ]
        if cuda
        else []
    )
    figures = {
        "machine": describe_machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "gpu": gpus[0]["name"] if gpus else None,
        "gpus": gpus,
        "nvidia_smi": nvidia_smi.read_text().strip() if nvidia_smi and nvidia_smi.exists() else None,
    }
    out.write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))


def runtime_requirements(setup_py: Path = SETUP_PY) -> list[Requirement]:
    """setup.py's ``install_requires``, read from its text: on the GPU machine gears_ddp runs
    from the checkout, installed by nothing, so no metadata of its own says what it needs."""
    for node in ast.walk(ast.parse(setup_py.read_text(encoding="utf-8"))):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            return [Requirement(text) for text in ast.literal_eval(node.value)]
    raise ValueError(f"{setup_py} has no install_requires")


def packages(out: Path, wheels: Path | None, setup_py: Path = SETUP_PY) -> int:
    """The version of each of gears_ddp's requirements (setup.py's) and of ``PUBLISHED_SIDE``
    (from their metadata; those of ``IMPORTED`` imported too), and the wheels installed from
    ``wheels``, to ``out``; 1 when a requirement is missing, does not import or is of a
    version setup.py does not allow (a stage that needs it would fail: better said first)."""
    versions, missing = {}, []
    needed = {requirement.name: requirement for requirement in runtime_requirements(setup_py)}
    for distribution in [*needed, *PUBLISHED_SIDE]:
        try:
            versions[distribution] = version = metadata.version(distribution)
            if distribution in IMPORTED:
                importlib.import_module(distribution)
        except Exception as err:  # noqa: BLE001 - any failure is the finding
            versions[distribution] = f"not importable: {type(err).__name__}: {err}"
            if distribution in needed:
                missing.append(distribution)
            continue
        if distribution in needed and not needed[distribution].specifier.contains(version, prereleases=True):
            versions[distribution] = f"{version}, but setup.py asks for {needed[distribution]}"
            missing.append(distribution)
    installed = sorted(path.name for path in wheels.glob("*.whl")) if wheels and wheels.is_dir() else []
    figures = {"wheels": installed, "versions": versions, "missing": missing}
    out.write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))
    return 1 if missing else 0


# ----------------------------------------------------------------------------- each stage's key figures


def _json(results: Path, name: str) -> dict | None:
    path = results / name
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _environment(results: Path) -> tuple[dict, str]:
    env = _json(results, "env.json")
    if env is None:
        return {}, ""
    return (
        {key: env[key] for key in ("gpu", "torch", "cuda", "cudnn", "nccl", "python")},
        f"{env['gpu'] or 'no GPU'}; torch {env['torch']}, CUDA {env['cuda']}",
    )


def _wheels(results: Path) -> tuple[dict, str]:
    found = _json(results, "wheels.json")
    if found is None:
        return {}, ""
    versions = found["versions"]
    shown = ", ".join(
        f"{name} {versions[name]}"
        for name in ("pandas", "anndata", "scanpy", "cell-gears")
        if name in versions and not str(versions[name]).startswith("not importable")
    )
    return (
        {"wheels": len(found["wheels"]), "missing": found["missing"], "versions": versions},
        f"{len(found['wheels'])} wheels installed; {shown}"
        + (f"; missing {found['missing']}" if found["missing"] else ""),
    )


def _data(results: Path) -> tuple[dict, str]:
    """The datasets the data stage's scripts said they left ready (a line each)."""
    try:
        ready = [
            line
            for line in (results / "data.log").read_text().splitlines()
            if line.startswith(("dataset ready", "raw data at", "dataset at"))
        ]
    except OSError:
        return {}, ""
    return {"ready": ready}, f"{len(ready)} of 3 datasets ready (epoch, width, screen)"


def _tests(results: Path) -> tuple[dict, str]:
    try:
        root = ElementTree.parse(results / "tests.xml").getroot()
    except (OSError, ElementTree.ParseError):
        return {}, ""
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    counts = {
        key: sum(int(suite.get(key, 0)) for suite in suites) for key in ("tests", "failures", "errors", "skipped")
    }
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for suite in suites
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return (
        {**counts, "passed": passed, "failed": failed},
        f"{passed} passed, {counts['failures'] + counts['errors']} failed, {counts['skipped']} skipped",
    )


def _demo(results: Path) -> tuple[dict, str]:
    report = _json(results, "demo_report.json")
    steps = _steps_in_log(results / "demo.log")
    if report is None:
        return ({"steps": steps}, f"steps: {steps}") if steps != "eager" else ({}, "")
    figures = {
        "epochs": len(report["history"]),
        "world_size": report.get("world_size"),
        "steps": steps,
        "test_pearson_delta": report["model"].get("test_pearson_delta"),
        "epoch_s": [record["seconds"] for record in report["history"]],
    }
    later = figures["epoch_s"][1:] or figures["epoch_s"]
    return figures, (
        f"{figures['epochs']} epoch(s) on {figures['world_size']} rank(s), steps: {steps}, an epoch "
        f"{min(later):.2f}-{max(later):.2f} s after the first, test pearson_delta "
        f"{_number(figures['test_pearson_delta'])}"
    )


def _steps_in_log(log: Path) -> str:
    """How a run's training steps ran, from its log: 'replayed', 'eager, capture failed' or 'eager'."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "eager"
    return (
        "replayed"
        if "training steps replay" in text
        else "eager, capture failed"
        if "could not be captured" in text
        else "eager"
    )


def _resume(results: Path) -> tuple[dict, str]:
    found = _json(results, "resume.json")
    if found is None:
        return {}, ""
    killed, resumed = found["killed"], found["resumed"]
    where = resumed["resumed_from"]
    figures = {
        "device": found["device"],
        "killed_s": killed["seconds"],
        "resumed_s": resumed["seconds"],
        "resumed_from": where,
        "failures": found["failures"],
    }
    said = f"resumed from {where['checkpoint']}" if where else "did not resume"
    return figures, f"killed, {said}; jobs {killed['seconds']:.0f} s + {resumed['seconds']:.0f} s"


def _precision(amp: str) -> str:
    """An ``amp`` option as a precision: 'off' is fp32."""
    return "fp32" if amp == "off" else amp


def _epoch_run(run: dict) -> str:
    """A run of bench_epoch in words: 'batch 32, fp32, graphs on'."""
    return f"batch {run['batch_size']}, {_precision(run['amp'])}, graphs {run['cuda_graphs']}"


def _epoch_runs(results: Path, stage: str) -> list[dict]:
    return [run for name in STAGE_FILES[stage] for run in (_json(results, name) or {}).get("results", [])]


def _epoch_figures(runs: list[dict]) -> dict:
    return {
        _epoch_run(run): {key: run[key] for key in ("steps", "epoch_s", "loop_s", "cells_per_s", "peak_mib")}
        for run in runs
    }


def _epoch(results: Path) -> tuple[dict, str]:
    runs = _epoch_runs(results, "epoch")
    if not runs:
        return {}, ""
    return _epoch_figures(runs), "; ".join(
        f"{_precision(run['amp'])} {run['epoch_s']:.2f} s an epoch (loop {run['loop_s']:.2f} s, steps {run['steps']})"
        for run in runs
    )


def _precision_stage(results: Path) -> tuple[dict, str]:
    runs = _epoch_runs(results, "precision")
    if not runs:
        return {}, ""
    return _epoch_figures(runs), "; ".join(
        f"batch {run['batch_size']} {_precision(run['amp'])} {run['epoch_s']:.2f} s" for run in runs
    )


def _profile(results: Path) -> tuple[dict, str]:
    settings = (_json(results, "profile.json") or {}).get("settings", [])
    if not settings:
        return {}, ""
    measured = [s for s in settings if "failed" not in s]
    figures = {
        f"compile {'on' if s['compile'] else 'off'}, {_precision(s['amp'])}": {
            key: s[key] for key in ("replayed", "step_ms", "floor_ms", "kernels")
        }
        for s in measured
    }
    figures.update({f"compile on, {_precision(s['amp'])}": {"failed": s["failed"]} for s in settings if "failed" in s})
    parts = [
        f"compile {'on' if s['compile'] else 'off'} {s['step_ms']:.2f} ms "
        f"({s['step_ms'] / s['floor_ms']:.1f}x its products; top: {s['kernels'][0]['name'][:40]} "
        f"{s['kernels'][0]['share']:.0%})"
        for s in measured
        if s["kernels"]
    ]
    parts += [
        f"compile on {_precision(s['amp'])}: {'refused' if s['failed'].startswith('refused') else 'failed'}"
        for s in settings
        if "failed" in s
    ]
    return figures, "a step " + "; ".join(parts)


def _width(results: Path) -> tuple[dict, str]:
    found = _json(results, "width.json")
    if found is None:
        return {}, ""
    figures = {
        "device": found["device"],
        "genes": found["genes"],
        "step_s": found["step_s"],
        "vcc_epoch_s": found["vcc_epoch_s"],
    }
    steps = ", ".join(f"{_precision(amp)} {seconds * 1e3:.1f} ms" for amp, seconds in found["step_s"].items())
    vcc = ", ".join(f"{_precision(amp)} {seconds:.0f} s" for amp, seconds in found["vcc_epoch_s"].items())
    return figures, f"{found['genes']:,} genes, a step {steps}; a challenge-size epoch {vcc}"


def _pair_screen(results: Path) -> tuple[dict, str]:
    screen = (_json(results, "screen.json") or {}).get("screen")
    if screen is None:
        return {}, ""
    said = f"{screen['pairs']:,} pairs in {screen['seconds']:.1f} s, {screen['pairs_per_s']:.0f} pairs/s"
    larger = screen.get("larger")
    if larger is None:
        return screen, said
    if "skipped" in larger:
        return screen, f"{said}; {larger['pairs']:,} not screened (about {larger['projected_seconds']:.0f} s)"
    rate = larger["pairs_per_s"]
    return screen, f"{said}; {larger['pairs']:,} pairs in {larger['seconds']:.1f} s, {rate:.0f} pairs/s"


def _published(results: Path) -> tuple[dict, str]:
    found = _json(results, "published.json")
    if found is None:
        return {}, ""
    ours, theirs = found["gears_ddp"], found["published"]
    figures = {
        "published_installed": found["published_installed"],
        "epoch_s": ours["epoch"],
        "published_epoch_s": theirs and theirs["epoch"],
        "cells": ours["cells"],
        "genes": ours["genes"],
    }
    if not found["published_installed"]:
        return (
            figures,
            f"published GEARS not installed or not runnable here: gears_ddp alone, epoch {ours['epoch']:.2f} s",
        )
    if theirs is None:
        return (
            figures,
            f"the published GEARS did not finish (failed or cut short); gears_ddp epoch {ours['epoch']:.2f} s",
        )
    figures["speedup"] = theirs["epoch"] / ours["epoch"]
    return figures, (
        f"epoch with evaluation {theirs['epoch']:.1f} s published, {ours['epoch']:.2f} s ours: "
        f"{figures['speedup']:.1f}x"
    )


def _number(value) -> str:
    return "-" if value is None else f"{value:.4f}"


HEADLINES = {
    "environment": _environment,
    "wheels": _wheels,
    "data": _data,
    "tests": _tests,
    "demo": _demo,
    "resume": _resume,
    "epoch": _epoch,
    "profile": _profile,
    "precision": _precision_stage,
    "width": _width,
    "screen": _pair_screen,
    "published": _published,
}


# ----------------------------------------------------------------------------- the summary


def stage_records(results: Path) -> list[dict]:
    """The stages that ran, from ``stages.tsv``, with their key figures and headlines."""
    records = []
    for line in (results / "stages.tsv").read_text().splitlines():
        name, rc, seconds, cpu_seconds, limit = line.split("\t")
        figures, headline = HEADLINES.get(name, lambda _: ({}, ""))(results)
        records.append(
            {
                "stage": name,
                "rc": int(rc),
                "seconds": float(seconds),
                "cpu_seconds": float(cpu_seconds),
                "limit_s": float(limit),
                "timed_out": int(rc) == TIMED_OUT,
                "files": STAGE_FILES.get(name, []),
                "figures": figures,
                "headline": headline,
            }
        )
    return records


def summary(results: Path) -> None:
    """``results/summary.json`` and the table (see the module docstring)."""
    stages = stage_records(results)
    env = _json(results, "env.json") or {}
    figures = {
        "date": datetime.date.today().isoformat(),
        "machine": env.get("machine"),
        "gpu": env.get("gpu"),
        "stages": stages,
        "failed": [stage["stage"] for stage in stages if stage["rc"]],
        "seconds": sum(stage["seconds"] for stage in stages if stage["stage"] != "data"),
    }
    (results / "summary.json").write_text(json.dumps(figures, indent=1))
    print(f"\nGPU check on {env.get('machine', 'an unknown machine')}\n")
    print_table(
        ["stage", "key figures", "rc", "seconds", "CPU s", "limit s"],
        [
            [
                stage["stage"],
                stage["headline"] or "-",
                "out of time" if stage["timed_out"] else stage["rc"],
                f"{stage['seconds']:.0f}",
                f"{stage['cpu_seconds']:.0f}",
                f"{stage['limit_s']:.0f}",
            ]
            for stage in stages
        ],
        left=2,
    )
    print(
        f"\n{len(stages)} stages in {figures['seconds']:.0f} s (the data stage runs beside the others); "
        + (f"failed: {', '.join(figures['failed'])}" if figures["failed"] else "all passed")
    )


# ----------------------------------------------------------------------------- the record


BENCHMARK_STAGES = ("published", "epoch", "resume", "profile", "precision", "width", "screen")  # logs with tables


def printed_tables(log: Path) -> str:
    """The markdown tables in a stage's log (its benchmark's stdout, among other lines). A
    table is its header, its separator row and the rows up to the next table's header, so a
    warning that the benchmark's stderr wrote between its rows does not cut it in two."""
    rows = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.startswith("|")]
    blocks: list[list[str]] = []
    for i, row in enumerate(rows):
        if not blocks or (i + 1 < len(rows) and _separator(rows[i + 1]) and not _separator(row)):
            blocks.append([])
        blocks[-1].append(row)
    return "\n\n".join("\n".join(block) for block in blocks)


def _separator(row: str) -> bool:
    """Whether a table row is a header's separator (``|---|--:|``)."""
    return set(row) <= set("|-: ") and "-" in row


def check_command(summary_json: dict) -> str:
    """The command that made a summary: ``--stages`` with the stages chosen, when they were
    not all (environment, wheels and data run with any)."""
    implicit = ("environment", "wheels", "data")
    ran = [stage["stage"] for stage in summary_json.get("stages", []) if stage["stage"] not in implicit]
    every = [stage for stage in STAGE_FILES if stage not in implicit]
    if not ran or sorted(ran) == sorted(every):
        return "bash benchmarks/gpu_check.sh"
    return f"bash benchmarks/gpu_check.sh --stages {','.join(ran)}"


def record(results: Path) -> None:
    """Append the run in ``results`` to RESULTS.md (see the module docstring)."""
    env = json.loads((results / "env.json").read_text())
    if env["gpu"] is None:
        raise SystemExit(f"{results} is a run on a CPU (--small, say): only a GPU's figures are recorded")
    summary_json = json.loads((results / "summary.json").read_text())
    machine = f"{env['machine']}; CUDA {env['cuda']}, cuDNN {env['cudnn']}, NCCL {env['nccl']}" + (
        f"; nvidia-smi: {' / '.join(env['nvidia_smi'].splitlines()[1:])}" if env["nvidia_smi"] else ""
    )
    parts = [
        f"\n## {summary_json['date']}: `{check_command(summary_json)}`\n",
        f"Machine: {machine}.\n",
        (results / "summary.txt").read_text().strip() + "\n",
    ]
    for stage in BENCHMARK_STAGES:
        log = results / f"{stage}.log"
        tables = printed_tables(log) if log.exists() else ""
        if tables:
            parts.append(f"The {stage} stage's tables ({stage}.log):\n\n{tables}\n")
    with open(RESULTS, "a", encoding="utf-8") as handle:
        handle.write("\n".join(parts))
    print(f"recorded in {RESULTS}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    env = commands.add_parser("environment", help="the machine and its versions, to a JSON file")
    env.add_argument("out", type=Path)
    env.add_argument("--nvidia-smi", type=Path, help="nvidia-smi's query output, kept in the JSON")
    found = commands.add_parser("packages", help="the Python packages that import, to a JSON file")
    found.add_argument("out", type=Path)
    found.add_argument("--wheels", type=Path, help="the folder of the wheels installed")
    done = commands.add_parser("summary", help="summary.json and the table of key figures")
    done.add_argument("results", type=Path)
    kept = commands.add_parser("record", help="append an extracted archive's figures to benchmarks/RESULTS.md")
    kept.add_argument("results", type=Path)
    args = parser.parse_args()
    if args.command == "environment":
        environment(args.out, args.nvidia_smi)
    elif args.command == "packages":
        return packages(args.out, args.wheels)
    elif args.command == "summary":
        summary(args.results)
    else:
        record(args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
