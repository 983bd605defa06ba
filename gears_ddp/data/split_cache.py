"""A dataset's split, computed once and cached in its folder as the published GEARS caches it.

``prepared_split`` does the work of ``PertData.prepare_split`` (whose docstring says how
the cache is named and when it is built again): a custom split read from its file, or a
split of ``splits`` read from ``<dataset>/splits/`` or computed and written there with its
settings beside it (``cache_settings``). Every split is checked against the dataset's
conditions before it is used.
"""

from __future__ import annotations

from pathlib import Path

from gears_ddp._logging import get_logger
from gears_ddp.data import cache_settings, io
from gears_ddp.data.screen_report import listed, refuse
from gears_ddp.data.splits import (
    CUSTOM_SPLIT_ADVICE,
    SplitResult,
    check_split_sets,
    read_custom_split,
    sets_of_split,
    split_conditions,
    split_option_problems,
)

logger = get_logger(__name__)


def names_given(value) -> list[str] | None:
    """A list of names given as a list or as the published package's ``'_'``-joined string."""
    if value is None:
        return None
    return value.split("_") if isinstance(value, str) else [str(name) for name in value]


def prepared_split(
    conditions: list[str],
    dataset_path,
    dataset_name: str,
    split: str,
    seed: int,
    train_gene_set_size: float,
    combo_seen2_train_frac: float,
    combo_single_split_test_set_fraction: float,
    test_perts,
    only_test_set_perts: bool,
    test_pert_genes,
    split_dict_path,
) -> SplitResult:
    """The split of the dataset ``dataset_name`` in ``dataset_path``, whose conditions are
    ``conditions``, with ``PertData.prepare_split``'s options: read from the cache, or
    computed and cached (a custom split read from ``split_dict_path``); refused, naming the
    problem, when an option is invalid or a set the split needs is left empty."""
    refuse(
        split_option_problems(
            split,
            seed,
            train_gene_set_size=train_gene_set_size,
            combo_seen2_train_frac=combo_seen2_train_frac,
            combo_single_split_test_set_fraction=combo_single_split_test_set_fraction,
        ),
        "prepare_split",
    )
    required = sets_of_split(split)
    if split == "custom":
        sets = read_custom_split(split_dict_path)
        source = f"custom split file {split_dict_path}"
        check_split_sets(sets, conditions, required, source, CUSTOM_SPLIT_ADVICE)
        placed = {condition for members in sets.values() for condition in members}
        unused = [condition for condition in conditions if condition not in placed]
        if unused:
            logger.warning(
                "%s puts %d of the data's conditions in no set: they are neither trained nor scored: %s",
                source,
                len(unused),
                listed(unused),
            )
        return SplitResult(sets)
    test_perts, test_pert_genes = names_given(test_perts), names_given(test_pert_genes)
    split_path = (
        Path(dataset_path)
        / "splits"
        / (
            f"{dataset_name}_{split}_{seed}_{train_gene_set_size}"
            + (f"_{'_'.join(test_perts)}" if test_perts else "")
            + ".pkl"
        )
    )
    settings = {
        "split": split,
        "seed": seed,
        "train_gene_set_size": train_gene_set_size,
        "combo_seen2_train_frac": combo_seen2_train_frac,
        "combo_single_split_test_set_fraction": combo_single_split_test_set_fraction,
        "test_perts": test_perts,
        "only_test_set_perts": only_test_set_perts,
        "test_pert_genes": test_pert_genes,
    }
    other_settings = cache_settings.differences(split_path, settings) if split_path.exists() else []
    if other_settings:
        logger.info(
            "cached split %s was built with other settings (%s): building it again",
            split_path,
            "; ".join(other_settings),
        )
    if split_path.exists() and not other_settings:
        result = _cached_split(split_path, split, conditions, required)
    else:
        result = split_conditions(
            conditions,
            split,
            seed,
            train_gene_set_size,
            combo_seen2_train_frac,
            combo_single_split_test_set_fraction,
            test_perts,
            only_test_set_perts,
            test_pert_genes,
        )
        check_split_sets(result.set2conditions, conditions, required, f"split {split!r} with seed {seed}")
        _write_split(split_path, result, settings)
    logger.info(
        "split %s (seed %s): %s conditions",
        split,
        seed,
        {name: len(conds) for name, conds in result.set2conditions.items()},
    )
    if result.subgroup is not None:
        logger.info(
            "test composition: %s", {name: len(conds) for name, conds in result.subgroup["test_subgroup"].items()}
        )
    return result


def _subgroup_path(split_path: Path) -> Path:
    """Where the simulation subgroups of the split cached at ``split_path`` are cached."""
    return split_path.with_name(split_path.stem + "_subgroup.pkl")


def _cached_split(split_path: Path, split: str, conditions: list[str], required) -> SplitResult:
    """The split cached at ``split_path`` (with its subgroups, for a simulation split),
    checked against the dataset's ``conditions``."""
    logger.info("using cached split %s", split_path)
    sets = {k: [str(c) for c in v] for k, v in io.read_pickle(split_path, "cached split").items()}
    check_split_sets(sets, conditions, required, f"cached split {split_path} (delete it if the data changed)")
    subgroup = io.read_pickle(_subgroup_path(split_path), "cached split subgroups") if split == "simulation" else None
    return SplitResult(sets, subgroup)


def _write_split(split_path: Path, result: SplitResult, settings: dict) -> None:
    """Cache ``result`` at ``split_path`` (its subgroups beside it), with the ``settings``
    it was built with beside it (``cache_settings``)."""
    cache_settings.forget(split_path)
    io.write_pickle(result.set2conditions, split_path)
    if result.subgroup is not None:
        io.write_pickle(result.subgroup, _subgroup_path(split_path))
    cache_settings.write_settings(split_path, settings)
    logger.info("saved split to %s", split_path)
