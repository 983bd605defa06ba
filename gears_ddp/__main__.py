"""``python -m gears_ddp``: the ``gears-ddp`` command."""

import sys

from gears_ddp.cli import command

if __name__ == "__main__":  # spawned workers import this module first: they must not run the command again
    sys.exit(command())
