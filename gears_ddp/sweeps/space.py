"""A sweep's search space: which run options a trial draws, and from what.

Written in YAML as the run file nests its options, one entry per option under ``args`` or
``args.model_config``::

    args:
      lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}
      batch_size: {type: categorical, choices: [16, 32, 64]}
      model_config:
        hidden_size: {type: int, low: 32, high: 128, log: true}

``float`` and ``int`` take ``low``, ``high`` and ``log`` (a log scale: both ends above 0);
``categorical`` takes ``choices``. Every entry is checked before any trial starts, each
mistake named by its key: an option the run does not have (or one that places the run
rather than shapes it: ``PLACEMENT_OPTIONS``), a range with ``low >= high``, a log range
through 0, a categorical without choices, and any value at the ends of a range or among the
choices that the run's own checks refuse.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from gears_ddp._options import is_int, is_number
from gears_ddp.configuration.sections import TrainingArgs
from gears_ddp.model.model_options import ModelOptions

TYPES = ("float", "int", "categorical")
# where in a float range the value checked besides its ends lies: a fraction whose multiples of
# whole numbers are never whole, so that a range of an integer option is caught
INSIDE_A_RANGE = 0.3819660112501051  # 2 - the golden ratio
# options that say where and how a trial runs, which the sweep sets itself, not what it computes
PLACEMENT_OPTIONS = (
    "save_path",
    "resume_from",
    "overwrite_save_path",
    "cpu_processes",
    "cpu_threads",
    "timeout_s",
    "checkpoint_every",
    "checkpoint_every_steps",
    "keep_checkpoints",
    "wandb",
)


class SearchSpaceError(ValueError):
    """A search space that cannot be used; the message names the key."""


@dataclass(frozen=True)
class Dimension:
    """One option a trial draws: its dotted key in the run file (``args.lr``,
    ``args.model_config.hidden_size``), its type and its range or choices."""

    key: str
    type: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple | None = None

    def distribution(self):
        """The Optuna distribution trials are drawn from."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.type == "categorical":
            return CategoricalDistribution(self._choice_list())
        low, high = self._ends()
        if self.type == "float":
            return FloatDistribution(low, high, log=self.log)
        return IntDistribution(int(low), int(high), log=self.log)

    def record(self) -> dict:
        """As the sweep folder and the study keep it (plain data)."""
        if self.type == "categorical":
            return {"type": self.type, "choices": self._choice_list()}
        return {"type": self.type, "low": self.low, "high": self.high, "log": self.log}

    def edge_values(self) -> list:
        """The values the run's checks must accept: the ends of a range, or every choice; for
        a float range also a value inside it that is no whole number (whole ends pass an
        option that takes integers, the values drawn between them would not)."""
        if self.type == "categorical":
            return self._choice_list()
        low, high = self._ends()
        inside = [low + (high - low) * INSIDE_A_RANGE] if self.type == "float" else []
        return [low, high, *inside]

    def _choice_list(self) -> list:
        """A categorical dimension's choices."""
        if self.choices is None:
            raise ValueError(f"the categorical dimension {self.key} has no choices")
        return list(self.choices)

    def _ends(self) -> tuple[float | int, float | int]:
        """A range's low and high ends."""
        if self.low is None or self.high is None:
            raise ValueError(f"the {self.type} dimension {self.key} has no low and high ends")
        return self.low, self.high


