"""docs/options.md is written from the options' own definitions and must be current.

python tests/test_docs.py --write     # rewrite it after changing an option
"""

import sys
from pathlib import Path

from gears_ddp.configuration.run_options import option_reference, option_sections

OPTIONS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "options.md"


def test_the_option_reference_is_current():
    assert OPTIONS_PAGE.read_text(encoding="utf-8") == option_reference(), (
        "docs/options.md is out of date: run python tests/test_docs.py --write"
    )


def test_every_option_has_a_meaning_and_appears_in_the_reference():
    page = OPTIONS_PAGE.read_text(encoding="utf-8")
    for _, prefix, rows in option_sections():
        for name, _, meaning in rows:
            assert meaning.strip(), f"{prefix}{name} has no meaning"
            assert f"| `{prefix}{name}` |" in page


def test_the_reference_shows_where_gears_train_differs_from_args():
    rows = {
        name: default for _, prefix, section in option_sections() if prefix == "args." for name, default, _ in section
    }
    assert rows["batch_size"] == "32 (GEARS.train: None)"
    assert rows["cpu_processes"] == "None (args only)"
    assert rows["epochs"] == "20"


DOCUMENTS = [OPTIONS_PAGE.parent.parent / "README.md", *sorted(OPTIONS_PAGE.parent.glob("*.md"))]


def test_every_file_and_page_the_documentation_names_exists():
    import re

    root = OPTIONS_PAGE.parent.parent
    missing = []
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        named = re.findall(r"`((?:gears_ddp|benchmarks|examples|tests)/[\w/.-]+\.(?:py|md|sh|sbatch))`", text)
        for path in named:
            if not (root / path).exists():
                missing.append(f"{document.name}: {path}")
        for link in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
            if not (document.parent / link).exists():
                missing.append(f"{document.name}: link {link}")
    assert missing == []


def test_the_screen_page_says_what_every_score_and_column_means():
    from gears_ddp.inference.pair_screen_job import PAIR_SCREEN_COLUMN_MEANINGS
    from gears_ddp.inference.pair_screen_statistics import SUMMARY_COLUMN_MEANINGS
    from gears_ddp.interactions.calls import INTERACTION_TYPE_MEANINGS
    from gears_ddp.interactions.scores import GI_SCORE_NAMES

    page = (OPTIONS_PAGE.parent / "screens.md").read_text(encoding="utf-8")
    assert [name for name in GI_SCORE_NAMES if f"| `{name}` |" not in page] == []  # a row of the scores' table
    columns = [
        name
        for meanings in (PAIR_SCREEN_COLUMN_MEANINGS, INTERACTION_TYPE_MEANINGS, SUMMARY_COLUMN_MEANINGS)
        for key in meanings
        for name in key.split(", ")
    ]
    assert [name for name in columns if f"`{name}`" not in page] == []


def test_the_readme_shows_what_gears_ddp_check_prints_on_the_real_screen(monkeypatch, capsys):
    """The README's own-screen section: its command, run from the repository's root, prints
    the output shown beside it, and exits with status 2 (a gene without GO terms)."""
    import re
    import shlex

    from gears_ddp.cli import main

    readme = DOCUMENTS[0].read_text(encoding="utf-8")
    command, shown = re.search(
        r"```bash\n(S=[^\n]*\ngears-ddp check .*?)\n```\n\n```\n(.*?)\n```", readme, re.S
    ).groups()
    folder = command.splitlines()[0].split("=", 1)[1]
    argv = shlex.split(command.split("\n", 1)[1].replace("\\\n", " ").replace("$S", folder))
    monkeypatch.chdir(DOCUMENTS[0].parent)
    assert argv[:2] == ["gears-ddp", "check"] and main(argv[1:]) == 2
    assert capsys.readouterr().out.rstrip("\n") == shown


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    OPTIONS_PAGE.write_text(option_reference(), encoding="utf-8")
