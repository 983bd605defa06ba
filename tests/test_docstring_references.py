"""Every code reference written in a docstring names code that exists, and no module
docstring is an essay.

A docstring's double back-quoted dotted name (``launcher.continued_after_restart``,
``GEARS.train``, ``gears_ddp.data.io.write_yaml``, optionally ending in ``()``) is a code
reference when its first part names the package's code:

- ``gears_ddp``, or the last part of a module or package of gears_ddp (``launcher``,
  ``paired_bootstrap``, ``report``): the name must resolve in one of the modules so named,
  each further part a submodule, a module-level name, or a member of the class before it;
- a class or function defined at module level somewhere in gears_ddp (``GEARS``,
  ``PertData``, ``RunOptions``): the rest must be a member of one of them;
- a lower-case first part that is no module at all, of gears_ddp or importable, followed by
  a class or function of gears_ddp (``screen.run_pair_screen``): a module since renamed or
  removed, so it never resolves.

A class's members are its methods, class attributes, dataclass fields, attributes set in
its methods as ``self.x``, and those of its base classes (read with ``ast``); a member the
source does not show (made at import, a base class from another library) is looked up on
the imported module as a last resort. A module-level name is one the module binds: a
definition, an assignment or an import.

Only double back-quoted dotted names are checked: a bare ``name`` may be a word, a
parameter or a command as well as a module.

Everything else is not a code reference: another library's names (``torch.compile``,
``np.ndarray``), a variable's attributes (``adata.obs``), a report's keys. Three kinds of
name can begin with a module's name and are not code unless they resolve as code:

- a run's option key, or a prefix of one (``replicates.seeds``, ``args.model_config``:
  ``replicates`` is also a module): the keys are read from the option tables that
  ``gears-ddp train --help`` and docs/options.md are written from (``option_sections``), so
  a new option needs no change here;
- a string the package's code spells whole, such as the name of a file it writes
  (``config.yaml``, ``report.json``, ``model.pt``: ``config``, ``report`` and ``model`` are
  modules too);
- a name whose first part is in ``OTHER_PACKAGES`` (never code): the few first parts that
  mean another package (the published GEARS's ``gears.inference``), each with its reason.

A variable's attribute whose variable is named like a module (``options.save_path`` for a
``TrainingOptions``) reads as a reference too, and fails: write the class
(``TrainingOptions.save_path``), which the test can check.

python tests/test_docstring_references.py     # list every broken reference
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "gears_ddp"

# A dotted name between double back-quotes, optionally called: ``a.b``, ``a.b.c()``.
REFERENCE = re.compile(r"``([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?``")

# The longest a module docstring may be, in lines: what the module is and why, with the long
# explanations in docs/.
MODULE_DOCSTRING_LINES = 30

# First parts that name another package, not the module of gears_ddp with that last part.
OTHER_PACKAGES = {
    "gears": "the published GEARS package that gears_ddp reimplements (gears.inference, gears.utils); "
    "gears_ddp's own module is gears_ddp.gears",
}

# Temporary: modules being rewritten or moved elsewhere, whose docstrings that work fixes.
# Emptied when it is merged; nothing else belongs here.
OWNED_ELSEWHERE: set[str] = set()


@dataclass
class ClassInfo:
    module: str
    members: set[str] = field(default_factory=set)
    bases: list[str] = field(default_factory=list)


@dataclass
class ModuleInfo:
    name: str
    path: Path  # as shown: from the folder that holds the package
    tree: ast.Module
    names: set[str] = field(default_factory=set)
    classes: dict[str, ClassInfo] = field(default_factory=dict)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def target_names(target) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for item in target.elts for name in target_names(item)]
    if isinstance(target, ast.Starred):
        return target_names(target.value)
    return []


def assigned_names(statement) -> list[str]:
    """The names a module- or class-level statement binds."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [statement.name]
    if isinstance(statement, ast.Assign):
        return [name for target in statement.targets for name in target_names(target)]
    if isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        return target_names(statement.target)
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return [(alias.asname or alias.name).split(".")[0] for alias in statement.names]
    if isinstance(statement, (ast.If, ast.Try, ast.With)):
        inner = [*statement.body, *getattr(statement, "orelse", []), *getattr(statement, "finalbody", [])]
        inner += [item for handler in getattr(statement, "handlers", []) for item in handler.body]
        return [name for item in inner for name in assigned_names(item)]
    return []


