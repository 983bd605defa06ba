"""``train_multi_gpu``'s options, validated before any process starts.

``train_multi_gpu(..., split_config, args)`` takes plain dicts. ``SplitConfig.from_dict``
and ``TrainingArgs.from_dict`` turn them into checked dataclasses, so a misspelt key or a
bad value fails at once with a message naming it, not after a minute of spawning processes.
``args`` holds every ``GEARS.train`` option under the same name (``training_options.TrainingOptions``),
the model options (``model_config``) and the options of the launch itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from gears_ddp._options import Options, is_int, option, reject_unknown
from gears_ddp.data.expression_map import DTYPES
from gears_ddp.data.pertdata import SPLIT_DEFAULTS, SPLIT_OPTIONS, STORAGES
from gears_ddp.data.splits import SPLIT_FRACTIONS, split_option_problems
from gears_ddp.model.model_options import ModelOptions
from gears_ddp.training.training_options import TrainingOptions

PERT_DATA_OPTIONS = ("expression_storage", "expression_dtype", "default_pert_graph")  # args given to PertData
# the defaults of GEARS.train's options that args changes: the loaders are built with them, the model saved there
ARGS_DEFAULTS = {
    "seed": 0,
    "batch_size": 32,
    "num_workers": 0,
    "resample_controls": False,
    "save_path": "./runs/gears_ddp",
}


@dataclass
class SplitConfig:
    """``PertData.prepare_split`` options (``split``, ``seed``, ``train_gene_set_size``, ...)."""

    options: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, split_config: dict | None) -> "SplitConfig":
        """The options, their names and the split's type, seed and fractions checked here,
        before any data is read (the split's sets are checked on the data)."""
        split_config = dict(split_config or {})
        reject_unknown(split_config, SPLIT_OPTIONS, "split_config")
        request = {**SPLIT_DEFAULTS, **split_config}
        fractions = {name: request[name] for name in SPLIT_FRACTIONS}
        problems = split_option_problems(request["split"], request["seed"], **fractions)
        if problems:
            raise ValueError(f"split_config: {'; '.join(problem.text for problem in problems)}")
        return cls(split_config)


@dataclass
class TrainingArgs(TrainingOptions):
    """Everything ``args`` may hold; see docs/options.md.

    The options ``GEARS.train`` takes are declared once, in ``TrainingOptions``; ``args``
    gives some of them other defaults (``ARGS_DEFAULTS``): the loader options get values
    (``train_multi_gpu`` builds the loaders), and the model goes to ``save_path`` unless it
    is set to None.
    """

    model_config: dict = option({}, "GEARS.model_initialize's options (hidden_size, uncertainty, ...)")
    expression_storage: str = option(
        "mapped",
        "'mapped': one file per dataset that every process maps (one copy per "
        "machine in the page cache); 'memory': each process holds the "
        "expression",
    )
    expression_dtype: str = option("float32", "'float32' or 'float16' (halves the map) expression storage")
    default_pert_graph: bool = option(
        True,
        "the perturbations a model knows and its GO graph: True, every gene of "
        "the GO files (the published GEARS's default); False, the dataset's "
        "genes and its perturbed genes, with the GO graph among them (the "
        "published PertData's default_pert_graph=False)",
    )
    cpu_processes: int | None = option(None, "this many gloo processes on CPU instead of GPUs")
    cpu_threads: int | None = option(
        None,
        "torch threads of each CPU rank (None: the usable cores shared evenly among the ranks "
        "training on the machine at once, or OMP_NUM_THREADS when set); a CPU's sums add up in "
        "an order that follows it, and so do the run's figures: a CPU run's config.yaml records "
        "the count its ranks used, so that it repeats the run bit for bit",
    )
    timeout_s: float = option(600.0, "how long ranks wait for each other (s)")
    find_unused_parameters: bool = option(
        False,
        "accepted for configurations written for DistributedDataParallel; "
        "nothing to find: a step averages every parameter's gradient in "
        "one buffer, counting one a rank did not reach as zeros",
    )

    @classmethod
    def defaults(cls) -> dict:
        return {**super().defaults(), **ARGS_DEFAULTS}

    @classmethod
    def from_dict(cls, values: dict | None, where: str = "args") -> "TrainingArgs":
        return super().from_dict({**ARGS_DEFAULTS, **(values or {})}, where)

    def check(self, where: str) -> None:
        super().check(where)
        for key in ("seed", "batch_size", "num_workers", "resample_controls"):
            if getattr(self, key) is None:
                raise ValueError(f"args['{key}'] must be set, got None")
        if self.model_config is not None and not isinstance(self.model_config, dict):
            raise ValueError(
                f"args['model_config'] must be a dict of GEARS.model_initialize options, got {self.model_config!r}"
            )
        ModelOptions.from_dict(self.model_config, "args['model_config']")
        for key, allowed in (("expression_storage", STORAGES), ("expression_dtype", tuple(DTYPES))):
            if getattr(self, key) not in allowed:
                raise ValueError(f"args['{key}'] must be one of {allowed}, got {getattr(self, key)!r}")
        if (
            not isinstance(self.timeout_s, (int, float))
            or isinstance(self.timeout_s, bool)
            or not self.timeout_s > 0
            or self.timeout_s == float("inf")
        ):
            raise ValueError(f"args['timeout_s'] must be a positive number, got {self.timeout_s!r}")
        if self.cpu_threads is not None and not (is_int(self.cpu_threads) and self.cpu_threads >= 1):
            raise ValueError(f"args['cpu_threads'] must be a positive integer or None, got {self.cpu_threads!r}")
        if not isinstance(self.default_pert_graph, bool):
            raise ValueError(f"args['default_pert_graph'] must be True or False, got {self.default_pert_graph!r}")
        if not isinstance(self.find_unused_parameters, bool):
            raise ValueError(
                f"args['find_unused_parameters'] must be True or False, got {self.find_unused_parameters!r}"
            )

    def normalized(self) -> "TrainingArgs":
        """``model_config`` with every model option filled in (checked by ``check``)."""
        args = super().normalized()
        return dataclasses.replace(args, model_config=ModelOptions(**(args.model_config or {})).as_dict())

    def model_options(self) -> ModelOptions:
        """``model_config`` as the model's options, checked when these options were."""
        return ModelOptions(**self.model_config)

    def pert_data_options(self) -> dict:
        """The options of ``PertData`` that ``args`` holds (``PERT_DATA_OPTIONS``)."""
        return {key: getattr(self, key) for key in PERT_DATA_OPTIONS}


@dataclass
class ReplicateOptions(Options):
    """What a ``replicates`` key (``train_replicates``' ``replicates``) may hold: the seeds
    that make the replicates and how they share the devices."""

    seeds: list | None = option(
        None, "model seeds (args.seed: initial weights, shuffling, control pairing); one replicate per seed"
    )
    split_seeds: list | None = option(
        None,
        "split seeds (split_config.seed); given with seeds, the lists pair up: "
        "replicate i uses split_seeds[i] and seeds[i]",
    )
    ranks_per_replicate: int = option(1, "devices (DDP ranks) each replicate trains on")
    parallel: int | None = option(
        None,
        "replicates training at once (None: as many groups of ranks_per_replicate devices as the devices given make)",
    )

    @classmethod
    def from_dict(cls, values: dict | None, where: str = "replicates") -> "ReplicateOptions":
        if not isinstance(values, dict):
            raise ValueError(f"replicates must be a mapping such as {{seeds: [1, 2, 3]}}, got {values!r}")
        return super().from_dict(values, where)

    def check(self, where: str = "replicates") -> None:
        """Raise a ValueError naming the first bad value."""
        if self.seeds is None and self.split_seeds is None:
            raise ValueError("replicates needs seeds and/or split_seeds, e.g. {seeds: [1, 2, 3]}")
        for key in ("seeds", "split_seeds"):
            values = getattr(self, key)
            if values is None:
                continue
            if not isinstance(values, (list, tuple)) or not values:
                raise ValueError(f"replicates.{key} must be a non-empty list of seeds, got {values!r}")
            bad = [value for value in values if not (is_int(value) and value >= 0)]
            if bad:
                raise ValueError(f"replicates.{key} must hold non-negative integers; {bad} are not")
            repeated = sorted({value for value in values if list(values).count(value) > 1})
            if repeated:
                raise ValueError(
                    f"replicates.{key} {list(values)} lists {repeated} more than once: each seed makes one replicate"
                )
        if self.seeds is not None and self.split_seeds is not None and len(self.seeds) != len(self.split_seeds):
            raise ValueError(
                f"replicates.seeds ({len(self.seeds)}) and replicates.split_seeds "
                f"({len(self.split_seeds)}) pair up, one replicate per pair: give lists of equal length"
            )
        for key in ("ranks_per_replicate", "parallel"):
            value = getattr(self, key)
            if (value is not None or key == "ranks_per_replicate") and not (is_int(value) and value >= 1):
                raise ValueError(f"replicates.{key} must be a positive integer, got {value!r}")

    def normalized(self) -> "ReplicateOptions":
        """The seeds as lists."""
        return dataclasses.replace(
            self,
            seeds=None if self.seeds is None else list(self.seeds),
            split_seeds=None if self.split_seeds is None else list(self.split_seeds),
        )


def check_replicated_run(split: SplitConfig, args: TrainingArgs, replicates: ReplicateOptions) -> None:
    """What replicates refuse of the other options (a ValueError naming them): each replicate
    writes its own run folder under ``save_path`` and continues from there."""
    if args.save_path is None:
        raise ValueError("replicates need args['save_path']: each replicate writes its run folder under it")
    if args.resume_from not in (None, "auto"):
        raise ValueError(
            f"args['resume_from']={args.resume_from!r} names one run's checkpoint, but each replicate "
            "continues from its own folder: leave resume_from out (running the same command again "
            "continues every unfinished replicate)"
        )
    if args.overwrite_save_path:
        raise ValueError(
            "args['overwrite_save_path'] with replicates: running the same command again continues the "
            "unfinished replicates and keeps the finished ones; to train them anew, give another "
            "save_path"
        )
    if replicates.split_seeds is not None and split.options.get("split_dict_path") is not None:
        raise ValueError(
            "replicates.split_seeds with split_config.split_dict_path: the split is read from that file, "
            "so every split seed would give the same split"
        )
