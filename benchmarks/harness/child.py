"""Run one function of a benchmark script in a child process of its own and get its figures
back. A process of its own has its own peak memory, its own imports (the published GEARS
seeds torch and prints on import) and its own OpenMP settings (read once, at start).

The child imports the script by its path (so its ``main`` does not run), calls the function
with the JSON-encoded arguments, and writes the JSON of what it returns to a file that the
parent reads back. The child's own output is not shown; when it fails, the end of its
stderr is. With ``BENCH_CHILD_LOGS`` set to a folder, each child's output goes to a file
there as it runs (``LABEL.log``, numbered when a label repeats), with the libraries' INFO
logs and their times, so that a run stopped from outside (the GPU check's time limits)
still shows how far each child got.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
# the child's whole program: benchmarks/ importable, then call_function with its arguments
CHILD_CODE = (
    "import sys; sys.path.insert(0, sys.argv[1]); from harness.child import call_function; call_function(*sys.argv[2:])"
)


def run_in_child(
    script: str | Path, function: str, *arguments, environment: dict | None = None, label: str | None = None
) -> dict | list | None:
    """What ``function(*arguments)`` of ``script`` returns, called in a new Python process
    (``environment`` added to this one's). None when the child fails: then ``label`` (default
    the function's name), its exit status and the end of its stderr go to stderr."""
    with tempfile.TemporaryDirectory() as folder:
        figures = Path(folder) / "figures.json"
        command = [
            sys.executable,
            "-c",
            CHILD_CODE,
            str(BENCHMARKS),
            str(Path(script).resolve()),
            function,
            json.dumps(arguments),
            str(figures),
        ]
        log = _log_file(label or function) or Path(folder) / "child.log"
        with open(log, "w") as output:  # stdout and stderr in the order the child wrote them
            done = subprocess.run(
                command, stdout=output, stderr=subprocess.STDOUT, env={**os.environ, **(environment or {})}
            )
        if done.returncode != 0 or not figures.exists():
            print(f"{label or function} failed (exit {done.returncode}):\n{log.read_text()[-3000:]}", file=sys.stderr)
            return None
        return json.loads(figures.read_text())


def _log_file(label: str) -> Path | None:
    """A new file for a child's output in the folder ``BENCH_CHILD_LOGS`` names, or None."""
    folder = os.environ.get("BENCH_CHILD_LOGS")
    if not folder:
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    name, number = Path(folder) / f"{label}.log", 2
    while name.exists():
        name, number = Path(folder) / f"{label}-{number}.log", number + 1
    return name


def call_function(script: str, function: str, arguments: str, figures: str) -> None:
    """In the child: import ``script``, call ``function`` and write what it returns to ``figures``."""
    if os.environ.get("BENCH_CHILD_LOGS"):  # its output is kept: what it is doing, and when
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    spec = importlib.util.spec_from_file_location(Path(script).stem, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    result = getattr(module, function)(*json.loads(arguments))
    Path(figures).write_text(json.dumps(result))


def quiet():
    """A context in which a child's prints go nowhere, unless ``BENCH_CHILD_LOGS`` keeps its
    output (then they are its progress, in its log file)."""
    if os.environ.get("BENCH_CHILD_LOGS"):
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
    stack.enter_context(contextlib.redirect_stderr(io.StringIO()))
    return stack
