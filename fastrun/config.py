"""The one place where fastrun's settings are declared and read.

Each setting is declared once (:func:`declare`): its ``FASTRUN_*`` variable, how a value is
read (the parser is the type), its default, what it does and the subsystem it belongs to.
The framework's settings are declared here; each device declares its own in its package
(``fastrun/devices/cpu/settings.py``, ``fastrun/devices/opencl/settings.py``), so that a device
plugin brings its settings with it.  ``fastrun config`` and ``docs/settings.md`` list every
declaration (``fastrun.devices.declared_settings``).

Reading one (:meth:`Setting.get`): an explicit argument wins; otherwise the variable;
otherwise the default.  Variables are read when a setting is used, never at import, so that a
test (:func:`scope`) or an embedding program can change them at any time.
"""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: The subsystems settings are grouped by, in the order they are listed (a device plugin's own
#: group comes after these).
GROUPS = ("search", "cache", "runtime", "cpu", "opencl")

#: Marks "no default given at the call": the declared default applies.
_DECLARED = object()


@dataclass(frozen=True, eq=False)
class Setting(Generic[T]):
    """One setting, declared once (see the module docstring)."""

    #: the environment variable
    variable: str
    #: what it does, as ``fastrun config`` and docs/settings.md show it
    doc: str
    #: the subsystem: one of :data:`GROUPS`, or a device plugin's own
    group: str
    #: reads the variable's text (raises ValueError with what it expected)
    parse: Callable[[str], T]
    #: the value when neither an argument nor the variable gives one; a callable is called then
    default: Any = None
    #: checks (and may normalise) a value given explicitly or read from the variable
    check: Callable[[Any], T] | None = None
    #: whether explicit values go through ``parse`` too (sizes given as '64MiB' or bytes)
    parse_explicit: bool = False
    #: the variable's former name, still read with a DeprecationWarning
    renamed_from: str | None = None

    def get(self, explicit: Any = None, default: Any = _DECLARED) -> T:
        """The value: ``explicit`` if not None, else the variable's, else the default
        (``default`` when the caller knows a better one than the declaration: a device's own
        choice, this machine's memory)."""
        if explicit is not None:
            value = self.parse(explicit) if self.parse_explicit else explicit
        else:
            variable = self._variable()
            raw = os.environ.get(variable)
            if raw is None or raw.strip() == "":
                chosen = self.default if default is _DECLARED else default
                return chosen() if callable(chosen) else chosen
            try:
                value = self.parse(raw)
            except ValueError as error:
                raise ValueError(f"environment variable {variable}={raw!r}: {error}") from None
        return self.check(value) if self.check is not None else value

    def _variable(self) -> str:
        old = self.renamed_from
        if old and self.variable not in os.environ and old in os.environ:
            warnings.warn(f"{old} is deprecated; use {self.variable}", DeprecationWarning,
                          stacklevel=4)
            return old
        return self.variable


_SETTINGS: dict[str, Setting[Any]] = {}


def declare(variable: str, doc: str, group: str, parse: Callable[[str], T],
            default: Any = None, **options: Any) -> Setting[T]:
    """Declare a setting (once per variable; a second declaration of one is a mistake)."""
    if not variable.startswith("FASTRUN_") or not group:
        raise ValueError(f"setting {variable!r} (group {group!r}): a setting's variable starts "
                         "with FASTRUN_ and it names its group")
    if variable in _SETTINGS:
        raise ValueError(f"setting {variable} is declared twice")
    setting = Setting(variable, doc, group, parse, default, **options)
    _SETTINGS[variable] = setting
    return setting


def declared() -> list[Setting[Any]]:
    """The settings declared so far, by group, each group in declaration order (the devices'
    appear once their packages are imported: ``fastrun.devices.declared_settings``)."""
    def order(setting: Setting[Any]) -> int:
        return GROUPS.index(setting.group) if setting.group in GROUPS else len(GROUPS)

    return sorted(_SETTINGS.values(), key=order)


@contextlib.contextmanager
def scope(**values: Any) -> Iterator[None]:
    """Set variables for the duration of a ``with`` block, by name without ``FASTRUN_``
    (``scope(REPLAY=False, NUM_THREADS=2)``; None unsets one), and restore them after."""
    saved = {}
    for name, value in values.items():
        variable = name if name.startswith("FASTRUN_") else f"FASTRUN_{name}"
        if variable not in _SETTINGS:
            raise KeyError(f"{variable} is not a declared setting")
        saved[variable] = os.environ.get(variable)
        if value is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = ("1" if value else "0") if isinstance(value, bool) \
                else str(value)
    try:
        yield
    finally:
        for variable, old in saved.items():
            if old is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = old


def markdown_table(settings: list[Setting[Any]]) -> str:
    """``settings`` as the Markdown table of ``docs/settings.md``: the page shows what
    ``fastrun config`` shows, and a test keeps the two equal, so the meanings are written
    once, in the declarations."""
    rows = ["| variable | group | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{s.variable}` | {s.group} | {s.doc.replace('|', '/')} |" for s in settings]
    return "\n".join(rows) + "\n"


_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
}


