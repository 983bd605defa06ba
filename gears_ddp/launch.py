"""``python -m gears_ddp.launch``: the same as ``python -m gears_ddp train`` (``gears-ddp
train``), kept for torchrun and srun command lines written with it::

    torchrun --standalone --nproc_per_node=4 -m gears_ddp.launch --config run.yaml
"""

import sys

from gears_ddp.cli import command

if __name__ == "__main__":
    sys.exit(command(["train", *sys.argv[1:]]))
