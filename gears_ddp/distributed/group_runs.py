"""Several runs over the devices of one machine: the devices cut into groups, each group
training one run at a time and taking the next when it is done, every running group
watched at once. ``train_replicates`` (``replicates``) and sweeps (``sweeps.train_sweep``) place
their runs this way.

Each run is trained as ``train_multi_gpu`` trains one, started through
``launching.choose.launch``: the launchers' opening (its folder taken, its configuration
written) and workers running ``rank_training.spawned_rank`` on a process group of its own,
which hold its folder until they end (``launchers.GroupOfRanks``). The runs of one
``data_key`` share one prepared dataset, prepared once in this process. A run that fails
ends its own workers only; the others go on. A stop signal (SIGTERM, SIGUSR1, Ctrl-C) reaches every
running run, which stops with a checkpoint, and no new one starts.
"""

from __future__ import annotations

import functools
import multiprocessing.connection
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from gears_ddp._logging import get_logger
from gears_ddp.configuration.run_options import RunOptions
from gears_ddp.launching.choose import launch
from gears_ddp.launching.launchers import GroupOfRanks, shared_data
from gears_ddp.launching.supervisor import DistributedTrainingError, SpawnedWorkers, signals_passed_on
from gears_ddp.launching.worker_messages import RunDiverged, RunInterrupted, RunReport
from gears_ddp.runtime.stopping import STOP_SIGNALS, described_signal, passed_on_as
from gears_ddp.training.save_folder import finished_report

logger = get_logger(__name__)
POLL_S = 0.2


@dataclass(frozen=True)
class GroupRun:
    """One run to place on a group of devices: its name (the log's prefix), its checked
    options (``args.save_path`` its folder), what its folder's ``config.yaml`` holds on the
    group it lands on (``config_on(group)``), what holds its folder (as a refused run reads
    it), and the key of the prepared data it trains on (runs of equal keys share it)."""

    name: str
    run: RunOptions
    config_on: Callable[[list[torch.device]], dict]
    holder: str
    data_key: object

    @property
    def folder(self) -> Path:
        """The run's folder (a run of a group always has one: its scheduler gave it)."""
        assert self.run.args.save_path is not None, "a run of a group is given its folder"
        return Path(self.run.args.save_path)


@dataclass
class RunningGroup:
    """A run training on a group: its workers and when it started."""

    run: GroupRun
    workers: SpawnedWorkers
    started: float


