"""Train on the toy dataset as a separate process (so that a test can signal or kill it) and
print the report as JSON on the last line.

    python tests/scripts/train.py single|multi DATA_FOLDER '{"epochs": 2, ...}'

``single``: ``GEARS.train`` in this process; ``multi``: ``train_multi_gpu`` with 2 CPU
processes. The options are ``GEARS.train``'s keyword arguments or ``args`` keys.
"""

import json
import sys

import torch

from gears_ddp import PertData, enable_console_logging, train_multi_gpu
from gears_ddp.gears import GEARS

SPLIT = {"split": "simulation", "seed": 1}
MODEL = {"hidden_size": 8}


def single(data_folder: str, options: dict) -> dict:
    pert_data = PertData(data_folder)
    pert_data.load(data_path=f"{data_folder}/toy")
    pert_data.prepare_split(**SPLIT)
    pert_data.get_dataloader(options.pop("batch_size"), test_batch_size=32)
    torch.manual_seed(0)
    gears = GEARS(pert_data)
    gears.model_initialize(**MODEL)
    return gears.train(**options)


def multi(data_folder: str, options: dict) -> dict:
    return train_multi_gpu(
        data_folder, "toy", SPLIT, {"cpu_processes": 2, "test_batch_size": 32, "model_config": MODEL, **options}
    )


if __name__ == "__main__":
    enable_console_logging()
    mode, data, given = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    report = {"single": single, "multi": multi}[mode](data, given)
    print(json.dumps(report))