@dataclass(frozen=True)
class SearchSpace:
    """The dimensions of a sweep, in the order the YAML gives them."""

    dimensions: tuple[Dimension, ...]

    @classmethod
    def from_mapping(cls, space, source: str = "the search space") -> "SearchSpace":
        """The checked space of a YAML mapping (``args: {...}``)."""
        if not isinstance(space, dict) or set(space) != {"args"} or not isinstance(space["args"], dict):
            raise SearchSpaceError(
                f"{source} must be a mapping with one key, args (its options as the run file "
                "nests them: args.lr, args.model_config.hidden_size)"
            )
        dimensions = []
        for key, spec in space["args"].items():
            if key == "model_config":
                if not isinstance(spec, dict) or not spec:
                    raise SearchSpaceError(f"{source}: args.model_config must map model options to their ranges")
                dimensions += [_dimension(f"args.model_config.{name}", value, source) for name, value in spec.items()]
            else:
                dimensions.append(_dimension(f"args.{key}", spec, source))
        if not dimensions:
            raise SearchSpaceError(f"{source}: no option to search; give at least one under args")
        return cls(tuple(dimensions))

    def record(self) -> dict:
        """The space as plain data, keyed by dotted option (what a sweep folder is made by)."""
        return {dimension.key: dimension.record() for dimension in self.dimensions}

    def distributions(self) -> dict:
        """Optuna's distributions, keyed by dotted option."""
        return {dimension.key: dimension.distribution() for dimension in self.dimensions}

    def check_against(self, config: dict, check) -> None:
        """Refuse any end of a range or choice that ``check(config)`` (the run's own checks)
        refuses in ``config``, naming the key and the value; a refused true or false says
        to quote the choices (``off`` unquoted is YAML's false, not the string amp takes)."""
        for dimension in self.dimensions:
            for value in dimension.edge_values():
                try:
                    check(with_values(config, {dimension.key: value}))
                except ValueError as err:
                    hint = (
                        " (YAML reads an unquoted off or no as false, on or yes as true: quote the "
                        "choices, as in choices: ['off', 'fp16'])"
                        if isinstance(value, bool)
                        else " (a value drawn inside the float range: for whole numbers give it type: int)"
                        if dimension.type == "float" and value not in (dimension.low, dimension.high)
                        else ""
                    )
                    raise SearchSpaceError(f"{dimension.key}={value!r} of the search space: {err}{hint}") from None


def with_values(config: dict, values: dict) -> dict:
    """A copy of the run file ``config`` with each dotted key of ``values`` set."""
    config = copy.deepcopy(config)
    for key, value in values.items():
        target = config
        *parents, last = key.split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
        target[last] = value
    return config


def _dimension(key: str, spec, source: str) -> Dimension:
    """One entry checked: its option exists and may be searched, its type, range or choices."""
    name = key.split(".")[-1]
    known = ModelOptions.names() if key.startswith("args.model_config.") else TrainingArgs.names()
    if name not in known or name == "model_config":
        where = "args.model_config" if key.startswith("args.model_config.") else "args"
        raise SearchSpaceError(
            f"{source}: {key} is not an option of the run; the options of {where} are "
            f"{', '.join(sorted(set(known) - {'model_config'}))}"
        )
    if name in PLACEMENT_OPTIONS and not key.startswith("args.model_config."):
        raise SearchSpaceError(
            f"{source}: {key} says where or how a trial runs, which the sweep sets itself; "
            "search options that shape the model and its training"
        )
    if not isinstance(spec, dict) or spec.get("type") not in TYPES:
        raise SearchSpaceError(f"{source}: {key} must be a mapping with type {' or '.join(TYPES)}, got {spec!r}")
    kind = spec["type"]
    allowed = {"type", "choices"} if kind == "categorical" else {"type", "low", "high", "log"}
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise SearchSpaceError(f"{source}: {key} ({kind}) takes {', '.join(sorted(allowed))}; not {unknown}")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise SearchSpaceError(f"{source}: {key} is categorical with no choices; give choices: [...]")
        if not all(choice is None or isinstance(choice, (bool, int, float, str)) for choice in choices):
            raise SearchSpaceError(f"{source}: {key}'s choices must be numbers, strings, true/false or null")
        return Dimension(key, kind, choices=tuple(choices))
    low: Any = spec.get("low")  # as the file gives them: checked below
    high: Any = spec.get("high")
    log = spec.get("log", False)
    number = is_int if kind == "int" else is_number
    for end, value in (("low", low), ("high", high)):
        if not number(value):
            raise SearchSpaceError(
                f"{source}: {key}.{end} must be {'an integer' if kind == 'int' else 'a number'}, got {value!r}"
            )
    if not isinstance(log, bool):
        raise SearchSpaceError(f"{source}: {key}.log must be true or false, got {log!r}")
    if low >= high:
        raise SearchSpaceError(f"{source}: {key} has low {low} >= high {high}; give a range with low below high")
    if log and low <= 0:
        raise SearchSpaceError(
            f"{source}: {key} is on a log scale but its range reaches {low}: a log range must lie above 0"
        )
    return Dimension(key, kind, low, high, log)
