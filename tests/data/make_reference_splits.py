"""Produce tests/data/reference_splits.json with the published GEARS (cell-gears 0.1.2).

Run from the repository root with the published package installed
(``pip install cell-gears==0.1.2``):

    python tests/data/make_reference_splits.py

For every case in ``tests/split_reference.CASES`` it builds the dataset of
``split_reference.make_raw_adata``, processes and loads it with the published
``gears.PertData`` and records ``set2conditions`` (and the simulation subgroups).
``simulation_single`` runs on the singles-only variant of the dataset (the published
splitter asserts there are no combos) and cannot go through the published
``prepare_split`` (it unpacks a single return value into two), so for it the published
``DataSplitter`` is called directly with the arguments ``prepare_split`` would pass, on the
loaded data, and the sets are read off its split column as ``prepare_split`` does.
"""

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import split_reference as ref  # noqa: E402


def _sets_from_split_column(adata):
    sets = {}
    for condition, name in zip(adata.obs["condition"].astype(str), adata.obs["split"]):
        if isinstance(name, str):
            sets.setdefault(name, [])
            if condition not in sets[name]:
                sets[name].append(condition)
    return sets


def _plain(obj):
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return [str(x) for x in obj]


def main():
    from gears import PertData
    from gears.data_utils import DataSplitter

    results = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(io.StringIO()):
        ref.write_go_files(tmp)
        datasets = {}
        for name, conditions in (("toy", ref.CONDITIONS), ("toysingles", ref.conditions_for("simulation_single"))):
            datasets[name] = PertData(tmp)
            datasets[name].new_data_process(name, ref.make_raw_adata(conditions), skip_calc_de=True)
            datasets[name].load(data_path=f"{tmp}/{name}")
        for split, seed, size in ref.CASES:
            pert_data = datasets["toy"]
            if split == "simulation_single":
                splitter = DataSplitter(datasets["toysingles"].adata.copy(), split_type=split)
                adata = splitter.split_data(
                    train_gene_set_size=size,
                    combo_seen2_train_frac=0.75,
                    seed=seed,
                    test_perts=None,
                    only_test_set_perts=False,
                )
                entry = {"set2conditions": _sets_from_split_column(adata)}
            else:
                pert_data.prepare_split(split=split, seed=seed, train_gene_set_size=size)
                entry = {"set2conditions": _plain(pert_data.set2conditions)}
                if split == "simulation":
                    entry["subgroup"] = _plain(pert_data.subgroup)
            results[ref.case_key(split, seed, size)] = entry
    payload = {
        "produced_by": "cell-gears 0.1.2 via tests/data/make_reference_splits.py",
        "conditions": ref.CONDITIONS,
        "cases": results,
    }
    ref.REFERENCE_FILE.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    print(f"wrote {ref.REFERENCE_FILE} with {len(results)} cases")


if __name__ == "__main__":
    main()
