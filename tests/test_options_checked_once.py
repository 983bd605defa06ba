"""Each option is checked in one place, at the edge: every entry path of a training run
calls the one checker of each option exactly once, in the process the user called, and no
rank it starts calls it again.

The checkers are counted in every process: in this one by patching them, in the spawned
ranks by a ``sitecustomize`` module that patches them as each rank's interpreter starts.
The checkers: ``check_device_request`` (``gpu_ids``, ``n_gpus``, ``cpu_processes``) or, for
``GEARS``, ``checked_device``; ``TrainingOptions.check`` (``amp`` and the other training
options); ``check_loader_options`` (``batch_size`` and the other loader options, which
``TrainingOptions.check`` and ``PertData.get_dataloader`` hand to it); ``ModelOptions.check``
(``model_config``); ``check_save_path``.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import yaml

from gears_ddp import GEARS, PertData
from gears_ddp.cli import main
from gears_ddp.configuration.run_options import RunOptions
from gears_ddp.distributed.replicates import train_replicates
from gears_ddp.launching.choose import launch
from gears_ddp.launching.environments import TorchrunEnvironment, find_free_port
from gears_ddp.train_distributed import train_ddp_worker, train_multi_gpu

pytestmark = pytest.mark.distributed

COUNTS_VARIABLE = "GEARS_DDP_TEST_CHECK_COUNTS"
# run in this process (patching with monkeypatch.setattr) and, as sitecustomize, in every spawned rank
INSTRUMENT = f'''
import os
import sys


def instrument(path, setattr=setattr):
    """Make each checker append its name and this process's id to ``path`` when called."""
    import gears_ddp.launching.launchers, gears_ddp.distributed.replicates, gears_ddp.train_distributed  # noqa
    import gears_ddp.launching.choose, gears_ddp.cli.train  # noqa
    from gears_ddp.data import loaders
    from gears_ddp.model.model_options import ModelOptions
    from gears_ddp.runtime import devices
    from gears_ddp.training import save_folder
    from gears_ddp.training.training_options import TrainingOptions

    def counted(name, function):
        def checker(*args, **kwargs):
            with open(path, "a", encoding="utf-8") as file:
                file.write(f"{{name}} {{os.getpid()}}\\n")
            return function(*args, **kwargs)
        return checker

    setattr(ModelOptions, "check", counted("model_config", ModelOptions.check))
    setattr(TrainingOptions, "check", counted("training_options", TrainingOptions.check))
    for name, original in (("save_path", save_folder.check_save_path), ("gpu_ids", devices.check_device_request),
                           ("device", devices.checked_device), ("batch_size", loaders.check_loader_options)):
        checker = counted(name, original)
        for module in list(sys.modules.values()):  # every module that imported it by name
            if getattr(module, "__name__", "").startswith("gears_ddp") \\
                    and getattr(module, original.__name__, None) is original:
                setattr(module, original.__name__, checker)


if os.environ.get("{COUNTS_VARIABLE}"):
    instrument(os.environ["{COUNTS_VARIABLE}"])
