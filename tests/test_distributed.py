"""Distributed training for real: 2 gloo processes on CPU, spawned as train_multi_gpu does."""

import functools
import os
import shutil

import pytest
import torch
from model_fixtures import make_model, random_batch

from gears_ddp import PertData
from gears_ddp.configuration.sections import SplitConfig, TrainingArgs
from gears_ddp.gears import GEARS
from gears_ddp.launching.environments import find_free_port
from gears_ddp.launching.launchers import local_placements, shared_data
from gears_ddp.launching.process_group import cleanup_ddp, setup_ddp
from gears_ddp.launching.rank_training import spawned_rank
from gears_ddp.launching.supervisor import DistributedTrainingError, spawn_workers
from gears_ddp.launching.worker_messages import RunReport
from gears_ddp.model.weighted_norm import WeightedBatchNorm1d
from gears_ddp.train_distributed import train_multi_gpu
from gears_ddp.training.checkpoint import checkpoint_files, load_training_checkpoint

pytestmark = pytest.mark.distributed

SPLIT = {"split": "simulation", "seed": 1}


def _args(save_path, **overrides):
    return {
        "cpu_processes": 2,
        "epochs": 2,
        "batch_size": 8,
        "test_batch_size": 32,
        "model_config": {"hidden_size": 8},
        "save_path": str(save_path),
        "report_pictures": False,  # drawn where a test looks at them (the first test here, and only_rank_zero_writes)
        **overrides,
    }


