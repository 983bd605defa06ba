"""Train / val / test splits by perturbation condition.

The procedures and their random-number calls follow the published GEARS exactly, so the
same ``split`` and ``seed`` put the same conditions in each set and the same simulation
subgroups in the test set (tests/test_split_identity.py checks this against lists produced
by the published package). The reference seeds numpy's global generator; we draw from a
``numpy.random.RandomState`` seeded at the same points, which yields the same stream
without touching global state.

Split types (``SPLIT_TYPES``):

- ``simulation``: a random ``train_gene_set_size`` fraction of the perturbed genes is
  "seen"; train gets the singles of seen genes and ``combo_seen2_train_frac`` of the combos
  of two seen genes; test gets ``unseen_single``, ``combo_seen0``, ``combo_seen1`` and the
  remaining ``combo_seen2``. The same procedure with 0.9 / 0.9 carves val out of train.
- ``simulation_single``: the same on single perturbations only.
- ``combo_seen0`` / ``combo_seen1`` / ``combo_seen2``, ``single``, ``no_test``: test (or
  val) genes or conditions drawn at random, as in the reference.
- ``no_split``: everything in test. ``custom``: a pickled ``{'train','val','test'}`` dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from gears_ddp._options import Options, option
from gears_ddp.data import io
from gears_ddp.data.conditions import CONTROL, condition_genes, genes_of_conditions, is_combo, is_single
from gears_ddp.data.screen_report import Problem, listed, refuse

SPLIT_TYPES = (
    "simulation",
    "simulation_single",
    "combo_seen0",
    "combo_seen1",
    "combo_seen2",
    "single",
    "no_test",
    "no_split",
    "custom",
)


@dataclass
class SplitOptions(Options):
    """``PertData.prepare_split``'s options (its signature gives the same defaults), declared
    once: the keys of a run's ``split_config``, their defaults and help."""

    split: str = option("simulation", "the split type: " + ", ".join(SPLIT_TYPES))
    seed: int = option(1, "the seed of the split's random draws (the published package's, the same sets)")
    train_gene_set_size: float = option(0.75, "simulation splits: the fraction of perturbed genes seen in training")
    combo_seen2_train_frac: float = option(
        0.75, "simulation splits: the fraction of combinations of two seen genes put in training"
    )
    combo_single_split_test_set_fraction: float = option(
        0.1, "combo_seen0/1/2 and single splits: the fraction drawn for test"
    )
    test_perts: object = option(None, "conditions (a list, or '_'-joined) put in the test set")
    only_test_set_perts: bool = option(False, "with test_perts: the test set holds only those")
    test_pert_genes: object = option(None, "genes (a list, or '_'-joined) whose perturbations go to the test set")
    split_dict_path: object = option(
        None, "split='custom': a pickle of {'train': [...], 'val': [...], 'test': [...]} conditions"
    )


SPLIT_OPTION_HELP = SplitOptions.help()  # PertData.prepare_split's options, in words
SETS_OF_SPLIT = {"no_split": ("test",), "no_test": ("train", "val")}  # the sets of the others: ALL_SETS
ALL_SETS = ("train", "val", "test")
SUBGROUP_NAMES = ("combo_seen0", "combo_seen1", "combo_seen2", "unseen_single")
VAL_FRACTION = 0.1  # the reference's fixed val_size for the random-draw split types


@dataclass
class SplitResult:
    """Conditions of each set (``set2conditions``) and, for simulation splits, the subgroups."""

    set2conditions: dict[str, list[str]]
    subgroup: dict[str, dict[str, list[str]]] | None = None


def _perts_with_genes(genes, pert_list: Sequence[str], kind: str) -> list[str]:
    """Conditions of ``pert_list`` (in its order) of the given kind that involve any of ``genes``."""
    wanted = set(np.asarray(genes).tolist())
    keep = is_single if kind == "single" else is_combo
    return [p for p in pert_list if keep(p) and wanted.intersection(condition_genes(p))]


def _count_in(condition: str, genes) -> int:
    """How many genes of ``condition`` belong to ``genes``."""
    members = set(np.asarray(genes).tolist())
    return sum(gene in members for gene in condition.split("+"))