def class_info(node: ast.ClassDef, module: str) -> ClassInfo:
    info = ClassInfo(module, bases=[ast.unparse(base).split(".")[-1] for base in node.bases])
    for statement in node.body:
        info.members.update(assigned_names(statement))
    for item in ast.walk(node):
        targets = []
        if isinstance(item, ast.Assign):
            targets = item.targets
        elif isinstance(item, (ast.AnnAssign, ast.AugAssign)):
            targets = [item.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                info.members.add(target.attr)
    return info


def read_package(root: Path = PACKAGE) -> dict[str, ModuleInfo]:
    modules = {}
    for path in sorted(root.rglob("*.py")):
        name = module_name(path, root)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        info = ModuleInfo(name, path.relative_to(root.parent), tree)
        for statement in tree.body:
            info.names.update(assigned_names(statement))
            if isinstance(statement, ast.ClassDef):
                info.classes[statement.name] = class_info(statement, name)
        modules[name] = info
    return modules


def option_keys() -> set[str]:
    """Every option key of a run (``args.epochs``, ``replicates.seeds``) and every prefix of
    one (``args.model_config``), from the option tables in whichever module defines
    ``option_sections``."""
    defining = [
        info.name
        for info in read_package().values()
        if any(isinstance(item, ast.FunctionDef) and item.name == "option_sections" for item in info.tree.body)
    ]
    assert len(defining) == 1, f"option_sections is defined in {defining}, not in exactly one module"
    sections = importlib.import_module(defining[0]).option_sections()
    keys = set()
    for _, prefix, rows in sections:
        for name, _, _ in rows:
            parts = f"{prefix}{name}".split(".")
            keys.update(".".join(parts[:end]) for end in range(2, len(parts) + 1))
    return keys


class Package:
    """What a reference can name: the modules of a package, by full name and by last part,
    and its module-level classes and functions."""

    def __init__(self, modules: dict[str, ModuleInfo], options: set[str] = frozenset()):
        self.modules = modules
        self.options = set(options)
        self.strings = {
            node.value
            for info in modules.values()
            for node in ast.walk(info.tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        }
        self.root = min(modules, key=len)
        self.by_last_part: dict[str, list[str]] = {}
        for name in modules:
            self.by_last_part.setdefault(name.split(".")[-1], []).append(name)
        self.definitions: dict[str, list[str]] = {}
        for info in modules.values():
            for statement in info.tree.body:
                if isinstance(statement, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.definitions.setdefault(statement.name, []).append(info.name)

    def starts(self, reference: str) -> list[tuple[str, list[str]]]:
        """(module, remaining parts) for each way the reference can begin with the package's
        code; empty when it is not a code reference."""
        parts = reference.split(".")
        if parts[0] in OTHER_PACKAGES:
            return []
        if parts[0] == self.root:
            longest = max((end for end in range(1, len(parts) + 1) if ".".join(parts[:end]) in self.modules), default=1)
            return [(".".join(parts[:longest]), parts[longest:])]
        if parts[0] in self.by_last_part:
            return [(module, parts[1:]) for module in self.by_last_part[parts[0]]]
        if parts[0] in self.definitions:
            return [(module, parts) for module in self.definitions[parts[0]]]
        if parts[0][0].islower() and parts[1] in self.definitions and importlib.util.find_spec(parts[0]) is None:
            return [(None, parts)]  # a module gears_ddp does not have
        return []

    def class_members(self, module: str, name: str, seen=()) -> set[str] | None:
        info = self.modules[module].classes.get(name)
        if info is None:
            return None
        members = set(info.members)
        for base in info.bases:
            for where in self.definitions.get(base, []):
                if (where, base) not in seen:
                    members |= self.class_members(where, base, (*seen, (where, base))) or set()
        return members

    def resolves_in(self, module: str | None, parts: list[str]) -> bool:
        if module is None:
            return False
        while parts and f"{module}.{parts[0]}" in self.modules:
            module, parts = f"{module}.{parts[0]}", parts[1:]
        if not parts:
            return True
        if parts[0] not in self.modules[module].names:
            return False
        if len(parts) == 1:
            return True
        members = self.class_members(module, parts[0])
        if members is not None and parts[1] in members and len(parts) == 2:
            return True
        return self.imported_attribute(module, parts)

    def imported_attribute(self, module: str, parts: list[str]) -> bool:
        """The last resort: the name on the imported module (a member made at import)."""
        try:
            value = importlib.import_module(module)
        except ImportError:
            return False
        for part in parts:
            if not hasattr(value, part):
                return False
            value = getattr(value, part)
        return True

    def resolves(self, reference: str) -> bool:
        return any(self.resolves_in(module, rest) for module, rest in self.starts(reference))

    def is_reference(self, reference: str) -> bool:
        """Whether the name is a code reference: it begins with the package's code, and it
        names code, or it is neither an option key nor a string the code spells."""
        if not self.starts(reference):
            return False
        return self.resolves(reference) or not (reference in self.options or reference in self.strings)


def docstrings(tree: ast.Module):
    """(line, docstring) of the module and of every class and function in it."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield (node.body[0].lineno, text)


def references(tree: ast.Module):
    """(line, reference) for every double back-quoted dotted name in the docstrings."""
    for line, text in docstrings(tree):
        for match in REFERENCE.finditer(text):
            yield line + text[: match.start()].count("\n"), match.group(1)


def broken_references(package: Package, skip=frozenset()) -> tuple[list[str], int]:
    """The references that name no code (as 'path:line: reference'), and how many were checked."""
    broken, checked = [], 0
    for info in package.modules.values():
        if info.name in skip:
            continue
        for line, reference in references(info.tree):
            if not package.is_reference(reference):
                continue
            checked += 1
            if not package.resolves(reference):
                broken.append(f"{info.path}:{line}: ``{reference}``")
    return broken, checked


def the_package() -> Package:
    return Package(read_package(), option_keys())


def test_every_code_reference_in_a_docstring_names_code_that_exists():
    broken, checked = broken_references(the_package(), skip=OWNED_ELSEWHERE)
    assert checked > 100, "the checker found almost no references: is the pattern still right?"
    assert broken == [], "docstrings name code that does not exist:\n" + "\n".join(broken)


PLANTED = '''"""A module that names ``planted.helper``, ``planted.Holder.value`` and ``Holder.grow()``,
``planted.missing``, ``Holder.shrink`` and ``gone_module.helper``; and ``torch.compile``,
``logging.helper``, ``args.epochs``, ``other.json``, ``other.option``."""


def helper():
    """Calls ``other.gone``, ``other.kept`` and ``pkg.other.Kept.count``."""


class Holder:
    size: int = 0

    def __init__(self):
        self.value = 1

    def grow(self):
        """Grows by ``Holder.size``."""
'''

OTHER = """
kept = 1
FILE = "other.json"


class Base:
    def count(self):
        pass


class Kept(Base):
    pass
"""


@pytest.fixture
def planted_package(tmp_path):
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "planted.py").write_text(PLANTED)
    (root / "other.py").write_text(OTHER)
    return Package(read_package(root), {"args.epochs", "other.option", "other.kept"})


def test_the_checker_finds_a_broken_reference_and_accepts_valid_ones(planted_package):
    broken, checked = broken_references(planted_package)
    found = sorted(entry.split(": ", 1)[1] for entry in broken)
    assert found == ["``Holder.shrink``", "``gone_module.helper``", "``other.gone``", "``planted.missing``"]
    # planted.helper, planted.Holder.value, Holder.grow, other.kept (an option key too, but
    # code), pkg.other.Kept.count (a base class's method), Holder.size, and the four broken;
    # not torch.compile nor logging.helper (other packages), nor the option keys args.epochs
    # and other.option, nor the file other.json
    assert checked == 10


def test_the_run_files_option_keys_are_not_code_references():
    package = the_package()
    assert "args.epochs" in package.options and "args.model_config" in package.options
    # an option key is code only where it names code too; the planted test shows one whose
    # first part is a module's name (other.option), as replicates.seeds is today
    assert [key for key in package.options if package.is_reference(key) and not package.resolves(key)] == []
    assert not package.is_reference("torch.compile") and not package.is_reference("gears.inference")
    assert package.resolves("GEARS.train") and package.resolves("gears_ddp.data.io.write_yaml")
    assert package.resolves("TrainingOptions.resume_from")  # a dataclass field
    assert not package.resolves("GEARS.no_such_method")


def long_module_docstrings(package: Package, skip=frozenset()) -> list[str]:
    long = []
    for info in package.modules.values():
        text = ast.get_docstring(info.tree, clean=False)
        if info.name not in skip and text and len(text.strip().splitlines()) > MODULE_DOCSTRING_LINES:
            long.append(f"{info.path}: {len(text.strip().splitlines())} lines")
    return long


def test_no_module_docstring_is_an_essay():
    long = long_module_docstrings(the_package(), skip=OWNED_ELSEWHERE)
    assert long == [], (
        f"module docstrings over {MODULE_DOCSTRING_LINES} lines (say what and why; the explanation "
        "belongs in docs/):\n" + "\n".join(long)
    )


if __name__ == "__main__":
    package = the_package()
    broken, checked = broken_references(package)
    print(f"{checked} references checked, {len(broken)} broken")
    print("\n".join(broken))
    print("\n".join(long_module_docstrings(package)))
    sys.exit(1 if broken else 0)
