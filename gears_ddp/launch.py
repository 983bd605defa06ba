"""``python -m gears_ddp.launch``: one rank of a run started by torchrun or srun
(``gears_ddp.distributed.launch``)."""
from gears_ddp.distributed.launch import main

if __name__ == "__main__":
    main()
