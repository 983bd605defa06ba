"""Options several commands take alike: ``--set`` overrides, a saved run's ``--run``, and
the epilogs that list what each name of a table means."""

from __future__ import annotations

import textwrap


def add_set(parser) -> None:
    """``--set KEY=VALUE``, repeatable: one value of the configuration overridden."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one value, e.g. args.epochs=5 or args.model_config.hidden_size=32",
    )


def add_run(parser) -> None:
    """``--run`` (one saved run folder) and ``--set``, for the commands that read a saved run."""
    parser.add_argument("--run", required=True, help="a run folder (config.yaml and the saved model)")
    add_set(parser)


def meanings_text(title: str, meanings: dict[str, str]) -> str:
    """``title:`` then one line per name, its meaning wrapped beside it (a command's epilog)."""
    lines = textwrap.wrap(f"{title}:", 100, break_on_hyphens=False)
    width = max(map(len, meanings)) + 2
    for name, meaning in meanings.items():
        wrapped = textwrap.wrap(meaning, 100 - width - 2, break_on_hyphens=False)
        lines += [f"  {name:<{width}}{wrapped[0]}", *(" " * (width + 2) + line for line in wrapped[1:])]
    return "\n".join(lines)
