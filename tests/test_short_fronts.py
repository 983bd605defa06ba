"""``PertData`` and ``GEARS`` are fronts: each method hands its work to the module that owns
it (for ``PertData`` the processed folder, the vocabulary, the cell table, the split cache,
the graph caches; for ``GEARS`` the trainer, the model's queries, the interactions, the pair
screen, the model folder), so each class stays short enough to read whole. Checked in the
code."""

from __future__ import annotations

import ast

from test_layers import PACKAGE

MAX_PERTDATA_LINES = 350  # issue 47: the class was 511 lines before its work moved to the data modules
MAX_GEARS_LINES = 250  # issue 47: 489 lines before training, queries and interactions moved to their owners


def class_lines(source: str, name: str) -> int:
    """The lines of the class ``name`` in ``source``, from ``class`` to its last line."""
    found = [node for node in ast.parse(source).body if isinstance(node, ast.ClassDef) and node.name == name]
    assert found, f"no class {name}"
    return found[0].end_lineno - found[0].lineno + 1


def test_pertdata_stays_a_short_front():
    lines = class_lines((PACKAGE / "data" / "pertdata.py").read_text(encoding="utf-8"), "PertData")
    assert lines < MAX_PERTDATA_LINES, f"PertData is {lines} lines: move the work to the data module that owns it"


def test_gears_stays_a_short_front():
    lines = class_lines((PACKAGE / "gears.py").read_text(encoding="utf-8"), "GEARS")
    assert lines < MAX_GEARS_LINES, f"GEARS is {lines} lines: move the work to the part that owns it"


def test_the_count_takes_the_whole_class_and_only_it():
    source = (
        "import os\n\n\nclass Front:\n    def a(self):\n        return 1\n\n    b = 2\n\n\ndef helper():\n    pass\n"
    )
    assert class_lines(source, "Front") == 5
