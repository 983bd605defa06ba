"""Spawn two workers that only sleep (no messages, no process group) through the
supervisor, print their process ids, and wait: a test kills this process and watches them.

    python tests/scripts/spawn_sleepers.py
"""

import time

from gears_ddp.launching.supervisor import SpawnedWorkers


def sleeper(local_rank, messages):
    time.sleep(120)


if __name__ == "__main__":
    workers = SpawnedWorkers(sleeper, (), 2)
    print(" ".join(str(process.pid) for process in workers.processes), flush=True)
    time.sleep(120)
