"""What is wrong with a screen, said whole: ``Problem``, ``ScreenReport`` and ``ScreenProblems``.

Each check of a screen (its columns, conditions, genes, GO terms, cells, expression, splits)
says what it finds as ``Problem``s rather than raising at the first, so that a screen with
five things wrong is refused once, naming all five. A problem's text names what is wrong
(the file, column, gene or key), then, after a semicolon, what to do about it. A problem
either stops the screen (``stops``: processing or training it would fail, or would do
something the user did not ask for) or is a warning (training goes on). ``refuse`` raises
the stopping ones together as one ``ScreenProblems``, a ``ValueError`` whose message is the
problem's own text when there is one, and a list when there are several.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a screen: ``topic`` (what it concerns: ``'conditions'``,
    ``'GO terms'``, ...), ``text`` (what is wrong; what to do) and whether it ``stops``
    the screen (False: a warning)."""

    topic: str
    text: str
    stops: bool = True

    def __str__(self) -> str:
        return self.text


class ScreenProblems(ValueError):
    """The problems that stop a screen, all of them at once (``problems``)."""

    def __init__(self, source: str, problems: list[Problem]):
        self.source, self.problems = source, list(problems)
        if len(self.problems) == 1:
            message = self.problems[0].text
        else:
            message = f"{source}: {len(self.problems)} problems stop it, each with its fix:\n" + "\n".join(
                f"  - {problem.topic}: {problem.text}" for problem in self.problems
            )
        super().__init__(message)


def refuse(problems: Iterable[Problem | None], source: str) -> None:
    """Raise ``ScreenProblems`` naming every problem among ``problems`` (None: nothing
    found) that stops the screen."""
    stopping = [problem for problem in problems if problem is not None and problem.stops]
    if stopping:
        raise ScreenProblems(source, stopping)


@dataclass
class ScreenReport:
    """A screen checked whole: what was found (``facts``, ``(topic, text)`` lines) and every
    ``Problem``. ``would_train`` when no problem stops it."""

    source: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def fact(self, topic: str, text: str) -> None:
        self.facts.append((topic, text))

    def add(self, problems: Iterable[Problem | None]) -> None:
        """Add the problems (None: nothing found)."""
        self.problems.extend(problem for problem in problems if problem is not None)

    @property
    def stopping(self) -> list[Problem]:
        return [problem for problem in self.problems if problem.stops]

    @property
    def warnings(self) -> list[Problem]:
        return [problem for problem in self.problems if not problem.stops]

    @property
    def would_train(self) -> bool:
        return not self.stopping

    def refuse(self) -> None:
        """Raise ``ScreenProblems`` with every stopping problem, if there is one."""
        refuse(self.problems, self.source)

    def lines(self) -> list[str]:
        """The report as text, an entry a line: the facts, the warnings, the stopping
        problems, the verdict."""
        lines = [f"{self.source}:"] + [f"  {topic}: {text}" for topic, text in self.facts]
        if self.warnings:
            lines += [f"{counted(len(self.warnings), 'warning')} (training goes on):"]
            lines += [f"  - {p.topic}: {p.text}" for p in self.warnings]
        if self.stopping:
            one = len(self.stopping) == 1
            lines += [
                f"{counted(len(self.stopping), 'problem')} that stop{'s' if one else ''} it, "
                f"{'with its fix' if one else 'each with its fix'}:"
            ]
            lines += [f"  - {p.topic}: {p.text}" for p in self.stopping]
        lines.append(
            ("it would train" + (f", with {counted(len(self.warnings), 'warning')}" if self.warnings else ""))
            if self.would_train
            else f"it would not train: {counted(len(self.stopping), 'problem')} to fix"
        )
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines())


def listed(names, limit: int = 10, separator: str = ", ") -> str:
    """Names for a one-line message: the first ``limit``, then how many more; ``separator``
    between them (``'; '`` for items that hold commas themselves)."""
    names = [str(name) for name in names]
    return separator.join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def counted(n: int, noun: str) -> str:
    """``'1 warning'``, ``'2 warnings'``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"
