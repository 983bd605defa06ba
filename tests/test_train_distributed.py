"""The seed guide's module, ``gears_ddp.train_distributed``: its imports, its example call
(the guide's ``split_config`` and ``args``, on 2 CPU processes instead of 4 GPUs), and its
worker started by ``torch.multiprocessing.spawn`` as the guide starts it."""

import json
import logging

import pytest
import torch.multiprocessing as mp

from gears_ddp.launching.environments import find_free_port
from gears_ddp.model.model_folder import read_weights

pytestmark = pytest.mark.distributed


def test_train_distributed_imports_its_four_names():
    import gears_ddp
    from gears_ddp.train_distributed import cleanup_ddp, setup_ddp, train_ddp_worker, train_multi_gpu

    assert gears_ddp.train_multi_gpu is train_multi_gpu
    assert all(callable(f) for f in (setup_ddp, cleanup_ddp, train_ddp_worker))


def example_call_arguments(save_path) -> tuple[dict, dict]:
    """The guide's example ``split_config`` and ``args`` (its 'Basic Usage'), with the
    epochs and sizes made small and CPU processes in place of its 4 GPUs."""
    split_config = {"split": "simulation", "seed": 1, "train_gene_set_size": 0.75}
    args = {
        "model_config": {"hidden_size": 8, "num_go_gnn_layers": 1, "num_gene_gnn_layers": 1},
        "batch_size": 8,
        "epochs": 1,
        "lr": 1e-3,
        "save_path": str(save_path),
        "cpu_processes": 2,
    }
    return split_config, args


def _example_worker(rank, world_size, port, data_folder, split_config, args, out):
    """What a script written from the guide runs in each spawned process."""
    from gears_ddp.train_distributed import train_ddp_worker

    report = train_ddp_worker(rank, world_size, data_folder, "toy", split_config, args, master_port=port)
    console = any(getattr(handler, "_gears_ddp_console", False) for handler in logging.getLogger("gears_ddp").handlers)
    with open(f"{out}/rank{rank}.json", "w", encoding="utf-8") as file:
        json.dump(
            {
                "report": None
                if report is None
                else {"world_size": report["world_size"], "digests": report["parameter_digests"]},
                "console_logging": console,
            },
            file,
        )


def test_the_example_call_trains_and_saves_as_its_worker_spawned_by_a_script_does(data_folder, tmp_path):
    """The guide's example call of ``train_multi_gpu``; then ``mp.spawn(train_ddp_worker,
    args=(world_size, ...), nprocs=world_size)``: each rank loads its data, joins, trains;
    rank 0 saves the same weights as ``train_multi_gpu``."""
    from gears_ddp.train_distributed import train_multi_gpu

    split_config, args = example_call_arguments(tmp_path / "models" / "gears_ddp")
    report = train_multi_gpu(pert_data_path=str(data_folder), dataset_name="toy", split_config=split_config, args=args)
    assert report["world_size"] == 2 and len(set(report["parameter_digests"])) == 1
    assert (tmp_path / "models" / "gears_ddp" / "model.pt").is_file()

    _, spawned_args = example_call_arguments(tmp_path / "spawned")
    mp.spawn(
        _example_worker,
        args=(2, find_free_port(), str(data_folder), split_config, spawned_args, str(tmp_path)),
        nprocs=2,
        join=True,
    )
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert results[1]["report"] is None and results[0]["report"]["world_size"] == 2
    # a spawned process has no logging configured: rank 0 shows the log, as the guide's prints
    assert [result["console_logging"] for result in results] == [True, False]
    assert len(set(results[0]["report"]["digests"])) == 1
    spawned, multi = read_weights(tmp_path / "spawned"), read_weights(tmp_path / "models" / "gears_ddp")
    assert spawned.keys() == multi.keys()
    assert all((spawned[name] == multi[name]).all() for name in spawned)


def _example_setup(rank, world_size, port, out):
    """The guide's own calls in a spawned process: ``setup_ddp(rank, world_size)``, a
    collective, ``cleanup_ddp()``."""
    import os

    import torch
    import torch.distributed as dist

    from gears_ddp.train_distributed import cleanup_ddp, setup_ddp

    os.environ["MASTER_PORT"] = str(port)  # a free port: the guide's 12355 may be taken on a test machine
    setup_ddp(rank, world_size)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    with open(f"{out}/rank{rank}.txt", "w", encoding="utf-8") as file:
        file.write(f"{dist.get_backend()} {dist.get_world_size()} {float(total)}")
    cleanup_ddp()
    assert not dist.is_initialized()