def _choose_seen_genes(rng, genes, fraction, forced_test_genes, only_forced):
    """Pick the seen (train) genes; ``forced_test_genes`` are kept out of them."""
    if only_forced and forced_test_genes is not None:
        return np.setdiff1d(genes, np.array(forced_test_genes))
    seen = rng.choice(genes, int(len(genes) * fraction), replace=False)
    if forced_test_genes is not None:
        n_overlap = len(np.intersect1d(seen, forced_test_genes))
        seen = seen[~np.isin(seen, forced_test_genes)]
        spare = np.setdiff1d(genes, np.union1d(seen, forced_test_genes))
        seen = np.concatenate((seen, rng.choice(spare, n_overlap, replace=False)))
    return seen


def _seen_and_unseen_genes(pert_list, fraction, seed, forced_test_genes, only_forced):
    """The perturbed genes of ``pert_list`` split into seen (train) and unseen ones."""
    genes = genes_of_conditions(pert_list).astype(str)
    seen = _choose_seen_genes(np.random.RandomState(seed), genes, fraction, forced_test_genes, only_forced)
    return seen, np.setdiff1d(genes, seen)


def simulation_split(
    pert_list, train_gene_set_size, combo_seen2_train_frac, seed, forced_test_genes=None, only_forced=False
):
    """One round of the simulation split: returns (train, test, subgroups)."""
    seen, unseen = _seen_and_unseen_genes(pert_list, train_gene_set_size, seed, forced_test_genes, only_forced)

    train = _perts_with_genes(seen, pert_list, "single")
    combos_touching_seen = _perts_with_genes(seen, pert_list, "combo")
    combo_seen1 = [c for c in combos_touching_seen if _count_in(c, seen) == 1]
    both_seen = np.setdiff1d(combos_touching_seen, combo_seen1)
    combo_train = np.random.RandomState(seed).choice(
        both_seen, int(len(both_seen) * combo_seen2_train_frac), replace=False
    )
    combo_seen2 = np.setdiff1d(both_seen, combo_train).tolist()
    train.extend(str(c) for c in combo_train)

    unseen_single = _perts_with_genes(unseen, pert_list, "single")
    combo_seen0 = [c for c in _perts_with_genes(unseen, pert_list, "combo") if _count_in(c, seen) == 0]
    test = combo_seen1 + combo_seen2 + unseen_single + combo_seen0
    subgroups = {
        "combo_seen0": combo_seen0,
        "combo_seen1": combo_seen1,
        "combo_seen2": [str(c) for c in combo_seen2],
        "unseen_single": unseen_single,
    }
    return train, test, subgroups


def simulation_single_split(pert_list, train_gene_set_size, seed, forced_test_genes=None, only_forced=False):
    """Simulation split on single perturbations: returns (train, test, subgroups)."""
    combos = [p for p in pert_list if is_combo(p)]
    if combos:
        raise ValueError(
            f"split 'simulation_single' needs single perturbations only; the data has "
            f"{len(combos)} combinations (e.g. {combos[:3]}): use 'simulation' instead"
        )
    seen, unseen = _seen_and_unseen_genes(pert_list, train_gene_set_size, seed, forced_test_genes, only_forced)
    train = _perts_with_genes(seen, pert_list, "single")
    unseen_single = _perts_with_genes(unseen, pert_list, "single")
    return train, unseen_single, {"unseen_single": unseen_single}


def random_holdout_split(rng, split_type, pert_list, test_size, test_pert_genes=None, test_perts=None):
    """The reference's draw of held-out conditions for the non-simulation split types.

    Returns (kept, held_out). ``split_type`` is 'single', 'no_test', 'combo_seen0',
    'combo_seen1' or 'combo_seen2'. Combos that would break the type's definition are
    dropped from both sides, as in the reference.
    """
    singles = [p for p in pert_list if is_single(p)]
    combos = [p for p in pert_list if is_combo(p)]
    genes = genes_of_conditions(pert_list).astype(str)
    dropped: list[str] = []
    if test_pert_genes is None:
        test_pert_genes = rng.choice(genes, int(len(singles) * test_size))

    if split_type == "single":
        test_perts = _perts_with_genes(test_pert_genes, pert_list, "single")
        dropped = _perts_with_genes(test_pert_genes, pert_list, "combo")
    elif split_type == "no_test":
        if test_perts is None:
            test_perts = rng.choice(pert_list, int(len(pert_list) * test_size))
    elif split_type in ("combo_seen0", "combo_seen1"):
        max_seen = int(split_type[-1])
        test_combos = _perts_with_genes(test_pert_genes, pert_list, "combo")
        dropped = [c for c in test_combos if len(c.split("+")) - _count_in(c, test_pert_genes) > max_seen]
        test_perts = _perts_with_genes(test_pert_genes, pert_list, "single") + [
            c for c in test_combos if c not in dropped
        ]
    elif split_type == "combo_seen2":
        if test_perts is None:
            test_perts = rng.choice(combos, int(len(combos) * test_size))
    else:
        raise ValueError(f"random_holdout_split does not handle split type {split_type!r}")

    excluded = set(np.asarray(test_perts).tolist()) | set(dropped)
    kept = [p for p in pert_list if p not in excluded]
    return kept, [str(p) for p in np.asarray(test_perts).tolist()]


