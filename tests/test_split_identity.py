"""Same split and seed give the same sets and subgroups as the published GEARS.

The expected lists in tests/data/reference_splits.json were produced once by the published
package (cell-gears 0.1.2) with tests/data/make_reference_splits.py on the dataset of
tests/split_reference.py.
"""

import json
from pathlib import Path

import pytest
import split_reference as ref

from gears_ddp import PertData

REFERENCE = json.loads(ref.REFERENCE_FILE.read_text())


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """Our PertData on the reference's datasets (all conditions; singles only)."""
    root = tmp_path_factory.mktemp("split_identity")
    ref.write_go_files(root)
    out = {}
    for split in ("simulation", "simulation_single"):
        conditions = ref.conditions_for(split)
        pert_data = PertData(root)
        pert_data.new_data_process(f"toy_{split}", ref.make_raw_adata(conditions), skip_calc_de=True)
        out[split] = pert_data
    return out


def test_reference_file_matches_the_dataset():
    assert REFERENCE["conditions"] == ref.CONDITIONS
    assert set(REFERENCE["cases"]) == {ref.case_key(*case) for case in ref.CASES}


def test_unannotated_gene_conditions_are_dropped_as_in_the_reference(datasets):
    conditions = datasets["simulation"].cells.conditions
    assert not [c for c in conditions if ref.UNANNOTATED_GENE in c]
    in_reference = {c for sets in REFERENCE["cases"]["no_split/1/0.75"]["set2conditions"].values() for c in sets}
    assert set(conditions) == in_reference


@pytest.mark.parametrize("split,seed,size", ref.CASES, ids=[ref.case_key(*c) for c in ref.CASES])
def test_split_equals_published_gears(datasets, split, seed, size):
    pert_data = datasets["simulation_single" if split == "simulation_single" else "simulation"]
    pert_data.prepare_split(split=split, seed=seed, train_gene_set_size=size)
    expected = REFERENCE["cases"][ref.case_key(split, seed, size)]
    assert pert_data.set2conditions == expected["set2conditions"]
    if split == "simulation":
        assert pert_data.subgroup == expected["subgroup"]


def test_cached_split_is_reused_and_identical(datasets):
    pert_data = datasets["simulation"]
    pert_data.prepare_split(split="simulation", seed=1)
    first = pert_data.set2conditions
    cache = next((Path(pert_data.dataset_path) / "splits").glob("*_simulation_1_0.75.pkl"))
    mtime = cache.stat().st_mtime_ns
    pert_data.prepare_split(split="simulation", seed=1)
    assert pert_data.set2conditions == first
    assert cache.stat().st_mtime_ns == mtime