class GroupScheduler:
    """Trains runs on free device ``groups`` as ``next_run()`` gives them (None: no more),
    watching every running group at once; ``watch(running)`` is called for each running run
    at every look (a sweep's pruning reads its epochs there); ``keys_ahead()`` says which
    data keys runs still to come need (the others' data is dropped)."""

    def __init__(self, groups: list[list[torch.device]], keys_ahead: Callable[[], set] = set):
        self.groups, self.keys_ahead = groups, keys_ahead
        self.data: dict[object, object] = {}  # the prepared data of each key in use

    @property
    def ranks(self) -> int:
        return sum(map(len, self.groups))

    def run(
        self,
        next_run: Callable[[], GroupRun | None],
        watch: Callable[[RunningGroup], None] | None = None,
        settled: Callable[[GroupRun, dict, bool], None] | None = None,
    ) -> tuple[dict[str, dict], int]:
        """Each run's outcome by name (``{'status': 'finished' | 'failed' | 'interrupted',
        'error': ..., 'seconds': ...}``) and the stop signal received (0 when none);
        ``settled(run, outcome, stopping)`` is called as each run ends (``stopping``: a stop
        signal was received), before the next is drawn."""
        running, outcomes, exhausted = {}, {}, False
        live: list[multiprocessing.process.BaseProcess] = []  # every running worker, which a stop signal reaches
        with signals_passed_on(STOP_SIGNALS, live) as received:
            try:
                while True:
                    for index in range(len(self.groups)):
                        if index in running or exhausted or received:
                            continue
                        group_run = next_run()
                        if group_run is None:
                            exhausted = True
                            continue
                        try:
                            running[index] = RunningGroup(group_run, self._start(group_run, index), time.monotonic())
                        except Exception:  # this run cannot start (its split, its folder): the others go on
                            outcomes[group_run.name] = {"status": "failed", "error": traceback.format_exc()}
                            logger.error("%s: failed to start:\n%s", group_run.name, outcomes[group_run.name]["error"])
                            if settled is not None:
                                settled(group_run, outcomes[group_run.name], bool(received))
                            continue
                        live.extend(running[index].workers.processes)
                        for number in received[:1]:  # a stop that came while they started reaches them too
                            running[index].workers.send(passed_on_as(number))
                    if not running:
                        if exhausted or received:
                            break
                        continue
                    sentinels = [sentinel for entry in running.values() for sentinel in entry.workers.sentinels()]
                    multiprocessing.connection.wait(sentinels, timeout=POLL_S)
                    for index, entry in list(running.items()):
                        if watch is not None and not entry.workers.finished():
                            watch(entry)
                        if entry.workers.finished():
                            outcomes[entry.run.name] = self._settle(entry, received)
                            if settled is not None:
                                settled(entry.run, outcomes[entry.run.name], bool(received))
                            del running[index]
                            for process in entry.workers.processes:
                                live.remove(process)
                            self._release_data(running)
            finally:
                for entry in running.values():
                    entry.workers.close()
        return outcomes, received[0] if received else 0

    def _start(self, group_run: GroupRun, index: int) -> SpawnedWorkers:
        """Start the run's workers on group ``index``, after the launchers' opening."""
        group = self.groups[index]
        logger.info(
            "%s: training on group %d (%s), run folder %s",
            group_run.name,
            index + 1,
            ", ".join(map(str, group)),
            group_run.folder,
        )
        launcher = GroupOfRanks(
            group,
            index * len(group),
            self.ranks,
            group_run.config_on(group),
            functools.partial(self._shared_data, group_run.data_key),
            f"{group_run.name}: ",
            group_run.holder,
        )
        return launch(group_run.run, launcher=launcher)

    def _shared_data(self, key, run: RunOptions):
        """The prepared data of ``key``, prepared once for every run using it."""
        if key not in self.data:
            self.data[key] = shared_data(run.pert_data_path, run.dataset_name, run.split, run.args)
        return self.data[key]

    def _settle(self, entry: RunningGroup, received: list[int]) -> dict:
        """A run's outcome once its workers ended; its workers are closed. Workers that the
        stop signals ``received`` (passed on to them) ended before they could stop at a step
        (while starting, as their arguments were read) were interrupted, not failed: a sweep
        retries such a trial, replicates continue such a run."""
        name, seconds = entry.run.name, time.monotonic() - entry.started
        try:
            messages = entry.workers.result()
        except DistributedTrainingError as error:
            if (
                any(isinstance(message, RunReport) for message in entry.workers.received)
                and finished_report(entry.run.folder) is not None
            ):  # it failed while exiting, its work done
                logger.warning(
                    "%s: finished in %.0f s (its report is complete), but a worker failed as it ended: %s",
                    name,
                    seconds,
                    error,
                )
                return {"status": "finished", "seconds": seconds}
            stop = entry.workers.ended_by(received)
            if stop is not None:
                said = f"stopped by {described_signal(stop)} before its workers could stop at a step"
                logger.warning("%s: %s", name, said)
                return {"status": "interrupted", "error": said, "seconds": seconds}
            logger.error("%s: failed after %.0f s: %s", name, seconds, error)
            return {"status": "failed", "error": str(error), "seconds": seconds}
        finally:
            entry.workers.close()
        stopped = [message for message in messages if isinstance(message, RunInterrupted)]
        if stopped:
            logger.warning("%s: %s", name, stopped[0].message)
            return {"status": "interrupted", "error": stopped[0].message, "seconds": seconds}
        diverged = [message for message in messages if isinstance(message, RunDiverged)]
        if diverged:
            logger.error("%s: %s", name, diverged[0].message)
            return {"status": "failed", "error": diverged[0].message, "seconds": seconds}
        if not any(isinstance(message, RunReport) for message in messages):
            return {"status": "failed", "error": "its workers ended without a report", "seconds": seconds}
        logger.info("%s: finished in %.0f s", name, seconds)
        return {"status": "finished", "seconds": seconds}

    def _release_data(self, running: dict) -> None:
        """Drop the data no running run and no run to come needs."""
        needed = set(self.keys_ahead()) | {entry.run.data_key for entry in running.values()}
        for key in set(self.data) - needed:
            del self.data[key]