def split_conditions(
    conditions_in_order: Sequence[str],
    split: str,
    seed: int = 1,
    train_gene_set_size: float = 0.75,
    combo_seen2_train_frac: float = 0.75,
    combo_single_split_test_set_fraction: float = 0.1,
    test_perts: list[str] | None = None,
    only_test_set_perts: bool = False,
    test_pert_genes: list[str] | None = None,
) -> SplitResult:
    """Assign each condition to train / val / test as the reference does.

    ``conditions_in_order``: the cells' conditions in order of first appearance in the data
    (the order matters: the reference's random draws index into it). Returns the sets, with
    each set's conditions in that order, and the subgroups for ``simulation``.
    """
    if split in ("custom",) or split not in SPLIT_TYPES:
        raise ValueError(f"split_conditions handles {', '.join(SPLIT_TYPES[:-1])}; got {split!r}")
    conditions_in_order = list(conditions_in_order)
    if split == "no_split":
        return SplitResult({"test": conditions_in_order})

    perts = [c for c in conditions_in_order if c != CONTROL]
    subgroup = None
    test: list[str] = []
    if split == "simulation":
        train, test, test_sub = simulation_split(
            perts, train_gene_set_size, combo_seen2_train_frac, seed, test_perts, only_test_set_perts
        )
        train, val, val_sub = simulation_split(train, 0.9, 0.9, seed)
        subgroup = {"test_subgroup": test_sub, "val_subgroup": val_sub}
    elif split == "simulation_single":
        train, test, _ = simulation_single_split(perts, train_gene_set_size, seed, test_perts, only_test_set_perts)
        train, val, _ = simulation_single_split(train, 0.9, seed)
    else:
        rng = np.random.RandomState(seed)
        if split == "no_test":
            train, val = random_holdout_split(rng, split, perts, VAL_FRACTION)
        else:
            train, test = random_holdout_split(
                rng, split, perts, combo_single_split_test_set_fraction, test_pert_genes, test_perts
            )
            train, val = random_holdout_split(rng, split, train, VAL_FRACTION)

    assignment = {c: "train" for c in train}
    assignment.update({c: "val" for c in val})
    if split != "no_test":
        assignment.update({c: "test" for c in test})
    assignment[CONTROL] = "train"
    set2conditions: dict[str, list[str]] = {}
    for condition in conditions_in_order:
        if condition in assignment:
            set2conditions.setdefault(assignment[condition], []).append(condition)
    return SplitResult(set2conditions, subgroup)


TOO_FEW_PERTURBATIONS = (
    "the dataset has too few perturbations for this split: use more perturbations, another "
    "split type or seed, or a custom split"
)
CUSTOM_SPLIT_ADVICE = "give each set of the split file some of the screen's perturbations"


def read_custom_split(split_dict_path) -> dict[str, list[str]]:
    """The sets of a custom split: the pickled dict ``{'train': [...], 'val': [...], 'test':
    [...]}`` of conditions at ``split_dict_path`` (plain data only: ``io.read_pickle``)."""
    if split_dict_path is None:
        raise ValueError(
            "split='custom' needs split_dict_path, a pickled dict "
            "{'train': [...], 'val': [...], 'test': [...]} of conditions"
        )
    loaded = io.read_pickle(split_dict_path, "custom split")
    if not isinstance(loaded, dict):
        raise ValueError(
            f"custom split file {split_dict_path} holds a {type(loaded).__name__}, "
            "expected a dict {'train': [...], 'val': [...], 'test': [...]}"
        )
    return {name: [str(c) for c in conds] for name, conds in loaded.items()}


def sets_of_split(split: str | None) -> tuple[str, ...]:
    """The sets a split of this type must give perturbations to (``SETS_OF_SPLIT``; all
    three for None, conditions not split by ``prepare_split``)."""
    return ALL_SETS if split is None else SETS_OF_SPLIT.get(split, ALL_SETS)


