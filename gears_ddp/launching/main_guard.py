"""Refusing to spawn workers from a script whose call is not under ``if __name__ ==
"__main__":``: each spawned worker imports the main script first, so without the guard every
worker would run the script, and the call, again.
"""

from __future__ import annotations

import ast
import multiprocessing
import sys
import time
from pathlib import Path
from types import FrameType

_IMPORTED_AT = time.time()  # a main script whose file is newer was edited while it ran


def check_main_guard(caller: str) -> None:
    """Refuse to start workers from a script whose call is not under ``if __name__ ==
    "__main__":``. Each spawned worker imports the main script first, so without the guard
    every worker would run the script, and the call, again."""
    where: str | None
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        where = "the script, which a starting worker process is importing"
    else:
        where = _unguarded_call_site()
        if where is None:
            return
    raise RuntimeError(
        f'{caller} is called at the top level of {where}, outside `if __name__ == "__main__":`. '
        "The worker processes it starts import the script first, so they would call it again: "
        "put the call (or the main() that makes it) under that guard"
    )


def _unguarded_call_site() -> str | None:
    """``'file, line N'`` where the main script's top level leads to this call outside an
    ``if __name__ == "__main__":`` block; None when guarded or when the source is unknown
    (an interactive session, ``python -c``, a script edited since it started)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and not (
        frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__"
    ):
        frame = frame.f_back
    if frame is None:
        return None
    path, line = frame.f_code.co_filename, frame.f_lineno
    try:
        if Path(path).stat().st_mtime > _IMPORTED_AT:  # edited since it started: its lines may have moved
            return None
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and node.lineno <= line <= (node.end_lineno or node.lineno)
            and ast.unparse(node.test).replace("'", '"') in ('__name__ == "__main__"', '"__main__" == __name__')
        ):
            return None
    return f"{path}, line {line}"