'''
ONCE = {"training_options": 1, "batch_size": 1, "model_config": 1, "save_path": 1}
SPLIT = {"split": "simulation", "seed": 1}


@pytest.fixture
def counted_checks(tmp_path, monkeypatch):
    """The checks each process made so far: ``calls()`` gives ``(here, elsewhere)``, each a
    Counter of checker names, for this process and for the processes it started."""
    path = tmp_path / "checks.txt"
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(INSTRUMENT, encoding="utf-8")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv(COUNTS_VARIABLE, str(path))
    namespace = {}
    exec(
        compile(INSTRUMENT.replace(f'if os.environ.get("{COUNTS_VARIABLE}")', "if False"), "instrument", "exec"),
        namespace,
    )
    namespace["instrument"](str(path), monkeypatch.setattr)

    def calls() -> tuple[Counter, Counter]:
        lines = [line.split() for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []
        path.unlink(missing_ok=True)
        here = Counter(name for name, pid in lines if int(pid) == os.getpid())
        return here, Counter(name for name, pid in lines if int(pid) != os.getpid())

    return calls


def _args(save_path, **more) -> dict:
    return {
        "epochs": 1,
        "max_steps": 2,
        "batch_size": 16,
        "amp": "off",
        "model_config": {"hidden_size": 8},
        "save_path": str(save_path),
        "report_pictures": False,  # drawn where a test looks at them (tests/test_report_pictures.py)
        **more,
    }


def test_gears_train_checks_each_option_once(data_folder, tmp_path, counted_checks):
    pert_data = PertData(data_folder)
    pert_data.load(data_path=data_folder / "toy")
    pert_data.prepare_split("simulation", seed=1)
    pert_data.get_dataloader(16)
    counted_checks()  # only what GEARS itself checks
    gears = GEARS(pert_data, device="cpu")
    gears.model_initialize(hidden_size=8)
    gears.train(epochs=1, max_steps=2, batch_size=16, amp="off", save_path=str(tmp_path / "run"))
    here, elsewhere = counted_checks()
    assert here == Counter({**ONCE, "device": 1}) and not elsewhere


def test_spawned_ranks_take_the_options_their_parent_checked(data_folder, tmp_path, counted_checks):
    report = train_multi_gpu(data_folder, "toy", SPLIT, _args(tmp_path / "run", cpu_processes=2))
    here, elsewhere = counted_checks()
    assert report["world_size"] == 2
    assert here == Counter({**ONCE, "gpu_ids": 1}) and not elsewhere


def test_a_replicate_scheduler_checks_each_option_once(data_folder, tmp_path, counted_checks):
    summary = train_replicates(data_folder, "toy", SPLIT, _args(tmp_path / "run", cpu_processes=1), {"seeds": [3]})
    here, elsewhere = counted_checks()
    assert summary["finished"] == 1
    assert here == Counter({**ONCE, "gpu_ids": 1}) and not elsewhere


def test_a_train_ddp_worker_checks_each_option_once(data_folder, tmp_path, counted_checks):
    report = train_ddp_worker(
        0, 1, data_folder, "toy", SPLIT, _args(tmp_path / "run", cpu_processes=1), master_port=find_free_port()
    )
    here, elsewhere = counted_checks()
    assert report["world_size"] == 1
    assert here == Counter({**ONCE, "gpu_ids": 1}) and not elsewhere


def test_a_launched_rank_checks_each_option_once(data_folder, tmp_path, counted_checks, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a restarted rank: resume_from='auto' set, not checked
    environment = TorchrunEnvironment(0, 1, 0, 1, "127.0.0.1", find_free_port())
    report = launch(RunOptions.checked(data_folder, "toy", SPLIT, _args(tmp_path / "run")), environment)
    here, elsewhere = counted_checks()
    assert report["world_size"] == 1
    assert here == Counter({**ONCE, "gpu_ids": 1}) and not elsewhere


def _config_file(folder, data_folder, args: dict):
    path = folder / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {"pert_data_path": str(data_folder), "dataset_name": "toy", "split_config": SPLIT, "args": args}
        ),
        encoding="utf-8",
    )
    return path


def test_gears_ddp_train_reads_and_checks_its_file_once(data_folder, tmp_path, counted_checks):
    config = _config_file(tmp_path, data_folder, _args(tmp_path / "run", cpu_processes=1))
    assert main(["train", "--config", str(config), "--set", "args.epochs=1"]) == 0
    here, elsewhere = counted_checks()
    assert here == Counter({**ONCE, "gpu_ids": 1}) and not elsewhere


def test_gears_ddp_train_under_torchrun_checks_its_file_once(data_folder, tmp_path, counted_checks, monkeypatch):
    for name, value in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(find_free_port()),
    }.items():
        monkeypatch.setenv(name, value)
    config = _config_file(tmp_path, data_folder, _args(tmp_path / "run"))
    assert main(["train", "--config", str(config)]) == 0
    here, elsewhere = counted_checks()
    assert here == Counter({**ONCE, "gpu_ids": 1}) and not elsewhere
