"""The pattern every set of options follows (model, training, replicates): a dataclass whose
fields carry their default and a one-line help, built from a plain dict with unknown keys
refused, and checked as a whole, so that a signature, the checks, a saved configuration,
the command's help and docs/options.md all come from one definition.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import Field, asdict, field, fields
from typing import Any, ClassVar, TypeVar

Checked = TypeVar("Checked", bound="Options")


def option(default, help: str):
    """A dataclass field with its one-line help (``gears-ddp train --help`` lists them); a
    dict default is copied for each instance."""
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def option_default(item):
    """The default value of a dataclass field made by ``option``."""
    return item.default_factory() if callable(item.default_factory) else item.default


class Options:
    """Base of an options dataclass: ``from_dict`` builds it checked, ``check`` raises a
    ValueError naming the first bad option as the caller wrote it (``where``) and never
    changes the options; ``checked`` returns them checked, in the plain form the package
    takes inside (``normalized``), as a new object."""

    # declared (never set here) so that the type checker knows every subclass is a dataclass
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @classmethod
    def names(cls) -> list[str]:
        return [item.name for item in fields(cls)]

    @classmethod
    def defaults(cls) -> dict:
        return {item.name: option_default(item) for item in fields(cls)}

    @classmethod
    def help(cls) -> dict[str, str]:
        return {item.name: item.metadata.get("help", "") for item in fields(cls)}

    @classmethod
    def from_dict(cls, values: dict | None, where: str):
        """Checked options from a dict; unknown keys and bad values are named as ``where``
        spells them (``args['lr']``, ``train(lr=...)``)."""
        values = dict(values or {})
        reject_unknown(values, cls.names(), where)
        return cls(**values).checked(where)

    def checked(self: Checked, where: str) -> Checked:
        """These options checked once (``check``) and ``normalized``: a new object, this one
        unchanged."""
        self.check(where)
        return self.normalized()

    def check(self, where: str) -> None:
        """Raise a ValueError naming the first bad option; never changes the options."""

    def normalized(self: Checked) -> Checked:
        """The options, checked before, in the form the package takes inside (lists, plain
        strings, nested options filled in): a new object, or this one where nothing changes."""
        return self

    def as_dict(self) -> dict:
        return asdict(self)


# the dicts whose keys are options (``args['model_config']`` too); any other ``where`` is a function
OPTION_DICTS = ("args", "split_config", "replicates")


def names_a_dict(where: str) -> bool:
    """Whether ``where`` is a dict of options (else a function taking them as keywords)."""
    return where in OPTION_DICTS or where.endswith("]")


def option_name(where: str, key: str) -> str:
    """How the caller wrote option ``key``: ``args['key']`` for a dict, ``train(key=...)``
    for a function's keyword argument."""
    return f"{where}['{key}']" if names_a_dict(where) else f"{where}({key}=...)"


def reject_unknown(given: dict, known, where: str) -> None:
    """An error naming the keys of ``given`` that are not in ``known``: a ValueError for a
    dict's keys, a TypeError (as Python raises it) for a function's keyword arguments."""
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    if names_a_dict(where):
        raise ValueError(f"unknown {where} key(s) {unknown}; known keys: {sorted(known)}")
    raise TypeError(f"{where}() got unknown keyword argument(s) {unknown}; it takes {sorted(known)}")


def is_int(value) -> bool:
    """True for real integers (``bool`` excluded, since ``True`` as a count is a mistake)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """True for finite ints and floats (``bool`` excluded)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def signature_with(function, options: type[Options]) -> inspect.Signature:
    """``function``'s signature with its ``**options`` replaced by the keyword parameters of
    ``options`` and their defaults, so that ``help()`` and editors show the options that
    the function checks with ``Options.from_dict``."""
    signature = inspect.signature(function)
    kept = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    named = [
        inspect.Parameter(item.name, inspect.Parameter.KEYWORD_ONLY, default=option_default(item), annotation=item.type)
        for item in fields(options)
    ]
    return signature.replace(parameters=kept + named)
