"""Settings are declared once (``fastrun.config.declare``), the devices' in their packages: the
settings page shows every declaration with the meaning ``fastrun config`` prints, every
FASTRUN_* variable the code reads is declared, and ``config.scope`` sets and restores them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from fastrun import config
from fastrun.devices import declared_settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
BEGIN = "<!-- settings table: generated from the declarations (fastrun.config.declare) -->\n"


def test_the_settings_page_holds_the_generated_table():
    text = PAGE.read_text()
    start = text.index(BEGIN)
    end = text.index("<!-- end of settings table -->")
    table = text[start:end].split("\n", 1)[1]
    assert table == config.markdown_table(declared_settings()), (
        "docs/settings.md is out of date: paste "
        "fastrun.config.markdown_table(fastrun.devices.declared_settings()) between its markers")


def test_every_variable_the_code_reads_is_declared():
    """A FASTRUN_* variable named anywhere in the package is declared (so on the page and in
    `fastrun config`), or is a declared setting's former name."""
    package = Path(config.__file__).resolve().parent
    read = set()
    for path in package.rglob("*.py"):
        read |= set(re.findall(r"\"(FASTRUN_[A-Z_]+)\"", path.read_text()))
    settings = declared_settings()
    known = {s.variable for s in settings} | {s.renamed_from for s in settings if s.renamed_from}
    assert read <= known, sorted(read - known)


def test_the_devices_declare_their_own_settings_in_their_groups():
    groups = {s.variable: s.group for s in declared_settings()}
    assert groups["FASTRUN_NUM_THREADS"] == "cpu"
    assert groups["FASTRUN_REPLAY"] == "opencl"
    assert groups["FASTRUN_CACHE"] == "cache"
    order = [config.GROUPS.index(s.group) for s in declared_settings()
             if s.group in config.GROUPS]
    assert order == sorted(order)


def test_explicit_then_variable_then_default(monkeypatch):
    monkeypatch.delenv("FASTRUN_NEAREST", raising=False)
    assert config.NEAREST.get() == 1.0
    assert config.NEAREST.get(default=2.0) == 2.0
    monkeypatch.setenv("FASTRUN_NEAREST", "0.5")
    assert config.NEAREST.get() == 0.5
    assert config.NEAREST.get(0.25) == 0.25
    monkeypatch.setenv("FASTRUN_NEAREST", "far")
    with pytest.raises(ValueError, match="FASTRUN_NEAREST='far'"):
        config.NEAREST.get()
    with pytest.raises(ValueError, match="is not a distance"):
        config.NEAREST.get(-1.0)


def test_scope_sets_and_restores_variables(monkeypatch):
    monkeypatch.setenv("FASTRUN_REPLAY", "1")
    monkeypatch.delenv("FASTRUN_NEAREST", raising=False)
    with config.scope(REPLAY=False, NEAREST=0.5):
        assert os.environ["FASTRUN_REPLAY"] == "0"
        assert config.NEAREST.get() == 0.5
        with config.scope(REPLAY=None):
            assert "FASTRUN_REPLAY" not in os.environ
        assert os.environ["FASTRUN_REPLAY"] == "0"
    assert os.environ["FASTRUN_REPLAY"] == "1"
    assert "FASTRUN_NEAREST" not in os.environ
    with pytest.raises(KeyError, match="FASTRUN_NO_SUCH_THING is not a declared setting"), \
            config.scope(NO_SUCH_THING=1):
        pass


def test_a_setting_is_declared_once_with_its_variable_and_group():
    with pytest.raises(ValueError, match="declared twice"):
        config.declare("FASTRUN_CACHE", "again", "cache", str)
    with pytest.raises(ValueError, match="starts with FASTRUN_ and it names its group"):
        config.declare("MY_SETTING", "a setting", "search", str)