def test_setup_and_cleanup_join_and_leave_the_process_group(tmp_path):
    mp.spawn(_example_setup, args=(2, find_free_port(), str(tmp_path)), nprocs=2, join=True)
    assert [(tmp_path / f"rank{rank}.txt").read_text() for rank in (0, 1)] == ["gloo 2 3.0"] * 2


def test_the_default_rendezvous_port_is_taken_when_none_is_given(monkeypatch):
    from gears_ddp.launching.environments import DEFAULT_RENDEZVOUS_PORT, LocalEnvironment

    def port(given=None):
        return LocalEnvironment.rendezvous_port(given, default=DEFAULT_RENDEZVOUS_PORT)

    monkeypatch.delenv("MASTER_PORT", raising=False)
    assert port() == DEFAULT_RENDEZVOUS_PORT == 12355
    monkeypatch.setenv("MASTER_PORT", "23456")
    assert port() == 23456 and port(34567) == 34567


def _refuse(what: str):
    def refused(*args, **kwargs):
        raise AssertionError(f"a run on one device called {what}")

    return refused


def test_one_device_trains_in_this_process_with_no_worker_and_no_process_group(
    data_folder, tmp_path, monkeypatch, caplog
):
    """``train_multi_gpu`` on one device starts no process (a spawned rank re-imports torch
    and the package and is handed the data: seconds before its first step) and joins no
    process group; it trains here with the threads a spawned rank gets, which it gives back."""
    import logging

    import torch
    import torch.distributed as dist

    from gears_ddp.launching import launchers, rank_training, supervisor
    from gears_ddp.runtime.threads import cpu_threads
    from gears_ddp.train_distributed import train_multi_gpu

    for module, name in ((launchers, "spawn_workers"), (supervisor, "spawn_workers"), (rank_training, "setup_ddp")):
        monkeypatch.setattr(module, name, _refuse(f"{module.__name__}.{name}"))
    trained_with = []
    train_rank = launchers.train_rank

    def counting_threads(*args, **kwargs):
        trained_with.append(torch.get_num_threads())
        return train_rank(*args, **kwargs)

    monkeypatch.setattr(launchers, "train_rank", counting_threads)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with caplog.at_level(logging.INFO, logger="gears_ddp"):
            split_config, args = example_call_arguments(tmp_path / "run")
            report = train_multi_gpu(data_folder, "toy", split_config, {**args, "cpu_processes": 1})
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)

    assert report["world_size"] == 1 and len(report["parameter_digests"]) == 1
    assert (tmp_path / "run" / "model.pt").is_file() and (tmp_path / "run" / "report.json").is_file()
    assert trained_with == [cpu_threads(1)] and after == 1  # a spawned rank's threads, then the caller's again
    assert not dist.is_initialized()
    assert f"1 rank, in this process, on cpu with {cpu_threads(1)} thread(s)" in caplog.text


def test_a_stop_signal_to_a_one_device_run_stops_it_with_a_checkpoint(data_folder, tmp_path, monkeypatch):
    """SIGTERM to the process training a one-device run: the rank stops after the next
    optimiser step with a checkpoint, as a spawned rank did, and ``train_multi_gpu`` raises
    ``TrainingInterrupted`` naming it; the handler is removed."""
    import os
    import signal
    from pathlib import Path

    import gears_ddp.training.recipe as recipe
    from gears_ddp.runtime.stopping import TrainingInterrupted
    from gears_ddp.train_distributed import train_multi_gpu

    steps = recipe.optimizer_steps

    def steps_then_signal(*args, **kwargs):
        for number, loss in enumerate(steps(*args, **kwargs), start=1):
            yield loss
            if number == 3:
                os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(recipe, "optimizer_steps", steps_then_signal)
    split_config, args = example_call_arguments(tmp_path / "run")
    with pytest.raises(TrainingInterrupted, match="after optimiser step 4") as stop:
        train_multi_gpu(data_folder, "toy", split_config, {**args, "cpu_processes": 1, "epochs": 2})
    assert stop.value.signal_name == "SIGTERM" and Path(stop.value.checkpoint).is_file()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
