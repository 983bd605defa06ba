"""A run's configuration as a YAML file: what ``gears-ddp train --config run.yaml`` reads.

The top-level keys are ``train_multi_gpu``'s parameters (``pert_data_path``,
``dataset_name``, ``split_config``, ``args``, ``n_gpus``, ``gpu_ids``), and
``train_replicates``' ``replicates`` (``{seeds: [1, 2, 3]}``), so a file and a Python call
say the same thing in the same words::

    pert_data_path: ./data
    dataset_name: norman
    split_config: {split: simulation, seed: 1}
    args: {epochs: 20, batch_size: 32, model_config: {hidden_size: 64}, save_path: ./runs/norman}

``--set args.epochs=5`` overrides one value (the value is read as YAML: ``5`` is a number,
``true`` a boolean, ``[0, 1]`` a list). Every key and value is checked before anything
runs, by the checks ``train_multi_gpu`` itself uses, and an error names the key and the
file. The run folder keeps the resolved configuration (every default filled in) as
``config.yaml``, which ``gears-ddp train --config`` reads back to repeat the run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from gears_ddp.configuration.sections import ReplicateOptions, SplitConfig, TrainingArgs, check_replicated_run
from gears_ddp.data.io import write_yaml
from gears_ddp.data.pertdata import SPLIT_DEFAULTS
from gears_ddp.data.splits import SPLIT_OPTION_HELP
from gears_ddp.model.model_options import ModelOptions
from gears_ddp.report.run_files import CONFIG_FILE
from gears_ddp.runtime.devices import check_device_request
from gears_ddp.training.training_options import TrainingOptions

RUN_KEYS = ("pert_data_path", "dataset_name", "split_config", "args", "n_gpus", "gpu_ids", "replicates")
RUN_KEY_HELP = {
    "pert_data_path": "the data folder (GO files, datasets); required",
    "dataset_name": "a published dataset's name, or a dataset folder in pert_data_path; required",
    "n_gpus": "use the first N visible GPUs (None: all of them)",
    "gpu_ids": "use these GPUs; rank r runs on gpu_ids[r]",
    "replicates": "train one run per seed, in save_path/seed-N/, and summarise them (train_replicates; "
    "see the replicates keys below)",
}
REQUIRED_KEYS = ("pert_data_path", "dataset_name")
# the settings that say where a run trains (its devices and its CPU ranks' threads), dotted as
# --set names them: what two runs of one computation may differ in (an earlier demo, a
# replicate continued, another process joining a sweep)
DEVICE_SETTINGS = ("n_gpus", "gpu_ids", "args.cpu_processes", "args.cpu_threads")


class _Loader(yaml.SafeLoader):
    """YAML as people write it: ``lr: 1e-3`` is a number (YAML 1.1 wants ``1.0e-3``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+|\.[0-9_]+"
        r"(?:[eE][-+]?[0-9]+)?|\.(?:inf|Inf|INF))$|^\.(?:nan|NaN|NAN)$"
    ),
    list("-+0123456789."),
)


def load_yaml(text: str):
    """Parse YAML text (plain data only: no tags that build objects)."""
    return yaml.load(text, Loader=_Loader)


class RunConfigError(ValueError):
    """A configuration file or override that cannot be used; the message names the key and
    where it came from."""


def read_run_config(path, overrides=()) -> dict:
    """The checked, resolved configuration of the YAML file ``path`` with the ``--set``
    ``overrides`` (``'args.epochs=5'``, ...) applied."""
    return read_run_options(path, overrides).config()


