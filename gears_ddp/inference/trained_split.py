"""Whether a saved run was trained on the split its data has now.

A model loaded into a ``GEARS`` (``load_pretrained``) is scored and asked for the cells of
a set of the split that ``GEARS``'s data has, which the user prepared. Prepared with
another seed or type than the run trained on, that set can hold perturbations the model
trained on, and its scores flatter it without a word. A run folder's ``config.yaml`` says
the split the run trained on; ``split_differences`` compares it with the data's, and
``say_if_trained_on_another_split`` says so for ``GEARS`` (when it loads a run:
``loaded_trained_split``, and when it scores or predicts a set; ``gears-ddp evaluate`` and
``predict`` prepare the run's own split: ``runs.saved_runs.open_run``). A model folder
without ``config.yaml`` (``save_model``, the published GEARS) says nothing of its split,
and nothing is compared.
"""

from __future__ import annotations

from pathlib import Path

from gears_ddp._logging import get_logger
from gears_ddp.report.run_files import CONFIG_FILE, read_settings

logger = get_logger(__name__)

# the settings that decide a split's sets (a custom split's come from its file alone)
DECIDING = ("split", "seed", "train_gene_set_size")


def trained_split(folder) -> dict | None:
    """The ``split_config`` of the run folder ``folder`` (its ``config.yaml``); None for a
    model folder without one."""
    return read_settings(folder).get("split_config") or None


def split_differences(trained: dict | None, split: str | None, seed, train_gene_set_size) -> list[str]:
    """``'seed: 1 there, 2 here'`` for each setting in ``DECIDING`` in which the split a run
    trained on (``trained``: ``trained_split``) and the data's (``split``, ``seed``,
    ``train_gene_set_size``: ``PertData.prepare_split``'s) differ; for two custom splits
    only their type counts. None differ when the run's split is unknown."""
    if not trained:
        return []
    here = {"split": split, "seed": seed, "train_gene_set_size": train_gene_set_size}
    deciding = DECIDING[:1] if split == "custom" and trained.get("split") == "custom" else DECIDING
    return [
        f"{key}: {trained.get(key)!r} there, {here[key]!r} here" for key in deciding if trained.get(key) != here[key]
    ]


def other_split_warning(folder, differences: list[str], used_for: str) -> str:
    """The warning that the run in ``folder``, trained on another split (``differences``), is
    ``used_for`` something (``'scored on the test set'``) of the data's split."""
    return (
        f"the model of {folder} was trained on another split than this data's ({'; '.join(differences)}): "
        f"{used_for} may hold perturbations it trained on, so its scores would flatter it; prepare the split "
        f"its {Path(folder) / CONFIG_FILE} gives (split_config), or open the run with "
        "gears_ddp.runs.saved_runs.open_run(folder).gears"
    )


def say_if_trained_on_another_split(folder, trained: dict | None, pert_data, used_for: str) -> None:
    """Warn when the run in ``folder`` was trained (``trained``: ``trained_split``) on
    another split than ``pert_data``'s, which ``used_for`` (the set scored or predicted)
    then reads."""
    differences = split_differences(trained, pert_data.split, pert_data.seed, pert_data.train_gene_set_size)
    if differences:
        logger.warning("%s", other_split_warning(folder, differences, used_for))


def loaded_trained_split(folder, pert_data) -> dict | None:
    """The split the run in ``folder`` trained on (``trained_split``), as a model loaded from
    it keeps it; warns at once when ``pert_data``'s split is another, whose test set may then
    hold perturbations the model trained on."""
    trained = trained_split(folder)
    say_if_trained_on_another_split(folder, trained, pert_data, "its test set")
    return trained
