"""The settings a cache file was built with, in a small JSON file beside it.

The published GEARS names its split files after some of ``prepare_split``'s settings only
(split, seed, ``train_gene_set_size``, ``test_perts``), so a file name can match a request
whose other settings differ. We keep the published names, so that either package reads
the other's files, and write every setting into ``<cache stem>_settings.json`` beside the
file. A cache whose settings file differs from a request was built for another request;
a cache without one (the published package writes none) is taken on its name, as the
published package takes it.
"""

from __future__ import annotations

import json
from pathlib import Path

from gears_ddp.data.io import atomic_path

SUFFIX = "_settings.json"


def settings_path(cache: Path) -> Path:
    """The settings file of the cache file ``cache``."""
    return cache.with_name(cache.stem + SUFFIX)


def differences(cache: Path, settings: dict) -> list[str]:
    """How the settings written beside ``cache`` differ from ``settings`` (``'name: cached
    x, asked y'``); empty when they are the same or none were written. A settings file that
    cannot be read counts as different: the cache cannot be shown to fit."""
    path = settings_path(cache)
    if not path.is_file():
        return []
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return [f"{path.name} cannot be read ({type(err).__name__})"]
    if not isinstance(cached, dict):
        return [f"{path.name} holds no settings"]
    wanted = json.loads(json.dumps(settings))  # as JSON gives them back: tuples become lists
    return [
        f"{name}: cached {cached.get(name)!r}, asked {value!r}"
        for name, value in wanted.items()
        if name not in cached or cached[name] != value
    ]


def forget(cache: Path) -> None:
    """Remove the settings file of ``cache``: call it before ``cache`` is rewritten, so no
    settings file describes a cache it was not written for."""
    settings_path(cache).unlink(missing_ok=True)


def write_settings(cache: Path, settings: dict) -> None:
    """Write ``settings`` beside ``cache`` (once the cache itself is written)."""
    with atomic_path(settings_path(cache)) as tmp:
        tmp.write_text(json.dumps(settings, indent=1, sort_keys=True) + "\n", encoding="utf-8")