def read_run_options(path, overrides=()) -> "RunOptions":
    """The checked options of the YAML file ``path`` with the ``--set`` ``overrides``
    applied: what a run started from a file takes (``gears-ddp train --config``)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise RunConfigError(f"cannot read the configuration file {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise RunConfigError(f"{path} is not a YAML configuration file: it is not text (UTF-8)") from None
    try:
        config = load_yaml(text)
    except yaml.YAMLError as err:
        raise RunConfigError(f"{path} is not valid YAML: {yaml_problem(err)}") from None
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise RunConfigError(f"{path} must hold a mapping of {', '.join(RUN_KEYS)}; it holds a {type(config).__name__}")
    return run_options_with_overrides(config, overrides, str(path))


def yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error in one line: what is wrong, and where (line and column, from 1)."""
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    mark = getattr(error, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def resolve_with_overrides(config: dict, overrides, source: str) -> dict:
    """``config`` (changed in place) with the ``--set`` ``overrides`` applied, checked and
    resolved; errors name ``source``."""
    return run_options_with_overrides(config, overrides, source).config()


def run_options_with_overrides(config: dict, overrides, source: str) -> "RunOptions":
    """The checked options of ``config`` (changed in place) with the ``--set`` ``overrides``
    applied; errors name ``source`` and, when there are any, the overrides (the mistake may
    be in either)."""
    for assignment in overrides:
        apply_override(config, assignment)
    if overrides:
        source = f"{source} with {' '.join(f'--set {assignment}' for assignment in overrides)}"
    return checked_run_options(config, source)


def apply_override(config: dict, assignment: str) -> None:
    """Apply one ``--set dotted.key=value`` to ``config`` in place."""
    dotted, equals, text = assignment.partition("=")
    keys = dotted.strip().split(".")
    if not equals or not all(keys):
        raise RunConfigError(f"--set {assignment!r}: write it as key=value, e.g. args.epochs=5")
    if keys[0] not in RUN_KEYS:
        raise RunConfigError(f"--set {assignment!r}: unknown key {keys[0]!r}; the keys are {', '.join(RUN_KEYS)}")
    try:
        value = load_yaml(text)
    except yaml.YAMLError as err:
        raise RunConfigError(f"--set {assignment!r}: the value is not valid YAML ({yaml_problem(err)})") from None
    target = config
    for depth, key in enumerate(keys[:-1]):
        target = target.setdefault(key, {})
        if not isinstance(target, dict):
            raise RunConfigError(f"--set {assignment!r}: {'.'.join(keys[: depth + 1])} is not a mapping")
    target[keys[-1]] = value


def checked_run_options(config: dict, source: str) -> "RunOptions":
    """Every key and value of ``config`` (read from ``source``) checked, once."""
    unknown = sorted(set(config) - set(RUN_KEYS))
    if unknown:
        raise RunConfigError(f"{source}: unknown key(s) {unknown}; the keys are {', '.join(RUN_KEYS)}")
    missing = [key for key in REQUIRED_KEYS if config.get(key) in (None, "")]
    if missing:
        raise RunConfigError(f"{source}: {' and '.join(missing)} must be given")
    for key in ("split_config", "args"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise RunConfigError(f"{source}: {key} must be a mapping, got {config[key]!r}")
    try:
        run = RunOptions.checked(
            config["pert_data_path"],
            config["dataset_name"],
            config.get("split_config"),
            config.get("args"),
            config.get("n_gpus"),
            config.get("gpu_ids"),
            config.get("replicates"),
        )
    except (ValueError, FileNotFoundError) as err:
        raise RunConfigError(f"{source}: {err}") from None
    return run


@dataclass(frozen=True)
class RunOptions:
    """A run's options, read and checked once where they come in (a Python call, a
    configuration file): the data, the split, ``args`` (the training, model and launch
    options), the device request and the replicates. Everything below takes them as they
    are and checks nothing again."""

    pert_data_path: str
    dataset_name: str
    split: SplitConfig
    args: TrainingArgs
    n_gpus: int | None = None
    gpu_ids: list[int] | None = None
    replicates: ReplicateOptions | None = None

    @classmethod
    def checked(
        cls,
        pert_data_path,
        dataset_name: str,
        split_config: dict | None,
        args: dict | None,
        n_gpus: int | None = None,
        gpu_ids=None,
        replicates: dict | None = None,
    ) -> "RunOptions":
        """The options of ``train_multi_gpu``'s parameters (and ``train_replicates``'
        ``replicates``), each checked here once; a ValueError names the first bad one."""
        split, checked_args = SplitConfig.from_dict(split_config), TrainingArgs.from_dict(args)
        plan = None if replicates is None else ReplicateOptions.from_dict(replicates)
        if plan is not None:
            check_replicated_run(split, checked_args, plan)
        check_device_request(n_gpus, gpu_ids, checked_args.cpu_processes)
        return cls(
            str(pert_data_path),
            str(dataset_name),
            split,
            checked_args,
            n_gpus,
            None if gpu_ids is None else [int(i) for i in gpu_ids],
            plan,
        )

    def config(self) -> dict:
        """The configuration with every default filled in (``resolved_config``)."""
        return resolved_config(
            self.pert_data_path, self.dataset_name, self.split, self.args, self.n_gpus, self.gpu_ids, self.replicates
        )


def resolved_config(
    pert_data_path: str,
    dataset_name: str,
    split: SplitConfig,
    args: TrainingArgs,
    n_gpus: int | None = None,
    gpu_ids: list[int] | None = None,
    replicates: ReplicateOptions | None = None,
) -> dict:
    """The configuration with every default filled in: what the run folder keeps. A single
    run's has no ``replicates`` key; ``overwrite_save_path`` is kept false (the folder's
    ``config.yaml`` repeats the run into its own folder, which it must never replace
    unasked)."""
    values = {**args.as_dict(), "overwrite_save_path": False}
    config = {
        "pert_data_path": pert_data_path,
        "dataset_name": dataset_name,
        "split_config": {**SPLIT_DEFAULTS, **split.options},
        "args": values,
        "n_gpus": n_gpus,
        "gpu_ids": None if gpu_ids is None else [int(i) for i in gpu_ids],
    }
    if replicates is not None:
        config["replicates"] = replicates.as_dict()
    return config


def write_run_config(folder, config: dict) -> Path:
    """Write ``config`` as ``folder/config.yaml`` (atomically)."""
    path = Path(folder) / CONFIG_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_yaml(config, path)
    return path


def option_sections(with_train_defaults: bool = True) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """Every option of a run, from the options' own definitions: (title, key prefix, [(name,
    default, meaning)]) for the top-level keys, ``args``, ``args.model_config``,
    ``split_config`` and ``replicates``. ``with_train_defaults``: an ``args`` default also says where
    ``GEARS.train``'s differs, or that ``GEARS.train`` does not take it. ``gears-ddp train
    --help`` and docs/options.md are written from it."""
    in_train = TrainingOptions.defaults()
    args = []
    for name, value in TrainingArgs.defaults().items():
        default = repr(value)
        if with_train_defaults and name not in in_train:
            default += " (args only)"
        elif with_train_defaults and in_train[name] != value:
            default += f" (GEARS.train: {in_train[name]!r})"
        args.append((name, default, TrainingArgs.help()[name]))
    return [
        (
            "Top-level keys (train_multi_gpu's parameters, and train_replicates' replicates)",
            "",
            [
                (name, "required" if name in REQUIRED_KEYS else "None", RUN_KEY_HELP[name])
                for name in RUN_KEYS
                if name not in ("split_config", "args")
            ],
        ),
        ("args (GEARS.train's keyword arguments, but those marked args only)", "args.", args),
        (
            "args.model_config (GEARS.model_initialize)",
            "args.model_config.",
            [(name, repr(value), ModelOptions.help()[name]) for name, value in ModelOptions.defaults().items()],
        ),
        (
            "split_config (PertData.prepare_split)",
            "split_config.",
            [(name, repr(value), SPLIT_OPTION_HELP[name]) for name, value in SPLIT_DEFAULTS.items()],
        ),
        (
            "replicates (train_replicates)",
            "replicates.",
            [(name, repr(value), ReplicateOptions.help()[name]) for name, value in ReplicateOptions.defaults().items()],
        ),
    ]


def option_help() -> str:
    """Every option with its default and meaning, for ``gears-ddp train --help``."""
    lines = []
    for title, prefix, rows in option_sections(with_train_defaults=False):
        lines.append(f"{title}, defaults in brackets:")
        lines += [f"  {prefix}{name} [{default}]: {meaning}" for name, default, meaning in rows]
    return "\n".join(lines)


def option_reference() -> str:
    """The text of docs/options.md: every option, a Markdown table per section."""
    lines = [
        "# Options",
        "",
        "<!-- Written from the options' own definitions by `python tests/test_docs.py "
        "--write`; the test suite checks that it is current. -->",
        "",
        "A configuration file (`gears-ddp train --config run.yaml`) has the top-level keys below, which "
        "are `train_multi_gpu`'s parameters, and `replicates` (`train_replicates`, see "
        "[replicates](replicates.md)). `GEARS.train` takes the `args` options as keyword "
        "arguments, but those marked *args only*; where its default differs, the table says so (its "
        "loader options default to what `get_dataloader` was given, and it saves nothing without a "
        "`save_path`). `gears-ddp train --help` prints the same list.",
    ]
    for title, prefix, rows in option_sections():
        lines += ["", f"## {title}", "", "| option | default | meaning |", "|---|---|---|"]
        lines += [
            f"| `{prefix}{name}` | `{default}` | {meaning.replace('|', '/')} |" for name, default, meaning in rows
        ]
    return "\n".join(lines) + "\n"
