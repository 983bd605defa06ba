"""Hold a folder as a run holds its save_path, until killed; a test's stand-in for a run in use.

    python tests/scripts/hold_folder.py FOLDER [screen TABLE | writing]

Prints ``held`` once the folder is taken. With ``screen TABLE``, holds a pair screen's table
instead (its lock beside the table); with ``writing``, is halfway through writing a
checkpoint (``io.atomic_path``) when it prints ``held``: a run killed mid-write. The
heartbeat is slowed so that the holder changes nothing in the folder while a test looks at it.
"""

import sys
import time
from pathlib import Path

from gears_ddp.runtime import folder_lock

folder_lock.HEARTBEAT_S = 3600.0

if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "screen":
        from gears_ddp.inference.pair_screen_job import held_output

        holding = held_output(Path(sys.argv[3]))
    else:
        from gears_ddp.training.save_folder import held_save_path

        holding = held_save_path(sys.argv[1], "training (a test's stand-in)", resume_from="auto")
    with holding:
        if sys.argv[2:] == ["writing"]:
            from gears_ddp.data.io import atomic_path

            with atomic_path(Path(sys.argv[1]) / "checkpoints" / "checkpoint-1.pt") as tmp:
                tmp.write_bytes(b"half a checkpoint")
                print("held", flush=True)
                time.sleep(600)
        print("held", flush=True)
        time.sleep(600)
