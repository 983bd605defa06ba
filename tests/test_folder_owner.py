"""A run folder has one owner: a second run on a folder in use stops at once, naming the
holder, on every entry path, and changes nothing there; a holder killed with SIGKILL frees
it at once (its ranks end with it); a finished run is kept unless the new run continues or
replaces it; reading a folder in use is never blocked. Real processes, real signals."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from test_launch import _clean_environment
from test_restarts import _ranks_at_step, _start

from gears_ddp import GEARS, PertData, train_multi_gpu
from gears_ddp.cli import main
from gears_ddp.cli.demo import replacing_earlier_demo
from gears_ddp.configuration.run_options import RunOptions, run_options_with_overrides
from gears_ddp.distributed.replicates import ReplicatesFailed, train_replicates
from gears_ddp.launching.choose import launch
from gears_ddp.launching.environments import TorchrunEnvironment, find_free_port
from gears_ddp.runtime import folder_lock
from gears_ddp.runtime.folder_lock import RECORD_FILE, FolderInUse, FolderLock
from gears_ddp.train_distributed import train_ddp_worker
from gears_ddp.training.checkpoint import checkpoint_files, load_training_checkpoint
from gears_ddp.training.save_folder import held_save_path

SPLIT = {"split": "simulation", "seed": 1}
HOLD = str(Path(__file__).parent / "scripts" / "hold_folder.py")
REFUSED_WITHIN_S = 5.0


def _run_file(tmp_path: Path, data_folder: Path, args: dict) -> Path:
    """A run file (``gears-ddp train --config``) of the toy data with ``args``."""
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump({"pert_data_path": str(data_folder), "dataset_name": "toy", "split_config": SPLIT, "args": args})
    )
    return config


def _args(save_path, **more):
    return {
        "epochs": 1,
        "batch_size": 16,
        "test_batch_size": 32,
        "model_config": {"hidden_size": 8},
        "save_path": str(save_path),
        "report_pictures": False,  # drawn where a test looks at them (tests/test_report_pictures.py)
        **more,
    }


def _snapshot(folder: Path) -> dict:
    """Every file and folder under ``folder`` with its size and modification time."""
    return {
        str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
        for path in [folder, *folder.rglob("*")]
    }


def _hold(*arguments):
    """A process holding a folder (``scripts/hold_folder.py``) once it printed ``held``."""
    holder = subprocess.Popen(
        [sys.executable, HOLD, *map(str, arguments)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_clean_environment(),
    )
    assert holder.stdout.readline().strip() == "held", holder.communicate()[1][-3000:]
    return holder


@pytest.fixture(scope="module")
def held(tmp_path_factory):
    """A run folder held by another process: ``(folder, holder process)``; the holder is
    killed at the end. One for the module's refusals (each checks that the folder is left as
    it was): a holder is a process of its own, a second or more of CPU to start."""
    folder = tmp_path_factory.mktemp("held") / "run"
    holder = _hold(folder)
    yield folder, holder
    holder.kill()
    holder.wait()


def _assert_names_the_holder(message: str, folder: Path, holder) -> None:
    assert str(folder) in message and f"process {holder.pid} on host {socket.gethostname()}" in message
    assert "since 20" in message and "another save_path" in message


def _refused(call, folder: Path, holder, error=FolderInUse) -> str:
    """Run ``call`` on the held ``folder``: it must fail within REFUSED_WITHIN_S with
    ``error``, naming the holder, and leave the folder as it was; returns the message."""
    before = _snapshot(folder)
    started = time.monotonic()
    with pytest.raises(error) as raised:
        call()
    assert time.monotonic() - started < REFUSED_WITHIN_S
    assert _snapshot(folder) == before
    _assert_names_the_holder(str(raised.value), folder, holder)
    return str(raised.value)


# ---------------------------------------------------------------- every entry path, refused at once


def _toy_gears(data_folder, hidden_size: int = 8) -> GEARS:
    pert_data = PertData(data_folder)
    pert_data.load(data_path=data_folder / "toy")
    pert_data.prepare_split(**SPLIT)
    pert_data.get_dataloader(16, test_batch_size=32)
    torch.manual_seed(0)
    gears = GEARS(pert_data)
    gears.model_initialize(hidden_size=hidden_size)
    return gears


def test_published_api_train_is_refused_on_a_folder_in_use(held, data_folder):
    folder, holder = held
    gears = _toy_gears(data_folder)
    _refused(lambda: gears.train(epochs=1, save_path=str(folder)), folder, holder)


@pytest.mark.distributed
def test_train_multi_gpu_is_refused_before_any_process_starts(held, data_folder):
    folder, holder = held
    _refused(lambda: train_multi_gpu(data_folder, "toy", SPLIT, _args(folder, cpu_processes=2)), folder, holder)


def test_gears_ddp_train_is_refused_with_one_line(held, data_folder, tmp_path, capsys):
    folder, holder = held
    config = _run_file(tmp_path, data_folder, _args(folder, cpu_processes=1))
    before, started = _snapshot(folder), time.monotonic()
    assert main(["train", "--config", str(config)]) == 2
    assert time.monotonic() - started < REFUSED_WITHIN_S and _snapshot(folder) == before
    error = capsys.readouterr().err.strip()
    assert error.startswith("gears-ddp train: ") and "\n" not in error
    _assert_names_the_holder(error, folder, holder)


def test_rank_0_of_a_torchrun_or_srun_job_is_refused(held, data_folder):
    folder, holder = held
    environment = TorchrunEnvironment(0, 1, 0, 1, "127.0.0.1", find_free_port())
    _refused(lambda: launch(RunOptions.checked(data_folder, "toy", SPLIT, _args(folder)), environment), folder, holder)


def test_a_train_ddp_worker_is_refused(held, data_folder):
    folder, holder = held
    _refused(
        lambda: train_ddp_worker(
            0, 1, data_folder, "toy", SPLIT, _args(folder, cpu_processes=1), master_port=find_free_port()
        ),
        folder,
        holder,
    )


def test_replicates_are_refused_on_a_folder_in_use(held, data_folder):
    folder, holder = held
    _refused(
        lambda: train_replicates(data_folder, "toy", SPLIT, _args(folder, cpu_processes=1), {"seeds": [1]}),
        folder,
        holder,
    )


def test_a_replicate_whose_folder_is_in_use_fails_to_start_naming_the_holder(tmp_path, data_folder):
    top = tmp_path / "replicates"
    holder = _hold(top / "seed-1")
    try:
        message = _refused(
            lambda: train_replicates(data_folder, "toy", SPLIT, _args(top, cpu_processes=1), {"seeds": [1]}),
            top / "seed-1",
            holder,
            ReplicatesFailed,
        )
        assert "seed-1 failed" in message and "FolderInUse" in message
    finally:
        holder.kill()
        holder.wait()


def test_a_pair_screen_is_refused_on_a_table_another_screen_writes(trained_toy, tmp_path):
    table = tmp_path / "screens" / "pairs.csv"
    holder = _hold(table.parent, "screen", table)
    try:
        before = _snapshot(table.parent)
        with pytest.raises(FolderInUse) as raised:
            trained_toy.screen(["G0", "G1", "G2"], out=table)
        assert _snapshot(table.parent) == before
        assert f"process {holder.pid}" in str(raised.value) and "pairs.csv" in str(raised.value)
        assert "another --out" in str(raised.value)
    finally:
        holder.kill()
        holder.wait()
    table2 = trained_toy.screen(["G0", "G1", "G2"], out=table)  # free again once the holder is gone
    assert len(table2) == 3 and table.is_file()


def test_reading_a_folder_in_use_is_not_blocked(trained_toy, tmp_path):
    folder = tmp_path / "model"
    trained_toy.save_model(folder)
    holder = _hold(folder)
    try:
        reader = GEARS(trained_toy.pert_data)
        reader.load_pretrained(folder)
        for name, tensor in trained_toy.best_model.state_dict().items():
            assert torch.equal(reader.best_model.state_dict()[name].cpu(), tensor.cpu()), name
    finally:
        holder.kill()
        holder.wait()


# ---------------------------------------------------------------- two real runs; a killed holder


@pytest.mark.distributed
@pytest.mark.slow
def test_two_gears_ddp_train_runs_on_one_folder_the_second_is_refused_then_a_finished_run_is_kept(
    data_folder, tmp_path
):
    folder = tmp_path / "run"
    config = _run_file(tmp_path, data_folder, _args(folder, cpu_processes=1, epochs=40, seed=11))
    command = [sys.executable, "-m", "gears_ddp", "train", "--config", str(config)]
    first = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_clean_environment()
    )
    deadline = time.monotonic() + 120
    while not (folder / RECORD_FILE).exists():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()[1][-3000:]
        time.sleep(0.05)
    started = time.monotonic()
    second = subprocess.run(
        [*command, "--set", "args.seed=22"], capture_output=True, text=True, env=_clean_environment(), timeout=120
    )
    assert second.returncode == 2 and "is in use by process" in second.stderr, second.stderr[-3000:]
    assert time.monotonic() - started < REFUSED_WITHIN_S + 10  # a fresh interpreter's imports included
    assert f"process {first.pid} on host {socket.gethostname()}" in second.stderr
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    assert yaml.safe_load((folder / "config.yaml").read_text())["args"]["seed"] == 11  # the first run's, whole

    # the finished run is kept: the same command again is refused, naming the ways on (without
    # checkpoints it cannot be continued)
    again = subprocess.run(
        [*command, "--set", "args.seed=22"], capture_output=True, text=True, env=_clean_environment(), timeout=120
    )
    assert again.returncode == 2 and "holds a finished run" in again.stderr, again.stderr[-3000:]
    assert "without checkpoints, which cannot be continued" in again.stderr and "--overwrite" in again.stderr
    replaced = subprocess.run(
        [*command, "--set", "args.seed=22", "--set", "args.epochs=1", "--overwrite"],
        capture_output=True,
        text=True,
        env=_clean_environment(),
        timeout=300,
    )
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    written = yaml.safe_load((folder / "config.yaml").read_text())["args"]
    assert written["seed"] == 22 and written["overwrite_save_path"] is False  # its config.yaml never overwrites
    assert len(json.loads((folder / "report.json").read_text())["history"]) == 1


def _kill_and_watch(parent, workers: list[int], within_s: float) -> None:
    """SIGKILL ``parent``; every worker it spawned must be gone within ``within_s``."""
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + within_s
    while any(
        Path(f"/proc/{pid}").exists() and b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in workers
    ):
        assert time.monotonic() < deadline, "workers outlived the parent that spawned them"
        time.sleep(0.05)


@pytest.mark.distributed
@pytest.mark.slow
def test_a_holder_killed_with_sigkill_frees_the_folder_at_once_and_its_ranks_end_with_it(data_folder, tmp_path):
    folder = tmp_path / "run"
    killed, ranks = _ranks_at_step(data_folder, folder, 1, epochs=500, batch_size=16, checkpoint_every=1)
    assert len(ranks) == 2
    _kill_and_watch(killed, ranks, within_s=10)
    newest = load_training_checkpoint(checkpoint_files(folder)[-1])
    epochs = newest["position"]["epoch"] + 2  # one epoch past the newest checkpoint's
    resumed = _start(
        "multi",
        data_folder,
        epochs=epochs,
        batch_size=16,
        save_path=str(folder),
        resume_from="auto",
        checkpoint_every=1,
    )
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert "resuming from" in err and "in use" not in err
    assert len(json.loads(out.strip().splitlines()[-1])["history"]) == epochs


def test_the_partly_written_files_of_a_run_killed_mid_write_are_removed_by_the_next_holder(tmp_path, caplog):
    folder = tmp_path / "run"
    killed = subprocess.Popen([sys.executable, HOLD, str(folder), "writing"], stdout=subprocess.PIPE, text=True)
    assert killed.stdout.readline().strip() == "held"
    killed.kill()  # SIGKILL: no finally runs
    killed.wait()
    left = list((folder / "checkpoints").glob(".checkpoint-1.pt.*.tmp"))
    assert len(left) == 1 and left[0].read_bytes() == b"half a checkpoint"
    kept = [folder / ".notes.tmp", folder / "mine" / f".{left[0].name[1:]}", folder / "checkpoint-1.pt"]
    for path in kept:  # the user's files, and one in a folder the run does not write
        path.parent.mkdir(exist_ok=True)
        path.write_text("mine")
    with caplog.at_level("WARNING", logger="gears_ddp"), held_save_path(folder, "a test", resume_from="auto"):
        assert not left[0].exists() and all(path.read_text() == "mine" for path in kept)
    assert "removed 1 partly written file(s) (0.0 MiB) left by a run that was killed while writing" in caplog.text


@pytest.mark.distributed
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a parent's end reaches its workers on Linux only")
def test_spawned_workers_end_with_their_parent_even_when_they_say_nothing(tmp_path):
    parent = subprocess.Popen(
        [sys.executable, str(Path(HOLD).parent / "spawn_sleepers.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_clean_environment(),
    )
    workers = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(workers) == 2, parent.communicate()[1][-3000:]
    # (they sleep 120 s; one killed before its start-up imports finished, seconds on a loaded
    # machine, ends at its first instruction, when it finds its parent gone)
    _kill_and_watch(parent, workers, within_s=30)


# ---------------------------------------------------------------- a finished run is kept


def test_a_finished_run_is_refused_without_resume_or_overwrite_and_trained_with_either(data_folder, tmp_path):
    folder = tmp_path / "run"
    gears = _toy_gears(data_folder)
    gears.train(epochs=1, save_path=str(folder), checkpoint_every=1)
    before = _snapshot(folder)
    with pytest.raises(FileExistsError) as refused:
        gears.train(epochs=1, save_path=str(folder))
    after = _snapshot(folder)
    assert after.pop(".") and before.pop(".") and after == before  # its files as they were (the lock came and went)
    assert "holds a finished run" in str(refused.value)
    assert "resume_from='auto'" in str(refused.value) and "overwrite_save_path=True" in str(refused.value)

    report = gears.train(epochs=2, save_path=str(folder), resume_from="auto", checkpoint_every=1)
    assert len(report["history"]) == 2  # continued: its first epoch is the finished run's

    (folder / "notes.txt").write_text("mine")
    report = gears.train(epochs=1, save_path=str(folder), overwrite_save_path=True)
    assert len(report["history"]) == 1
    assert checkpoint_files(folder) == []  # the earlier run's checkpoints went with it
    assert (folder / "notes.txt").read_text() == "mine"  # what is not a run's stays


def test_a_finished_run_without_checkpoints_is_not_trained_again_over_by_resume_auto(data_folder, tmp_path):
    """resume_from='auto' on a finished run that wrote no checkpoint finds nothing to continue
    from: it used to train again from the beginning over the finished model. It is refused,
    the folder as it was, and the refusal of a plain run there does not offer it."""
    folder = tmp_path / "run"
    gears = _toy_gears(data_folder)
    gears.train(epochs=1, save_path=str(folder))
    assert checkpoint_files(folder) == []
    before = _snapshot(folder)
    with pytest.raises(FileExistsError) as refused:
        gears.train(epochs=2, save_path=str(folder), resume_from="auto")
    after = _snapshot(folder)
    assert after.pop(".") and before.pop(".") and after == before
    assert "holds a finished run (its model and report written" in str(refused.value)
    assert "without checkpoints, which cannot be continued: resume_from=auto would train it again" in str(refused.value)
    with pytest.raises(FileExistsError) as plain:
        gears.train(epochs=1, save_path=str(folder))
    assert "cannot be continued; replace it with overwrite_save_path=True" in str(plain.value)
    assert "resume_from" not in str(plain.value)


def test_a_single_run_is_refused_in_a_sweep_or_replicates_folder_even_with_overwrite_or_resume(
    data_folder, tmp_path, capsys
):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "sweep.yaml").write_text("run: {}\n")  # a sweep, running (no report yet) or finished
    replicates = tmp_path / "replicates"
    replicates.mkdir()
    (replicates / "config.yaml").write_text(yaml.safe_dump({"replicates": {"seeds": [1, 2]}}))
    (replicates / "report.json").write_text("{}")
    gears = _toy_gears(data_folder)
    for folder, held in ((sweep, "a sweep (its sweep.yaml)"), (replicates, "replicates (its config.yaml")):
        before = _snapshot(folder)
        for options in ({}, {"overwrite_save_path": True}, {"resume_from": "auto"}):
            with pytest.raises(FileExistsError, match=re.escape(f"save_path {folder} holds {held}")):
                gears.train(epochs=1, save_path=str(folder), **options)
        after = _snapshot(folder)
        after.pop(folder_lock.LOCK_FILE)  # the lock's own file, which stays
        assert after.pop(".") and before.pop(".") and after == before  # nothing of theirs replaced or added
    config = _run_file(tmp_path, data_folder, {"epochs": 1, "cpu_processes": 1, "save_path": str(sweep)})
    assert main(["train", "--config", str(config), "--overwrite"]) == 2
    assert "holds a sweep (its sweep.yaml), not one run" in capsys.readouterr().err
    assert not (sweep / "model.pt").exists()


def test_an_unfinished_runs_checkpoints_are_kept_too(data_folder, tmp_path):
    folder = tmp_path / "run"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "checkpoint-000000007.pt").write_bytes(b"x")
    with pytest.raises(FileExistsError, match="unfinished run's checkpoints .the newest checkpoint-000000007.pt"):
        _toy_gears(data_folder).train(epochs=1, save_path=str(folder))


def test_overwrite_with_resume_or_without_a_save_path_is_refused_naming_both():
    from gears_ddp.training.training_options import TrainingOptions

    with pytest.raises(ValueError, match="resume_from.*overwrite_save_path.*give one of them"):
        TrainingOptions.from_dict({"save_path": "x", "resume_from": "auto", "overwrite_save_path": True}, "args")
    with pytest.raises(ValueError, match="overwrite_save_path.*needs args\\['save_path'\\]"):
        TrainingOptions.from_dict({"overwrite_save_path": True}, "args")


def test_the_demo_replaces_its_own_earlier_run_and_keeps_any_other(tmp_path):
    def demo_run(folder, dataset="papalexi2021"):
        config = {
            "pert_data_path": "./data/demo",
            "dataset_name": "papalexi2021",
            "split_config": SPLIT,
            "args": {"epochs": 1, "save_path": str(folder), "cpu_processes": 2},
        }
        return run_options_with_overrides(config, [], "its options")

    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "model.pt").write_bytes(b"x")
    (demo / "config.yaml").write_text(yaml.safe_dump(demo_run(demo).config()))
    assert replacing_earlier_demo(demo_run(demo)).args.overwrite_save_path is True

    other = tmp_path / "mine"
    other.mkdir()
    (other / "model.pt").write_bytes(b"x")
    mine = demo_run(other).config()
    mine["dataset_name"] = "norman"
    (other / "config.yaml").write_text(yaml.safe_dump(mine))
    assert replacing_earlier_demo(demo_run(other)).args.overwrite_save_path is False

    # a run of the demo's data trained with options of its own (gears-ddp train from the
    # demo's config.yaml, another model size, checkpoints) is the user's, not a demo's
    trained = tmp_path / "trained"
    trained.mkdir()
    (trained / "model.pt").write_bytes(b"x")
    theirs = demo_run(trained).config()
    theirs["args"]["model_config"]["hidden_size"] = 32
    theirs["args"]["checkpoint_every"] = 1
    (trained / "config.yaml").write_text(yaml.safe_dump(theirs))
    assert replacing_earlier_demo(demo_run(trained)).args.overwrite_save_path is False

    # an earlier demo of other epochs, on other devices (with the threads its CPU ranks had,
    # which config.yaml records), written before a setting existed
    earlier = demo_run(demo).config()
    earlier["args"].update(epochs=10, cpu_processes=1, cpu_threads=3)
    earlier.update(n_gpus=1)
    del earlier["args"]["timeout_s"]
    (demo / "config.yaml").write_text(yaml.safe_dump(earlier))
    assert replacing_earlier_demo(demo_run(demo)).args.overwrite_save_path is True


# ---------------------------------------------------------------- the lock itself


def _record(folder: Path, **fields) -> None:
    record = {
        "host": "another-node",
        "pid": 1,
        "since": "2026-01-01 00:00:00 UTC",
        "heartbeat": time.time(),
        "what": "training",
        "command": "gears-ddp train",
        "job": None,
        "token": "t",
        **fields,
    }
    (folder / RECORD_FILE).write_text(json.dumps(record))


def test_a_fresh_holder_on_another_machine_refuses_even_where_the_lock_is_granted(tmp_path):
    # a lock only this machine sees (NFS mounted nolock): the record of a live holder elsewhere fails closed
    _record(tmp_path)
    with pytest.raises(FolderInUse, match="process 1 on host another-node.*last seen 0 s ago"):
        FolderLock(tmp_path, "training").acquire()


def test_a_stale_holder_elsewhere_and_a_dead_one_here_are_taken_over(tmp_path):
    _record(tmp_path, heartbeat=time.time() - folder_lock.STALE_S - 1)
    with FolderLock(tmp_path, "training"):
        assert json.loads((tmp_path / RECORD_FILE).read_text())["pid"] == os.getpid()
    assert not (tmp_path / RECORD_FILE).exists()  # released
    _record(tmp_path, host=socket.gethostname(), pid=2**22 + 1)  # this machine: the kernel released its lock
    with FolderLock(tmp_path, "training"):
        pass


def test_an_earlier_attempt_of_the_same_job_is_taken_over(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    _record(tmp_path, job={"scheduler": "slurm", "id": "7", "attempt": [1]})  # this attempt's peer: refused
    with pytest.raises(FolderInUse, match="slurm job 7"):
        FolderLock(tmp_path, "training").acquire()
    _record(tmp_path, job={"scheduler": "slurm", "id": "7", "attempt": [0]})  # the attempt before: gone
    with FolderLock(tmp_path, "training"):
        pass


def test_without_file_locks_the_record_alone_keeps_one_holder(tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with FolderLock(tmp_path, "training"):
        with pytest.raises(FolderInUse, match=f"process {os.getpid()}"):
            FolderLock(tmp_path, "training").acquire()
    _record(tmp_path, heartbeat=time.time() - folder_lock.STALE_S - 1)
    with FolderLock(tmp_path, "training"):
        assert json.loads((tmp_path / RECORD_FILE).read_text())["pid"] == os.getpid()
    # a fresh record of a process of this machine that has ended (killed before it could release)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _record(tmp_path, host=socket.gethostname(), pid=int(ended.stdout))
    with FolderLock(tmp_path, "training"):
        assert json.loads((tmp_path / RECORD_FILE).read_text())["pid"] == os.getpid()


def test_an_unreadable_record_belongs_to_no_live_holder(tmp_path):
    """A record cut short (a full disk) names no holder and no heartbeat: the folder is taken."""
    (tmp_path / RECORD_FILE).write_text('{"host": "another-no')
    with FolderLock(tmp_path, "training"):
        assert json.loads((tmp_path / RECORD_FILE).read_text())["pid"] == os.getpid()


def test_the_holder_refreshes_its_record(tmp_path, monkeypatch):
    monkeypatch.setattr(folder_lock, "HEARTBEAT_S", 0.05)
    with FolderLock(tmp_path, "training"):
        first = json.loads((tmp_path / RECORD_FILE).read_text())["heartbeat"]
        time.sleep(0.3)
        assert json.loads((tmp_path / RECORD_FILE).read_text())["heartbeat"] > first


def test_continuing_a_run_with_another_model_is_refused_before_any_rank_starts(data_folder, tmp_path):
    folder = tmp_path / "run"
    small = _args(folder, cpu_processes=1, epochs=1, checkpoint_every=1, model_config={"hidden_size": 8})
    train_multi_gpu(data_folder, "toy", SPLIT, small)
    written = (folder / "config.yaml").read_text()
    larger = {**small, "epochs": 2, "resume_from": "auto", "model_config": {"hidden_size": 16}}
    with pytest.raises(ValueError, match=r"written by a run of another model \(hidden_size: 8 there, 16 here;"):
        train_multi_gpu(data_folder, "toy", SPLIT, larger)
    assert (folder / "config.yaml").read_text() == written  # the run's configuration kept
    report = train_multi_gpu(data_folder, "toy", SPLIT, {**larger, "model_config": {"hidden_size": 8}})
    assert len(report["history"]) == 2  # continued with the model it was trained with


def test_the_published_api_continuing_with_another_model_is_refused_naming_the_weights(data_folder, tmp_path):
    folder = tmp_path / "run"
    _toy_gears(data_folder).train(epochs=1, save_path=str(folder), checkpoint_every=1)
    with pytest.raises(ValueError, match=r"holds the weights of another model \(.+: \[.*8.*\] there, \[.*16.*\] here"):
        _toy_gears(data_folder, hidden_size=16).train(epochs=2, save_path=str(folder), resume_from="auto")
