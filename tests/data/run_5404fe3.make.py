"""How ``run_5404fe3/`` and ``run_5404fe3.predictions.json`` were written: with gears_ddp at
commit 5404fe3 (before the options, the launcher and the saved-run loading moved), run from
a checkout of that commit:

    python tests/data/run_5404fe3.make.py /tmp/earlier

1 epoch of the toy data (tests/toy_data.py) through ``train_multi_gpu`` with 1 CPU process,
hidden size 8 and a checkpoint after the epoch; then the run folder loaded and three
queries predicted and the test set scored (`gears-ddp evaluate`), which a later version must
reproduce from the folder
(tests/test_earlier_runs.py). The folder kept is the run's config, model folder, metrics and
checkpoint (its report, log and pictures left out).
"""

import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import toy_data  # noqa: E402

import gears_ddp  # noqa: E402
from gears_ddp import PertData  # noqa: E402
from gears_ddp.cli.command import main  # noqa: E402  (where 5404fe3 kept them)
from gears_ddp.distributed.saved_runs import load_run  # noqa: E402
from gears_ddp.train_distributed import train_multi_gpu  # noqa: E402

if __name__ == "__main__":
    work = Path(sys.argv[1])
    shutil.rmtree(work, ignore_errors=True)
    data = work / "data"
    data.mkdir(parents=True)
    toy_data.write_go_files(data)
    PertData(data).new_data_process("toy", toy_data.make_raw())
    run = work / "run"
    args = {
        "epochs": 1,
        "batch_size": 16,
        "test_batch_size": 64,
        "cpu_processes": 1,
        "seed": 0,
        "model_config": {"hidden_size": 8},
        "save_path": str(run),
        "checkpoint_every": 1,
    }
    train_multi_gpu(str(data), "toy", {"split": "simulation", "seed": 1}, args)
    queries = [["G0"], ["G3"], ["G0", "G1"]]
    predicted = load_run(str(run)).predict(queries)
    main(["evaluate", "--run", str(run), "--out", str(work / "scores.json")])
    scores = json.loads((work / "scores.json").read_text())["model"]
    (work / "predictions.json").write_text(
        json.dumps(
            {
                "version": gears_ddp.__version__,
                "queries": queries,
                "predictions": {key: [float(x) for x in row] for key, row in predicted.items()},
                "evaluate": {name: value for name, value in scores.items() if isinstance(value, float)},
            },
            indent=1,
        )
    )
