"""The repository as a user receives it: no merge-conflict markers in any file, and a clean
``gears-ddp --help`` (the parser's description is the command module's docstring)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED_FOLDERS = {".git", ".venv", ".versions", "build", "dist", "__pycache__", ".pytest_cache"}
MARKER = re.compile(r"^(<{7}|>{7})( |$)|^={7}$", re.MULTILINE)


def repository_files() -> list[Path]:
    """Every file of the working tree but version-control, environment (`.ci/versions`'s too) and build
    folders."""
    return [
        path
        for path in ROOT.rglob("*")
        if path.is_file()
        and not SKIPPED_FOLDERS.intersection(path.relative_to(ROOT).parts[:-1])
        and not any(part.endswith(".egg-info") for part in path.relative_to(ROOT).parts)
    ]


def conflict_markers(paths) -> list[str]:
    """``path:line`` of each merge-conflict marker line in the text files among ``paths``."""
    found = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # not text
        for match in MARKER.finditer(text):
            found.append(f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}")
    return found


def test_no_file_holds_a_merge_conflict_marker():
    assert conflict_markers(repository_files()) == []


def test_the_check_finds_a_conflict(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    conflicted = tmp_path / "module.py"
    conflicted.write_text('"""Doc.\n<<<<<<< HEAD\nours\n=======\ntheirs\n>>>>>>> branch\n"""\n', encoding="utf-8")
    (tmp_path / "clean.md").write_text("# Title\n\n=== not a marker ===\n", encoding="utf-8")
    assert conflict_markers(repository_files()) == ["module.py:2", "module.py:4", "module.py:6"]


def test_the_command_help_is_clean():
    done = subprocess.run([sys.executable, "-m", "gears_ddp", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: gears-ddp" in done.stdout
    assert conflict_markers_in_text(done.stdout) == []
    for command in ("demo", "train", "evaluate", "predict", "screen", "process", "check"):
        assert command in done.stdout


def conflict_markers_in_text(text: str) -> list[str]:
    return [match.group(0) for match in MARKER.finditer(text)]


def unresolved_imports(folders) -> list[str]:
    """``path:line: name`` of each ``from gears_ddp... import name`` or ``from harness...
    import name`` in the Python files of ``folders`` (imports inside functions too, which
    only run when a script's option needs them) that does not resolve."""
    import ast
    import importlib

    missing = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not (
                    isinstance(node, ast.ImportFrom)
                    and node.level == 0
                    and node.module
                    and node.module.split(".")[0] in ("gears_ddp", "harness")
                ):
                    continue
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                try:
                    module = importlib.import_module(node.module)
                except ImportError as err:
                    missing.append(f"{where}: {node.module} ({err})")
                    continue
                for alias in node.names:
                    if not hasattr(module, alias.name):
                        try:
                            importlib.import_module(f"{node.module}.{alias.name}")
                        except ImportError:
                            missing.append(f"{where}: {node.module}.{alias.name}")
    return missing


def test_every_import_of_the_benchmarks_and_examples_resolves(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    assert unresolved_imports(["benchmarks", "examples"]) == []
