"""The settings page shows the variables fastrun reads, with the meanings ``fastrun config``
prints: written once, in ``fastrun.config.VARIABLES``."""

from __future__ import annotations

import re
from pathlib import Path

from fastrun import config

PAGE = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def test_the_settings_page_holds_the_generated_table():
    text = PAGE.read_text()
    start = text.index("<!-- settings table: generated from fastrun.config.VARIABLES -->\n")
    end = text.index("<!-- end of settings table -->")
    table = text[start:end].split("\n", 1)[1]
    assert table == config.markdown_table(), (
        "docs/settings.md is out of date: paste fastrun.config.markdown_table() between its "
        "markers")


def test_every_variable_the_code_reads_is_declared():
    """A FASTRUN_* variable read anywhere in the package is in VARIABLES (so on the page and
    in `fastrun config`)."""
    package = Path(config.__file__).resolve().parent
    read = set()
    for path in package.rglob("*.py"):
        read |= set(re.findall(r"\"(FASTRUN_[A-Z_]+)\"", path.read_text()))
    # names kept only to warn that they were renamed
    renamed = {"FASTRUN_PROFILE_BUDGET", "FASTRUN_TUNING_BUDGET"}
    assert read - renamed <= set(config.VARIABLES), sorted(read - renamed - set(config.VARIABLES))