def test_two_ranks_end_identical_and_the_saved_model_reproduces_their_metrics(data_folder, tmp_path, caplog):
    caplog.set_level("INFO", logger="gears_ddp")
    report = train_multi_gpu(data_folder, "toy", SPLIT, _args(tmp_path / "run", report_pictures=True))
    assert report["world_size"] == 2 and len(report["history"]) == 2
    # rank 0's progress reaches the parent's logging, once (rank 1 reports nothing)
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("epoch 1/2: train loss") for m in messages) == 1
    assert sum(m.startswith("epoch 2/2: train loss") for m in messages) == 1
    assert sum(m.startswith("test set, best model vs baselines") for m in messages) == 1
    assert list(report["timing"]) == [
        "rank start-up",
        "set-up",
        "epochs",
        "test",
        "baselines",
        "interactions",
        "report",
    ]  # rank 0's, the last line of its log too
    assert messages[-1].startswith("where the time went: rank start-up ")
    # a rank's start-up counts from the parent's spawn: its interpreter, imports and data too
    started = next(r.created for r in caplog.records if r.getMessage().startswith("starting 2 cpu process(es)"))
    ready = next(r.created for r in caplog.records if r.getMessage().startswith("2 rank(s); rank 0 on"))
    assert report["timing"]["rank start-up"] >= ready - started > 0
    assert len(set(report["parameter_digests"])) == 1  # identical parameters and buffers on both ranks
    pert_data = PertData(data_folder)
    pert_data.load(data_path=data_folder / "toy")
    pert_data.prepare_split(**SPLIT)
    pert_data.get_dataloader(8, test_batch_size=32)
    gears = GEARS(pert_data)
    gears.load_pretrained(report["model_path"])
    single = gears.test()["model"]
    for key, value in report["model"].items():
        assert single[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def _worker_with_stand_in_graphs(local_rank, *args, graph):
    """A rank whose recipe captures and replays its steps as on a GPU, with ``graph``, a stand-in
    graph (``stand_in_graphs``: it runs the captured step again, or fails to capture); it then
    reports the collectives it ran and whether each ran inside a graph."""
    import stand_in_graphs as stand_in

    import gears_ddp.training.recipe as recipe

    recipe.use_cuda_graphs = lambda *_, **__: True
    recipe.CapturedStep = functools.partial(recipe.CapturedStep, graph_factory=getattr(stand_in, graph))
    stand_in.watch_collectives()
    spawned_rank(local_rank, *args)
    args[-1].put(("collectives", local_rank, list(stand_in.COLLECTIVES), stand_in.REPLAYS[0]))


def test_train_multi_gpu_replays_its_steps_without_a_collective_inside_and_trains_as_eager_steps(
    data_folder, tmp_path, caplog
):
    """The recipe of every rank of train_multi_gpu, on 2 gloo ranks, with its steps captured in
    stand-in graphs and replayed: the same weights, bit for bit, and the same metrics as the same
    run whose capture failed (eager steps on the same padded batches), and no collective inside a
    graph. (A learning rate that is a float32 value, as a replayed step reads it.)"""
    caplog.set_level("INFO", logger="gears_ddp")
    runs = {}
    for graph in ("ReplayingGraph", "FailingGraph"):
        options = TrainingArgs.from_dict(_args(tmp_path / graph, lr=2.0**-10))
        pert_data = shared_data(data_folder, "toy", SplitConfig.from_dict(SPLIT), options)
        placements = local_placements([torch.device("cpu")] * 2, find_free_port())
        messages = spawn_workers(
            functools.partial(_worker_with_stand_in_graphs, graph=graph), (placements, pert_data, options), 2
        )
        report = next(m.report for m in messages if isinstance(m, RunReport))
        runs[graph] = report, [m for m in messages if isinstance(m, tuple) and m[0] == "collectives"]
    replayed, replayed_collectives = runs["ReplayingGraph"]
    eager, eager_collectives = runs["FailingGraph"]
    log = caplog.text
    assert "training steps replay two CUDA graphs around one all-reduce of the gradients" in log
    assert "training steps could not be captured in a CUDA graph" in log
    for _, rank, collectives, replays in replayed_collectives:
        assert replays > 5 and collectives and not any(inside for _, inside in collectives), rank
    assert all(replays == 0 for *_, replays in eager_collectives)
    assert len(set(replayed["parameter_digests"])) == 1
    assert replayed["parameter_digests"] == eager["parameter_digests"]
    assert [h["val_mse_de"] for h in replayed["history"]] == [h["val_mse_de"] for h in eager["history"]]
    assert replayed["model"] == eager["model"]


def _worker_sharing_one_gpu(local_rank, *args, graph):
    """A rank of two that share one GPU, their collectives through gloo (NCCL takes one GPU a
    rank), whose steps replay real CUDA graphs (``graph="CudaGraph"``: counted) or whose
    capture fails (``"FailingGraph"``: eager steps on the same padded batches); it then
    reports its graphs' replays."""
    import stand_in_graphs as stand_in

    import gears_ddp.launching.process_group as process_group
    import gears_ddp.training.recipe as recipe
    from gears_ddp.training.cuda_graphs import CudaGraph

    replays = [0]

    class CountedGraph(CudaGraph):
        def replay(self) -> None:
            replays[0] += 1
            super().replay()

    process_group.backend_for = lambda device: "gloo"
    factory = CountedGraph if graph == "CudaGraph" else getattr(stand_in, graph)
    recipe.CapturedStep = functools.partial(recipe.CapturedStep, graph_factory=factory)
    spawned_rank(local_rank, *args)
    args[-1].put(("replays", local_rank, replays[0]))


@pytest.mark.slow
def test_two_ranks_on_one_cuda_device_replay_two_graphs_around_the_all_reduce_and_train_as_eager_steps(
    data_folder, tmp_path, caplog, device
):
    """The step that several ranks on GPUs run, on a GPU: two ranks share GPU 0 (the
    gradients' all-reduce through gloo), each step two CUDA graphs around one eager all-reduce
    of the flat gradient buffer. Against the same run whose capture failed (eager steps on the
    same padded batches): each run's ranks end bit-identical, every step after the warm-up
    replayed both graphs, and the training losses agree within a GPU's summation order
    (``test_cuda_graphs.SAME_TRAINING``: a replayed and an eager step sum in other orders).
    The CPU case of this is the stand-in test above."""
    if device.type != "cuda":
        pytest.skip("CUDA graphs replay on a GPU only (the stand-in test above is the CPU's case)")
    from test_cuda_graphs import SAME_TRAINING

    caplog.set_level("INFO", logger="gears_ddp")
    runs = {}
    for graph in ("CudaGraph", "FailingGraph"):
        caplog.clear()
        options = TrainingArgs.from_dict(_args(tmp_path / graph, lr=2.0**-10, cpu_processes=None))
        pert_data = shared_data(data_folder, "toy", SplitConfig.from_dict(SPLIT), options)
        placements = local_placements([torch.device("cuda", 0)] * 2, find_free_port())
        messages = spawn_workers(
            functools.partial(_worker_sharing_one_gpu, graph=graph), (placements, pert_data, options), 2
        )
        report = next(m.report for m in messages if isinstance(m, RunReport))
        replays = [m[2] for m in messages if isinstance(m, tuple) and m[0] == "replays"]
        runs[graph] = report, replays, caplog.text
    replayed, replayed_counts, replayed_log = runs["CudaGraph"]
    eager, eager_counts, eager_log = runs["FailingGraph"]
    assert "training steps replay two CUDA graphs around one all-reduce of the gradients" in replayed_log
    assert "could not be captured" not in replayed_log
    assert "training steps could not be captured in a CUDA graph" in eager_log
    assert len(replayed_counts) == 2 and all(count > 10 and count % 2 == 0 for count in replayed_counts)
    assert eager_counts == [0, 0]
    for report in (replayed, eager):
        assert report["world_size"] == 2 and len(set(report["parameter_digests"])) == 1
    loss_rtol, _ = SAME_TRAINING["off"]
    replayed_losses, eager_losses = ([h["train_loss"] for h in run["history"]] for run in (replayed, eager))
    torch.testing.assert_close(replayed_losses, eager_losses, rtol=loss_rtol, atol=0)


def _worker_refusing_writes_off_rank_zero(local_rank, *args):
    """Rank 1 fails on any attempt to write a file through the library's writers or torch.save
    (to a path: collectives serialise objects with torch.save into memory buffers)."""
    if local_rank != 0:
        import gears_ddp.data.io as library_io

        save = torch.save

        def refuse(*_, **__):
            raise AssertionError("rank 1 tried to write a file")

        def save_unless_file(obj, target, *rest, **options):
            if isinstance(target, (str, os.PathLike)):
                refuse()
            return save(obj, target, *rest, **options)

        library_io.atomic_path = refuse
        torch.save = save_unless_file
    spawned_rank(local_rank, *args)


def _spawn_on_toy(data_folder, worker, save_path, **overrides):
    options = TrainingArgs.from_dict(_args(save_path, **overrides))
    pert_data = shared_data(data_folder, "toy", SplitConfig.from_dict(SPLIT), options)
    placements = local_placements([torch.device("cpu")] * 2, find_free_port())
    messages = spawn_workers(worker, (placements, pert_data, options), 2)
    return next(m.report for m in messages if isinstance(m, RunReport))


def test_only_rank_zero_writes(data_folder, tmp_path):
    report = _spawn_on_toy(
        data_folder, _worker_refusing_writes_off_rank_zero, tmp_path / "run", checkpoint_every=1, report_pictures=True
    )
    written = sorted(p.name for p in (tmp_path / "run").iterdir())
    assert written == [
        "checkpoints",
        "config.pkl",
        "metrics.csv",
        "model.pt",
        "plots",
        "report.html",
        "report.json",
        "train.log",
        "vocabulary.json",
    ]  # the model folder and the run report (no config.yaml:
    # this test starts its workers itself, and train_multi_gpu, which writes it, is not called)
    steps = [int(p.stem.split("-")[1]) for p in checkpoint_files(tmp_path / "run")]  # after epochs 1 and 2
    assert len(steps) == 2 and steps[1] == 2 * steps[0] > 0
    assert report["model_path"] == str(tmp_path / "run")


@pytest.mark.slow
def test_resume_ends_with_the_parameters_of_an_uninterrupted_run(data_folder, tmp_path):
    train_multi_gpu(data_folder, "toy", SPLIT, _args(tmp_path / "whole", epochs=3, checkpoint_every=1))
    after_two_epochs = checkpoint_files(tmp_path / "whole")[1]
    assert load_training_checkpoint(after_two_epochs)["position"]["epoch"] == 2
    resumed = train_multi_gpu(
        data_folder,
        "toy",
        SPLIT,
        _args(tmp_path / "resumed", epochs=3, checkpoint_every=1, resume_from=str(after_two_epochs)),
    )
    whole, again = (load_training_checkpoint(checkpoint_files(tmp_path / name)[-1]) for name in ("whole", "resumed"))
    assert whole["position"]["epoch"] == again["position"]["epoch"] == 3
    for name, tensor in whole["model"].items():
        assert torch.equal(tensor, again["model"][name]), name
    assert [h["val_mse_de"] for h in whole["outcome"]["history"]] == [h["val_mse_de"] for h in resumed["history"]]


def test_bf16_autocast_and_sync_batchnorm_train_on_cpu(data_folder, tmp_path):
    report = train_multi_gpu(
        data_folder, "toy", SPLIT, _args(tmp_path / "bf16", epochs=1, amp="bf16", sync_batchnorm=True)
    )
    assert torch.isfinite(torch.tensor(report["model"]["test_mse_de"]))
    assert len(set(report["parameter_digests"])) == 1


def _worker_with_another_split(local_rank, placements, pert_data, *args):
    if local_rank == 1:
        pert_data.prepare_split("simulation", seed=2)
    spawned_rank(local_rank, placements, pert_data, *args)


def test_ranks_with_another_split_stop_with_a_message_naming_them_and_the_split(data_folder, tmp_path):
    """(Ranks whose expression differs: tests/test_nodes.py, with a copy of the data per node.)"""
    with pytest.raises(
        DistributedTrainingError,
        match=r"(?s)rank \d of 2 failed first.*ranks do not hold the same data: "
        r"split \(.*\): ranks \[0\] hold \w{8}, ranks \[1\] hold \w{8} "
        r"\(rank 0 read .*toy, rank 1 read .*toy\)",
    ):
        _spawn_on_toy(data_folder, _worker_with_another_split, tmp_path / "run")


def _worker_failing_on_rank_one(local_rank, *args):
    """Rank 1 fails in the middle of training (its first evaluation), after joining."""
    if local_rank == 1:
        import gears_ddp.training.recipe as recipe

        def fail(*_, **__):
            raise ValueError("injected failure in rank 1")

        recipe.evaluate = fail
    spawned_rank(local_rank, *args)


def test_a_failing_rank_stops_all_and_the_parent_shows_its_traceback(data_folder, tmp_path):
    with pytest.raises(
        DistributedTrainingError, match=r"(?s)rank 1 of 2 failed first.*Traceback.*injected failure in rank 1"
    ):
        _spawn_on_toy(data_folder, _worker_failing_on_rank_one, tmp_path / "run", timeout_s=20)


def test_bad_options_fail_before_any_process_starts(data_folder, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"unknown args key\(s\) \['epoch', 'lr_sclaing'\]"):
        train_multi_gpu(data_folder, "toy", SPLIT, {"epoch": 3, "lr_sclaing": "linear"})
    with pytest.raises(ValueError, match=r"unknown args\['model_config'\] key\(s\) \['hidden'\]"):
        train_multi_gpu(data_folder, "toy", SPLIT, {"model_config": {"hidden": 8}})
    with pytest.raises(ValueError, match=r"unknown split_config key\(s\) \['sed'\]"):
        train_multi_gpu(data_folder, "toy", {"split": "simulation", "sed": 1}, {})
    with pytest.raises(ValueError, match="cpu_processes"):
        train_multi_gpu(data_folder, "toy", SPLIT, {"save_path": str(tmp_path)}, gpu_ids=[0, 1])
    with pytest.raises(ValueError, match=r"args\['amp'\] must be one of \('off', 'fp16', 'bf16'\)"):
        train_multi_gpu(data_folder, "toy", SPLIT, _args(tmp_path, amp="fp8"))
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(
        FileExistsError,
        match=r"save_path .*a_file/run cannot be made: .*a_file is a file, not a "
        r"folder; choose another save_path",
    ):
        train_multi_gpu(data_folder, "toy", SPLIT, _args(blocker / "run"))
    with pytest.raises(FileExistsError, match=r"save_path .*a_file is a file, not a folder"):
        train_multi_gpu(data_folder, "toy", SPLIT, _args(blocker))
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10, 9, 2**20))
    with pytest.raises(OSError, match="has only 1 MiB free"):
        train_multi_gpu(data_folder, "toy", SPLIT, _args(tmp_path / "full"))


