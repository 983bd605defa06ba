"""The ``gears-ddp`` command: ``dispatch`` builds its parser and runs a command; each
command has its own module (``train``, ``demo``, ``evaluate``, ``predict``, ``pair_screen``
for ``screen``, ``interactions``, ``process``, ``check``), holding its options and what it
does. ``python -m gears_ddp`` runs it too.

May import: every layer.
"""

from gears_ddp.cli.dispatch import command, main

__all__ = ["command", "main"]
