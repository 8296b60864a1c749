"""What a measurement is valid for: a cache category as named facts.

A measurement says nothing about another processor, thread count, driver or algorithm set, so
each cache entry belongs to a *category*: the facts of the device it was measured on (its kind,
then named facts such as ``processor``, ``isa``, ``threads``, ``blas``, ``numba``,
``platform`` or ``driver``) and of the operator (its name and algorithm-set version).  An entry
applies only where every fact matches.

This module is the one place that builds, reads, matches and prints categories:

* devices describe themselves with :func:`device_text` (their facts in order);
* the chooser names an operator's category with :func:`text` (the in-memory key of the cache,
  one string so that a lookup is one dictionary access);
* a cache file stores a category as a map (:meth:`Category.facts`, :meth:`Category.from_facts`);
* the tools read a category with :func:`parse` (which also reads format-1 cache files'
  strings), and :func:`differences` / :func:`explain` say which fact differs and what each side
  has, e.g. ``threads 16 (cache) vs 2 (this device)``.

Text form: ``<kind>;<name>=<value>;...|<operator>@<version>``.  Values are single-line and
hold no ``;`` or ``|`` (:func:`clean` makes them so).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: Fact names of the operator part (they cannot be device facts).
OPERATOR = "operator"
ALGORITHMS = "algorithms"
#: The device kind's fact name (the first field of the text form).
DEVICE = "device"

#: Format-1 cache files wrote the first CPU facts by position, without names.
_LEGACY_POSITIONAL = {"cpu": ("processor", "isa")}
#: Longest text a fact value may be (a hostile file cannot make a tool print megabytes).
MAX_VALUE = 256


class CategoryError(ValueError):
    """A category (text or map) that does not have the documented form."""


def clean(value: object) -> str:
    """A fact value fit for the text form: one line, no field (``;``) or part (``|``)
    separator, no control characters, at most :data:`MAX_VALUE` characters."""
    text = re.sub(r"\s+", " ", str(value)).strip().replace("|", "/").replace(";", ",")
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text[:MAX_VALUE]


@dataclass(frozen=True, slots=True)
class Category:
    """One category: the device's facts (kind first, then in the device's order) and the
    operator with its algorithm-set version."""

    device: tuple[tuple[str, str], ...]
    operator: str
    algorithms: str

    @property
    def kind(self) -> str:
        return self.device[0][1] if self.device else ""

    @property
    def device_text(self) -> str:
        return device_text(self.device)

    @property
    def text(self) -> str:
        return f"{self.device_text}|{self.operator}@{self.algorithms}"

    def facts(self) -> dict[str, str]:
        """Every fact as one map: the form a cache file stores."""
        return {**dict(self.device), OPERATOR: self.operator, ALGORITHMS: self.algorithms}

    @classmethod
    def from_facts(cls, facts: Mapping[str, object]) -> Category:
        """The category a stored map describes; :class:`CategoryError` says what is missing."""
        if not isinstance(facts, Mapping):
            raise CategoryError(f"a category must be a map of facts, not {type(facts).__name__}")
        names = list(facts)
        for required in (DEVICE, OPERATOR, ALGORITHMS):
            if required not in facts:
                raise CategoryError(f"category has no {required!r} fact")
        device = [(DEVICE, _value(facts[DEVICE]))]
        for name in names:
            if name not in (DEVICE, OPERATOR, ALGORITHMS):
                device.append((_name(name), _value(facts[name])))
        return cls(tuple(device), _value(facts[OPERATOR]), _value(facts[ALGORITHMS]))


def _name(name: object) -> str:
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", name):
        raise CategoryError(f"bad fact name {str(name)[:80]!r}")
    return name


def _value(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise CategoryError(f"bad fact value {str(value)[:80]!r}")
    text = str(value)
    if text != clean(text):
        raise CategoryError(f"bad fact value {text[:80]!r}")
    return text


def device_text(facts: Iterable[tuple[str, object]]) -> str:
    """A device's category text from its facts, kind first: ``cpu;processor=...;threads=16``."""
    facts = list(facts)
    if not facts or facts[0][0] != DEVICE:
        raise CategoryError("a device's facts begin with its kind ('device')")
    rest = [f"{_name(name)}={clean(value)}" for name, value in facts[1:]]
    return ";".join([clean(facts[0][1]), *rest])


def text(device: str, operator: str, algorithms: object) -> str:
    """An operator's category on a device (``device``: the device's category text)."""
    return f"{device}|{operator}@{algorithms}"