def _synchronized_batchnorm(local_rank, port, messages):
    """Rank r normalises its rows with statistics of both ranks' (weighted) rows."""
    setup_ddp(local_rank, 2, "cpu", "127.0.0.1", port)
    try:
        x, weights, coefficients = _batchnorm_inputs()
        rows = slice(0, 6) if local_rank == 0 else slice(6, 10)
        norm = WeightedBatchNorm1d(4).double().train()
        norm.synchronize = True
        mine = x[rows].clone().requires_grad_()
        out = norm(mine, weights[rows])
        (out * coefficients[rows]).sum().backward()
        messages.put((local_rank, out.detach().numpy(), mine.grad.numpy(), norm.running_var.numpy()))
    finally:
        cleanup_ddp()


def _batchnorm_inputs():
    generator = torch.Generator().manual_seed(3)
    return (
        torch.randn(10, 4, generator=generator, dtype=torch.float64),
        torch.randint(1, 4, (10,), generator=generator),
        torch.randn(10, 4, generator=generator, dtype=torch.float64),
    )


def test_sync_batchnorm_uses_the_statistics_of_all_ranks():
    results = sorted(spawn_workers(_synchronized_batchnorm, (find_free_port(),), 2), key=lambda r: r[0])
    x, weights, coefficients = _batchnorm_inputs()
    norm = WeightedBatchNorm1d(4).double().train()
    whole = x.clone().requires_grad_()
    out = norm(whole, weights)
    (out * coefficients).sum().backward()
    for (_rank, rank_out, rank_grad, running_var), rows in zip(results, (slice(0, 6), slice(6, 10))):
        torch.testing.assert_close(torch.from_numpy(rank_out), out[rows].detach())
        torch.testing.assert_close(torch.from_numpy(rank_grad), whole.grad[rows])
        torch.testing.assert_close(torch.from_numpy(running_var), norm.running_var)