def parse_size(text: str | int | None) -> int | None:
    """Parse '64MiB', '1.5GB', '4096' into bytes; None, '', 'none' and 'inf' mean unlimited."""
    if text is None or isinstance(text, int):
        return text
    raw = text.strip().lower()
    if raw in ("", "none", "inf", "unlimited"):
        return None
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", raw)
    if not match or match.group(2) not in _SIZE_UNITS:
        raise ValueError(
            f"cannot read size {text!r}: expected a number of bytes with an optional unit "
            "(B, KB, KiB, MB, MiB, GB, GiB), e.g. 64MiB"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])


def parse_switch(raw: str) -> bool:
    """'1', 'true', 'on' or '0', 'false', 'off'."""
    text = raw.strip().lower()
    if text not in ("0", "1", "true", "false", "on", "off"):
        raise ValueError("expected 1 or 0")
    return text in ("1", "true", "on")


def _positive_seconds(what: str) -> Callable[[float], float]:
    """A check that ``what`` is a positive, finite number of seconds."""
    def check(value: float) -> float:
        if not 0 < value < float("inf"):
            raise ValueError(f"{what} {value} is not a positive number of seconds")
        return value
    return check


def _nearest_distance(limit: float) -> float:
    if not 0 <= limit < float("inf"):
        raise ValueError(f"nearest-neighbour limit {limit} is not a distance (0 turns it off, "
                         "1.0 is the default)")
    return limit


# -- the framework's settings ----------------------------------------------------------------

STRATEGY = declare(
    "FASTRUN_STRATEGY", "default strategy of fastrun.call outside a session (heuristic, "
    "fast-run, full-run, optionally +reproducible)", "search", str, "heuristic")
PROFILE_SECONDS = declare(
    "FASTRUN_PROFILE_SECONDS", "seconds of timed repeats per candidate (default 0.2; "
    "formerly FASTRUN_PROFILE_BUDGET, still read with a deprecation warning)", "search", float,
    0.2, check=_positive_seconds("profiling budget"), renamed_from="FASTRUN_PROFILE_BUDGET")
TUNING_CANDIDATES = declare(
    "FASTRUN_TUNING_CANDIDATES", "candidates of one problem timed fully (formerly "
    "FASTRUN_TUNING_BUDGET, still read with a deprecation warning); larger spaces are sampled "
    "and halved first (default 24, 0 = time all)", "search", int, 24,
    renamed_from="FASTRUN_TUNING_BUDGET")
WORKSPACE_LIMIT = declare(
    "FASTRUN_WORKSPACE_LIMIT", "default workspace limit, e.g. 64MiB", "search", parse_size,
    parse_explicit=True)
NEAREST = declare(
    "FASTRUN_NEAREST", "largest shape distance at which a cache-only or heuristic run serves a "
    "problem the cache lacks from the nearest measured one (default 1.0: one axis doubled; "
    "0 turns it off; fastrun.core.nearest)", "search", float, 1.0, check=_nearest_distance)
PROGRESS = declare(
    "FASTRUN_PROGRESS", "1 forces a progress bar, 0 hides it (default: on a terminal)",
    "search", lambda raw: raw.strip() not in ("0", ""))

CACHE = declare("FASTRUN_CACHE", "path of a cache file used as the default process-wide cache",
                "cache", str)
RECORD = declare(
    "FASTRUN_RECORD", "path of a problems file every session appends its cache misses to "
    "(docs/fleet.md)", "cache", str, check=lambda path: path or None)
CACHE_MAX_BYTES = declare(
    "FASTRUN_CACHE_MAX_BYTES", "largest cache file fastrun reads (default 1GiB); a larger file "
    "is left alone and the run keeps its results in memory", "cache", parse_size, 1 << 30,
    parse_explicit=True, check=lambda size: size or (1 << 30))
CACHE_LOCK_TIMEOUT = declare(
    "FASTRUN_CACHE_LOCK_TIMEOUT", "seconds a cache write waits for another process's lock "
    "before the run goes on in memory (default 60); the message names the holder's pid",
    "cache", float, 60.0, check=_positive_seconds("cache lock timeout"))

MEMORY_LIMIT = declare(
    "FASTRUN_MEMORY_LIMIT", "largest tensor a model or fastrun profile may allocate, e.g. "
    "64GiB (default: this machine's memory); larger ones are refused before allocation, "
    "naming the node", "runtime", parse_size, parse_explicit=True)
BLOCKED_LAYOUT = declare(
    "FASTRUN_BLOCKED_LAYOUT", "1 (default): a CPU model's search may run convolutions and "
    "squeeze-excitation blocks in the channel-blocked layout where that is measured to pay, "
    "and keeps that plan only if whole inferences run faster than all NCHW (docs/runtime.md, "
    "Layouts); 0 keeps every step NCHW", "runtime", parse_switch, True)
