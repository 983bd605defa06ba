"""Keep freed host memory in the process while training on CPU (glibc's allocator).

A CPU training step allocates and frees tensors of several MiB each (rows of sets x genes).
With glibc's default settings the heap's free top is given back to the operating system
whenever it exceeds twice the last large free, so the next step touches fresh pages again
(thousands of page faults per step, a large share of its time; benchmarks/RESULTS.md). ``retained_host_memory()``
raises the threshold above which freed memory is returned
(``M_TRIM_THRESHOLD``, 256 MiB) and serves allocations up to 32 MiB (glibc's maximum)
from the heap (``M_MMAP_THRESHOLD``), for an epoch's optimiser steps, and then gives the
retained memory back (``malloc_trim``). Peak memory is unchanged; it is reached once
instead of re-faulted every step.

It does nothing where the C library has no ``mallopt`` (macOS, musl), and leaves glibc's
own settings alone when the user chose them (``MALLOC_TRIM_THRESHOLD_`` or
``MALLOC_MMAP_THRESHOLD_`` in the environment). At the end of the block both thresholds
go back to glibc's initial 128 KiB (glibc cannot report the previous values) and the
retained memory is returned. Evaluations (of the epoch's train and val cells, and of the
test set) run without: their large batch blocks alternate with small pieces, which a
retaining heap would keep growing with the number of cells.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h> parameter numbers
TRIM_THRESHOLD_BYTES = 256 * 2**20
MMAP_THRESHOLD_BYTES = 32 * 2**20  # glibc refuses more (half its 64 MiB heap size)
GLIBC_INITIAL_THRESHOLD_BYTES = 128 * 2**10  # glibc's starting value of both
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def _c_library():
    """The process's C library if it is glibc (has ``mallopt`` and ``malloc_trim``), else None."""
    try:
        library = ctypes.CDLL(None)
    except OSError:
        return None
    if not (hasattr(library, "mallopt") and hasattr(library, "malloc_trim")):
        return None
    return library


@contextlib.contextmanager
def retained_host_memory():
    """Within the block, freed host memory stays in the process for reuse (see the module
    docstring); at its end the retained memory is given back."""
    library = _c_library()
    if library is None or any(name in os.environ for name in USER_SETTINGS):
        yield
        return
    library.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    library.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    try:
        yield
    finally:
        library.mallopt(M_MMAP_THRESHOLD, GLIBC_INITIAL_THRESHOLD_BYTES)
        library.mallopt(M_TRIM_THRESHOLD, GLIBC_INITIAL_THRESHOLD_BYTES)
        library.malloc_trim(0)
