"""Where a sweep's study lives, and the study itself.

By default the study is an Optuna journal file in the sweep folder (``study.journal``):
nothing to install or start, and the processes that share the folder draw from one study
(the journal's writes take a lock of their own). ``--storage`` takes a database URL
(``postgresql://user@host/db``, through SQLAlchemy; ``sqlite:///file.db``) or a journal file
on a shared filesystem, so that several machines draw trials from one study. A storage that
does not answer is named before any trial starts.

The study records what made it (``user_attrs``): the search space, the sampler and its
seed, the pruner and the metric; a sweep folder or study made by another search space is
refused, naming what differs. The process that starts a study samples with the seed given,
so an uninterrupted sweep on one process draws the same settings every time; a process that
resumes or joins it seeds its sampler afresh (seed + trials drawn + its process id), so that
it does not draw the first process's settings again.
"""

from __future__ import annotations

import os
from pathlib import Path

JOURNAL_FILE = "study.journal"
DATABASE_SCHEMES = ("postgresql", "mysql", "sqlite")


class SweepError(ValueError):
    """A sweep that cannot start; the message names the key, file or URL."""


def open_storage(folder: Path, url: str | None):
    """The Optuna storage of the sweep in ``folder``: its journal file, or ``url`` (a
    database URL or a journal file); ``SweepError`` naming the URL when it does not answer."""
    from optuna.storages import JournalStorage, RDBStorage
    from optuna.storages.journal import JournalFileBackend

    if url is None or "://" not in url:
        path = Path(folder) / JOURNAL_FILE if url is None else Path(url)
        if not path.parent.is_dir():
            raise SweepError(f"--storage {path}: its folder {path.parent} does not exist")
        try:
            return JournalStorage(JournalFileBackend(str(path)))
        except OSError as err:
            raise SweepError(f"--storage {path}: cannot open the journal file: {err}") from None
    scheme = url.split("://", 1)[0].split("+", 1)[0]
    if scheme not in DATABASE_SCHEMES:
        raise SweepError(
            f"--storage {url}: a database URL ({', '.join(DATABASE_SCHEMES)}) or a journal file path is expected"
        )
    try:
        return RDBStorage(with_installed_driver(url), engine_kwargs={"pool_pre_ping": True})
    except ImportError:
        raise SweepError(
            f"--storage {url}: no database driver for {scheme} here; install one (PostgreSQL: pip "
            "install 'psycopg[binary]')"
        ) from None
    except Exception as err:  # SQLAlchemy's errors: the URL does not answer
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SweepError(f"--storage {url}: the database does not answer ({reason})") from None


def with_installed_driver(url: str) -> str:
    """``url``, naming psycopg (3) as its driver where it is a ``postgresql://`` URL that names
    none and psycopg is installed: the driver these pages ask for, which SQLAlchemy takes
    such a URL to mean from 2.1 on; before, it takes psycopg2."""
    import importlib.util

    scheme, rest = url.split("://", 1)
    if scheme == "postgresql" and importlib.util.find_spec("psycopg") is not None:
        return f"postgresql+psycopg://{rest}"
    return url


def load_or_create_study(storage, name: str, made_by: dict, seed: int, pruner: dict):
    """The study ``name`` in ``storage``: created with a seeded TPE sampler and a median
    pruner (``pruner``: its ``startup_trials`` and ``warmup_epochs``; a trial reports its
    epochs as steps from 1), ``made_by`` (the space, the metric, the sampler and the pruner)
    recorded; an existing one is continued when ``made_by`` matches, its sampler's seed
    aside (a continuing process seeds its draws afresh), else refused naming what differs."""
    import optuna
    from optuna.pruners import MedianPruner
    from optuna.samplers import TPESampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # Optuna prunes from the step n_warmup_steps on: epochs (steps from 1) up to warmup_epochs are never pruned
    median = MedianPruner(n_startup_trials=pruner["startup_trials"], n_warmup_steps=pruner["warmup_epochs"] + 1)
    study = optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=TPESampler(seed=seed),
        pruner=median,
        direction="minimize",
        load_if_exists=True,
    )
    drawn = len(study.get_trials(deepcopy=False))
    if drawn:  # a resumed or joining process: a draw of its own, not the first process's draws again
        study.sampler = TPESampler(seed=seed + drawn + os.getpid())
    held = study.user_attrs.get("made_by")
    if held is None:
        study.set_user_attr("made_by", made_by)
        return study
    # the seed a process gives matters to the process that starts the study alone
    mine, theirs = _without_seed(made_by), _without_seed(held)
    differing = sorted(key for key in set(theirs) | set(mine) if theirs.get(key) != mine.get(key))
    if differing:
        what = {"space": "search space"}
        raise SweepError(
            f"the study {name!r} was made by another sweep (its "
            f"{', '.join(what.get(key, key) for key in differing)} "
            f"{'differs' if len(differing) == 1 else 'differ'}): give the sweep its own folder or storage"
            + (", or the search space it was made by" if "space" in differing else "")
        )
    return study


def _without_seed(made_by: dict) -> dict:
    """What made a study, less its sampler's seed."""
    sampler = made_by.get("sampler")
    if not isinstance(sampler, dict):
        return made_by
    return {**made_by, "sampler": {key: value for key, value in sampler.items() if key != "seed"}}