def parse_device(device: str) -> tuple[tuple[str, str], ...]:
    """A device text's facts.  Fields without a name are the positional facts of format-1
    files (a CPU's processor and ISA) or, where no name is known, ``fact<N>``."""
    fields = device.split(";")
    kind = fields[0]
    positional = iter(_LEGACY_POSITIONAL.get(kind, ()))
    facts = [(DEVICE, kind)]
    for index, field in enumerate(fields[1:], start=1):
        name, equals, value = field.partition("=")
        if equals and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", name):
            # format-1 OpenCL categories named the device model 'device'
            facts.append(("model" if name == DEVICE else name, value))
        else:
            facts.append((next(positional, f"fact{index}"), field))
    return tuple(facts)


def parse(category: str) -> Category:
    """The facts of a category text, this format's or a format-1 file's
    (``...|op@version|format=1``); :class:`CategoryError` when it has no operator part."""
    device, bar, rest = category.partition("|")
    operator_part = rest.partition("|")[0]
    operator, at, algorithms = operator_part.partition("@")
    if not bar or not at or not operator:
        raise CategoryError(f"category {category[:200]!r} has no '|operator@version' part")
    return Category(parse_device(device), operator, algorithms)


def is_legacy(category: str) -> bool:
    """Whether a category text is in format 1's form (it ended with ``|format=N``)."""
    return "|format=" in category


def normalize(category: str) -> str:
    """A format-1 file's category in this format's text (named facts, no ``|format=``); a
    text of this format is returned as it is."""
    return parse(category).text if is_legacy(category) else category


def normalize_device(device: str) -> str:
    """A device text written by an older fastrun (positional CPU facts) in this form."""
    return device_text(parse_device(device))


def split(category: str) -> tuple[str, str]:
    """``(device text, "operator@version")`` of a category text; a text not in that form is
    all device, with an empty operator part."""
    try:
        parsed = parse(category)
    except CategoryError:
        return category, ""
    return parsed.device_text, f"{parsed.operator}@{parsed.algorithms}"


def operator_of(category: str) -> str | None:
    """The operator a category text names, or None when it is not in the usual form."""
    try:
        return parse(category).operator
    except CategoryError:
        return None


# -- matching --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Difference:
    """One fact on which a cached category and the wanted one disagree (None: not stated)."""

    fact: str
    cache: str | None
    here: str | None

    def __str__(self) -> str:
        return self.describe()

    def describe(self, labels: tuple[str, str] = ("cache", "this device")) -> str:
        """``threads 16 (cache) vs 2 (this device)``."""
        def shown(value: str | None) -> str:
            return "(not stated)" if value is None else value

        return (f"{self.fact} {shown(self.cache)} ({labels[0]}) vs {shown(self.here)} "
                f"({labels[1]})")


def differences(cached: Category, wanted: Category) -> list[Difference]:
    """The facts that differ, in the wanted category's order, then the cache's extra ones."""
    return _differing(cached.facts(), wanted.facts())


def device_differences(cached: str, wanted: str) -> list[Difference]:
    """:func:`differences` of two device texts (no operator part)."""
    return _differing(dict(parse_device(cached)), dict(parse_device(wanted)))


def _differing(theirs: Mapping[str, str], mine: Mapping[str, str]) -> list[Difference]:
    names = list(mine) + [name for name in theirs if name not in mine]
    return [Difference(name, theirs.get(name), mine.get(name))
            for name in names if theirs.get(name) != mine.get(name)]


def closest(cached: Iterable[str], wanted: str) -> tuple[str, list[Difference]] | None:
    """Of the cached categories of the wanted operator, the one with the fewest differing
    facts, and those facts; None when the cache holds nothing for that operator.  What a user
    is told when a cache does not apply: which fact differs, not only that one does."""
    target = parse(wanted)
    best: tuple[str, list[Difference]] | None = None
    for candidate in cached:
        try:
            parsed = parse(candidate)
        except CategoryError:
            continue
        if parsed.operator != target.operator:
            continue
        found = differences(parsed, target)
        if best is None or len(found) < len(best[1]):
            best = (candidate, found)
    return best


def explain(cached: Iterable[str], wanted: str,
            labels: tuple[str, str] = ("cache", "this device")) -> str | None:
    """One line saying why the cache's entries for the wanted operator do not apply here, or
    None when they do (or when it holds none)."""
    found = closest(cached, wanted)
    if found is None or not found[1]:
        return None
    return "; ".join(difference.describe(labels) for difference in found[1])


def printable(text: str) -> str:
    """``text`` with control characters escaped, for a terminal: a key or algorithm name
    read from a file cannot move the cursor or clear the screen."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
