"""The ``gears-ddp`` command (``command``); ``python -m gears_ddp`` runs it too.

May import: every layer.
"""
from gears_ddp.cli.command import main

__all__ = ["main"]
