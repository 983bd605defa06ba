"""Run one function of a benchmark script in a child process of its own and get its figures
back. A process of its own has its own peak memory, its own imports (the published GEARS
seeds torch and prints on import) and its own OpenMP settings (read once, at start).

The child imports the script by its path (so its ``main`` does not run), calls the function
with the JSON-encoded arguments, and writes the JSON of what it returns to a file that the
parent reads back. The child's own output is not shown; when it fails, the end of its
stderr is.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1]
# the child's whole program: benchmarks/ importable, then call_function with its arguments
CHILD_CODE = ("import sys; sys.path.insert(0, sys.argv[1]); from harness.child import call_function; "
              "call_function(*sys.argv[2:])")


def run_in_child(script: str | Path, function: str, *arguments, environment: dict | None = None,
                 label: str | None = None) -> dict | list | None:
    """What ``function(*arguments)`` of ``script`` returns, called in a new Python process
    (``environment`` added to this one's). None when the child fails: then ``label`` (default
    the function's name), its exit status and the end of its stderr go to stderr."""
    with tempfile.TemporaryDirectory() as folder:
        figures = Path(folder) / "figures.json"
        command = [sys.executable, "-c", CHILD_CODE, str(BENCHMARKS), str(Path(script).resolve()), function,
                   json.dumps(arguments), str(figures)]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **(environment or {})})
        if done.returncode != 0 or not figures.exists():
            print(f"{label or function} failed (exit {done.returncode}):\n{done.stderr[-3000:]}", file=sys.stderr)
            return None
        return json.loads(figures.read_text())


def call_function(script: str, function: str, arguments: str, figures: str) -> None:
    """In the child: import ``script``, call ``function`` and write what it returns to ``figures``."""
    spec = importlib.util.spec_from_file_location(Path(script).stem, script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    result = getattr(module, function)(*json.loads(arguments))
    Path(figures).write_text(json.dumps(result))
