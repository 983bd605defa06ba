"""The end of a process the library runs from start to end: the ``gears-ddp`` command
(``python -m gears_ddp``, and ``python -m gears_ddp.launch`` as a rank of a torchrun or srun
job; ``cli.dispatch.command``) and every rank the library spawns, for the command or for a
script's ``train_multi_gpu`` (``launching.supervisor``).

When such a process ends, CPython's finalisation collects the whole heap several times over
before the operating system frees it anyway; after a run that has imported torch, pandas,
anndata and matplotlib that takes about a second of a core (0.7 s without training, 1.2 s
with, on 2 cores), at the end of every command and of every spawned rank of every run.
Freezing the heap (``gc.freeze``: every live object into the permanent generation) as the
process ends leaves those collections nothing to walk; the atexit handlers, flushes and
destructors of what is freed by reference count run as before.

May import: nothing of gears_ddp (the standard library only).
"""

import gc


def heap_frozen_for_exit() -> None:
    """Freeze the heap of a process about to end (only then: frozen objects are never
    collected, so a process that goes on would keep its garbage cycles)."""
    gc.freeze()
