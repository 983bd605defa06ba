"""``python -m gears_ddp``: the ``gears-ddp`` command."""
import sys

from gears_ddp.cli import main

sys.exit(main())