SYNC_ROWS = (slice(0, 10), slice(10, 16))


def _synchronized_model_inputs():
    x, pert_idx = random_batch(batch_size=16, seed=7)
    coefficients = torch.randn(16, x.shape[1], generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    return x.double(), pert_idx, coefficients


def _synchronized_model_step(local_rank, port, messages):
    """Rank r runs the whole network in training mode on its rows, with synchronised
    BatchNorm statistics, and reports outputs, parameter gradients and running statistics."""
    setup_ddp(local_rank, 2, "cpu", "127.0.0.1", port)
    try:
        model = make_model().double().train()
        for module in model.modules():
            if isinstance(module, WeightedBatchNorm1d):
                module.synchronize = True
        x, pert_idx, coefficients = _synchronized_model_inputs()
        rows = SYNC_ROWS[local_rank]
        out = model(x[rows], pert_idx[rows])
        (out * coefficients[rows]).sum().backward()
        # numpy arrays: torch tensors would travel as shared memory that the ending process releases
        messages.put(
            (
                local_rank,
                out.detach().numpy(),
                {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None},
                {n: b.numpy() for n, b in model.named_buffers()},
            )
        )
    finally:
        cleanup_ddp()


def test_sync_batchnorm_network_equals_one_process_on_all_rows():
    """With synchronised statistics, the ranks' outputs are those of one process on all the
    cells, and their gradients sum to its gradient (DDP then averages them)."""
    results = sorted(spawn_workers(_synchronized_model_step, (find_free_port(),), 2), key=lambda r: r[0])
    model = make_model().double().train()
    x, pert_idx, coefficients = _synchronized_model_inputs()
    out = model(x, pert_idx)
    (out * coefficients).sum().backward()
    for (_, rank_out, _, buffers), rows in zip(results, SYNC_ROWS):
        torch.testing.assert_close(torch.from_numpy(rank_out), out[rows].detach(), rtol=1e-10, atol=1e-10)
        for name, value in model.named_buffers():
            torch.testing.assert_close(torch.from_numpy(buffers[name]), value, rtol=1e-10, atol=1e-10, msg=name)
    scale = max(float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None)
    for name, parameter in model.named_parameters():
        if parameter.grad is not None:
            summed = torch.from_numpy(results[0][2][name] + results[1][2][name])
            torch.testing.assert_close(summed, parameter.grad, rtol=1e-7, atol=1e-9 * scale, msg=name)