def cells_of_sets(table, set2conditions: dict[str, list[str]], split: str | None) -> dict:
    """The cell indices (``table.cells_of``, a ``CellTable``'s) of each set a split of type
    ``split`` defines, from its conditions ``set2conditions`` (control excluded from a
    ``no_split`` test)."""
    out = {}
    for name in sets_of_split(split):
        conditions = set2conditions[name]
        if split == "no_split":
            conditions = [c for c in conditions if c != CONTROL]
        out[name] = table.cells_of(conditions)
    return out


# the split options that are fractions in (0, 1]
SPLIT_FRACTIONS = ("train_gene_set_size", "combo_seen2_train_frac", "combo_single_split_test_set_fraction")


def split_option_problems(split: str, seed, **fractions) -> list[Problem]:
    """The problems of ``prepare_split``'s options: an unknown split type, a seed that is no
    non-negative integer, ``fractions`` (``train_gene_set_size``, ...) outside (0, 1]."""
    problems = []
    if split not in SPLIT_TYPES:
        problems.append(Problem("split", f"unknown split {split!r}; available splits: {', '.join(SPLIT_TYPES)}"))
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        problems.append(Problem("split", f"prepare_split: seed must be a non-negative integer, got {seed!r}"))
    for name, value in fractions.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= 1:
            problems.append(Problem("split", f"prepare_split: {name} must be a fraction in (0, 1], got {value!r}"))
    return problems


def sets_without_perturbations(set2conditions: dict, required_sets: Sequence[str]) -> list[str]:
    """The sets among ``required_sets`` that a split leaves without perturbations."""
    return [name for name in required_sets if not [c for c in set2conditions.get(name, []) if c != CONTROL]]


def split_set_problems(
    set2conditions: dict,
    known_conditions,
    required_sets: Sequence[str],
    source: str,
    advice: str = TOO_FEW_PERTURBATIONS,
) -> list[Problem]:
    """The problems of a split: sets other than train, val and test (a misspelt name
    leaves its set empty), required sets without perturbations (then ``advice``), a train
    set without the control cells the data has (the baselines are fitted on them, after
    the whole training), conditions absent from the data, conditions in two sets.
    ``source`` names where the split came from (a file, or the split type and seed), so the
    text tells the user what to change."""
    problems = []
    other_sets = [name for name in set2conditions if name not in ALL_SETS]
    if other_sets:
        problems.append(
            Problem(
                "split",
                f"{source} has set(s) {listed(map(repr, other_sets))}, which are none of 'train', 'val' and "
                "'test': name the sets 'train', 'val' and 'test'",
            )
        )
    missing_sets = sets_without_perturbations(set2conditions, required_sets)
    if missing_sets:
        sizes = {name: len(conds) for name, conds in set2conditions.items()}
        problems.append(
            Problem(
                "split",
                f"{source} leaves the {' and '.join(missing_sets)} set(s) without "
                f"perturbations (conditions per set: {sizes}); {advice}",
            )
        )
    known = set(known_conditions)
    if "train" in required_sets and CONTROL in known and CONTROL not in set2conditions.get("train", []):
        problems.append(
            Problem(
                "split",
                f"{source} leaves the control cells ('{CONTROL}') out of the train set, whose control cells "
                f"the baselines are fitted on once training ends: add '{CONTROL}' to the train set",
            )
        )
    unknown = sorted({c for conds in set2conditions.values() for c in conds} - known)
    if unknown:
        problems.append(
            Problem(
                "split",
                f"{source} names conditions absent from the data: {unknown[:20]}"
                + (f" and {len(unknown) - 20} more" if len(unknown) > 20 else "")
                + " (a condition whose genes have no GO terms is dropped when the data is loaded); split the "
                "conditions the data has",
            )
        )
    names = list(set2conditions)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            shared = sorted(set(set2conditions[first]) & set(set2conditions[second]))
            if shared:
                problems.append(
                    Problem(
                        "split",
                        f"{source} puts conditions in both {first!r} and {second!r}: "
                        f"{shared[:20]}; put each condition in one set",
                    )
                )
    return problems


def check_split_sets(
    set2conditions: dict,
    known_conditions,
    required_sets: Sequence[str],
    source: str,
    advice: str = TOO_FEW_PERTURBATIONS,
) -> None:
    """Refuse a split with ``split_set_problems``, naming them all."""
    refuse(split_set_problems(set2conditions, known_conditions, required_sets, source, advice), source)
