"""The options of an in-silico pair screen, declared once: what ``GEARS.screen``,
``distributed.pair_screen_workers.pair_screen_on_devices``, ``runs.pair_screens.pair_screen_replicates``
and ``gears-ddp screen`` take besides the model(s) and the genes.

Each edge (a Python call, the command line) builds one ``PairScreenOptions`` with
``from_dict`` (unknown names refused, every value checked here, once); everything inside
takes that object as it is and checks nothing again. Errors name an option as the caller
wrote it: ``--seed`` on the command line, ``seeds`` in Python.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from gears_ddp._options import Options, is_int, option, option_name
from gears_ddp.inference.prediction import CHANGE_MODES, DRAWN_CELLS_CHANGE, EXACT_CHANGE, checked_draw_seed
from gears_ddp.runtime.devices import check_device_request

PAIR_SCREEN_CHUNK_PAIRS = 256  # pairs per chunk: the work an interruption can lose, per process
DEFAULT_DRAW_SEED = 0  # the drawn control cells' seed when none is chosen
PAIR_SCREEN_COMMAND = "gears-ddp screen"  # the ``where`` of options given on the command line
# the command line's spelling of each option (gears-ddp screen --help)
FLAGS = {
    "GI_genes_file": "--gi-genes-file",
    "change": "--change",
    "seeds": "--seed",
    "out": "--out",
    "overwrite": "--overwrite",
    "cpu_processes": "--cpu-processes",
    "gpu_ids": "--gpu-ids",
}


@dataclass(frozen=True)
class PairScreenOptions(Options):
    """How a pair screen computes its scores, where it writes them and on which devices."""

    GI_genes_file: str | os.PathLike | None = option(
        None, "take the scores on the genes listed in this file only (GI_predict's GI_genes_file)"
    )
    change: str = option(EXACT_CHANGE, "the change vectors scored (inference.prediction.CHANGE_MODES)")
    seeds: tuple[int, ...] = option(
        (DEFAULT_DRAW_SEED,),
        f"seeds of the drawn control cells (change {DRAWN_CELLS_CHANGE!r} only); over replicates, each "
        "model screens once per seed",
    )
    chunk_pairs: int = option(PAIR_SCREEN_CHUNK_PAIRS, "pairs per chunk: the work an interruption can lose")
    out: str | os.PathLike | None = option(None, "the table (.csv), written with its record, resumable")
    overwrite: bool = option(False, "replace another screen at out")
    cpu_processes: int | None = option(None, "CPU worker processes (default without GPUs: one per usable core)")
    gpu_ids: list[int] | None = option(None, "GPUs for the workers (default: every visible GPU)")

    @classmethod
    def from_dict(cls, values: dict | None, where: str) -> "PairScreenOptions":
        """Checked options; ``seeds`` None (or left out) is the default seed."""
        values = dict(values or {})
        if values.get("seeds", ()) is None:
            del values["seeds"]
        return super().from_dict(values, where)

    def check(self, where: str) -> None:
        """Raise a ValueError naming the first bad option; the one check of the rule that
        seeds draw control cells for the drawn-cells change only."""
        command = where == PAIR_SCREEN_COMMAND

        def name(key: str) -> str:
            return FLAGS[key] if command else option_name(where, key)

        if self.change not in CHANGE_MODES:
            raise ValueError(f"change must be one of {list(CHANGE_MODES)}, got {self.change!r}")
        if not isinstance(self.seeds, (list, tuple)) or not self.seeds:
            raise ValueError("seeds must name at least one seed of the drawn control cells")
        for seed in self.seeds:
            checked_draw_seed(seed)
        if self.change == EXACT_CHANGE and list(self.seeds) != [DEFAULT_DRAW_SEED]:
            if command:
                raise ValueError(
                    f"--seed draws control cells for --change {DRAWN_CELLS_CHANGE} only; the exact change (the "
                    "default) draws none"
                )
            several = (
                f"several seeds ({list(self.seeds)}) draw" if len(self.seeds) > 1 else f"seed {self.seeds[0]} draws"
            )
            raise ValueError(f"{several} control cells for the drawn-cells change only; the exact change draws none")
        if not is_int(self.chunk_pairs) or self.chunk_pairs < 1:
            raise ValueError(f"chunk_pairs must be a positive integer, got {self.chunk_pairs!r}")
        for key in ("GI_genes_file", "out"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ValueError(f"{name(key)} must be a path, got {value!r}")
        if not isinstance(self.overwrite, bool):
            raise ValueError(f"{name('overwrite')} must be True or False, got {self.overwrite!r}")
        check_device_request(None, self.gpu_ids, self.cpu_processes)

    def normalized(self) -> "PairScreenOptions":
        """The seeds as a tuple of ints, the GPU numbers as a list."""
        return replace(
            self,
            seeds=tuple(int(seed) for seed in self.seeds),
            gpu_ids=None if self.gpu_ids is None else [int(gpu) for gpu in self.gpu_ids],
        )

    @property
    def seed(self) -> int:
        """The seed of a screen that draws once (the first of ``seeds``)."""
        return self.seeds[0]

    def with_one_draw(self, where: str) -> "PairScreenOptions":
        """These options, refused when they draw control cells more than once: a screen of one
        model takes one seed (several measure the draws' noise over replicates)."""
        if len(self.seeds) > 1:
            if where == PAIR_SCREEN_COMMAND:
                raise ValueError(
                    f"several --seed values ({list(self.seeds)}) measure the drawn cells' noise within the models "
                    "of a screen over replicates; a screen of one run takes one"
                )
            raise ValueError(
                f"several seeds ({list(self.seeds)}) measure the drawn cells' noise within the models of a screen "
                f"over replicates; {where} screens one model: give one"
            )
        return self
