"""Module names: no two modules of the package share a file name, so that a name (in a log
line, a traceback, a review) says which module it is."""

from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gears_ddp"
ALLOWED = {
    "gears_ddp/launch.py",  # the published alias of the launching module
}


def test_no_two_modules_of_the_package_share_a_file_name():
    places = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).as_posix()
        if path.name != "__init__.py" and relative not in ALLOWED:
            places[path.name].append(relative)
    shared = {name: paths for name, paths in places.items() if len(paths) > 1}
    assert not shared, f"modules sharing a file name: {shared}"
