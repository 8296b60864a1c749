"""Maintenance tools for cache files: show, merge, diff, prune and export (``fastrun cache``).

The functions here return plain, JSON-ready data and never print, so that the command line
(:mod:`fastrun.cli.cache_cmd`), tests and other tools (a CI job comparing rankings) share one
implementation. File problems are reported as :class:`CacheToolError`, whose message names the
file: the command line turns it into ``fastrun: error: ...`` with exit status 2.

Read-only tools (:func:`show`, :func:`diff`, :func:`export`) load files with
:func:`fastrun.cache.read_cache_file`, which never moves or rewrites anything: inspecting a
corrupt file must not destroy the evidence. Writing tools (:func:`merge`, :func:`prune`) go
through :meth:`fastrun.cache.FileCache.rewrite`: read, change and atomically replace under the
cache's file lock, so a search writing the same file at the same time loses nothing.

A category (:mod:`fastrun.category`) is the device's facts and ``<operator>@<algorithm-set
version>``; the operator part names what was measured independently of where.
"""

from __future__ import annotations

import os
import re
import time
import warnings
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from fastrun import category as category_module
from fastrun.attribute import AlgoAttribute
from fastrun.base.formats import CACHE_EXPORT_FORMAT, CACHE_EXPORT_VERSION
from fastrun.cache import (
    CacheFormatError,
    Categories,
    Entry,
    FileCache,
    entry_order,
    low_confidence,
    merge_entries,
    read_cache_file,
)
from fastrun.cache import file as cachefile
from fastrun.cache.file import Damage
from fastrun.cache.store import merge_rank


class CacheToolError(ValueError):
    """A cache file cannot be used by a tool: missing, unreadable, not a cache, bad arguments.

    A ValueError so that ``fastrun``'s generic handler reports it with exit status 2 too.
    """


# --------------------------------------------------------------------------------------------
# Loading and selecting


def load(path: str | os.PathLike[str],
         skipped: list[tuple[str, str, str]] | None = None,
         damage: list[Damage] | None = None) -> Categories:
    """A cache file's contents, read without changing the file (see the module docstring);
    entries that are not valid are skipped and added to ``skipped``, damaged bytes to
    ``damage``."""
    path = os.fspath(path)
    try:
        return read_cache_file(path, skipped, damage)
    except FileNotFoundError:
        raise CacheToolError(f"cache file {path} does not exist") from None
    except IsADirectoryError:
        raise CacheToolError(f"cache file {path} is a directory, not a file") from None
    except OSError as error:
        raise CacheToolError(f"cache file {path} cannot be read: {error.strerror or error}") \
            from None
    except CacheFormatError as error:
        # read_cache_file's message already names the file
        raise CacheToolError(f"{error} (the file was left unchanged)") from None


split_category = category_module.split
operator_of = category_module.operator_of


def select(data: Categories, categories: Sequence[str] = (),
           operator: str | None = None) -> Categories:
    """The categories that match any of ``categories`` (:func:`category_matches`) and whose
    operator is ``operator`` (each filter applies only when given)."""
    return {
        category: keys
        for category, keys in data.items()
        if (not categories or any(category_matches(category, part) for part in categories))
        and (operator is None or operator_of(category) == operator)
    }


def category_matches(category: str, pattern: str) -> bool:
    """Whether ``category`` is one ``pattern`` selects.  A pattern of facts,
    ``FACT=VALUE[;FACT=VALUE...]``, matches a category whose every named fact has exactly that
    value (``threads=1`` is the fact ``threads``, never ``blas_threads``; ``operator`` and
    ``algorithms`` are facts too); any other pattern is a part of the category's text (``|conv@``,
    ``AMD EPYC``)."""
    if "=" not in pattern:
        return pattern in category
    try:
        facts = category_module.parse(category).facts()
    except category_module.CategoryError:
        return False
    for term in pattern.split(";"):
        name, _, value = term.partition("=")
        if facts.get(name.strip()) != value.strip():
            return False
    return True


def ranking(entries: Iterable[Entry]) -> list[Entry]:
    """Entries in the order a lookup tries them (fastest first; the file is normally already in
    this order, but a hand-edited or foreign file need not be)."""
    return sorted(entries, key=entry_order)


def lookup_choice(entries: Sequence[Entry]) -> tuple[str | None, str | None]:
    """What a plain lookup chooses (the fastest entry) and what a REPRODUCIBLE one chooses."""
    ranked = ranking(entries)
    fastest = ranked[0].algorithm if ranked else None
    reproducible = next((e.algorithm for e in ranked
                         if AlgoAttribute.REPRODUCIBLE in e.attributes), None)
    return fastest, reproducible


def _utc_text(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _count(data: Categories) -> dict[str, int]:
    return {
        "categories": len(data),
        "keys": sum(len(keys) for keys in data.values()),
        "entries": sum(len(entries) for keys in data.values() for entries in keys.values()),
    }


# --------------------------------------------------------------------------------------------
# show


def show(path: str | os.PathLike[str], categories: Sequence[str] = (),
         operator: str | None = None, device: str | None = "cpu") -> dict[str, Any]:
    """Every selected key's ranking and what a lookup would choose from it, and for each
    category whether it applies to ``device`` (a device spec; None: not compared) and, if
    not, which facts differ."""
    skipped: list[tuple[str, str, str]] = []
    damage: list[Damage] = []
    data = select(load(path, skipped, damage), categories, operator)
    here = _device_category(device)
    report: list[dict[str, Any]] = []
    for category in sorted(data):
        device_text, rest = split_category(category)
        keys = []
        for key in sorted(data[category]):
            ranked = ranking(data[category][key])
            fastest, reproducible = lookup_choice(ranked)
            keys.append({
                "key": key,
                "lookup": fastest,
                "lookup_reproducible": reproducible,
                "low_confidence": low_confidence(ranked) is not None,
                "entries": [{**e.to_dict(), "measured": _utc_text(e.measured_at)}
                            for e in ranked],
            })
        version = rest.partition("@")[2] or None
        report.append({"category": category, "device": device_text,
                       "operator": operator_of(category), "operator_version": version,
                       **_applies(category, here), "keys": keys})
    return {"file": os.fspath(path), "summary": _count(data), "compared_with": here,
            "skipped": [{"category": c, "key": k, "why": why} for c, k, why in skipped],
            "damage": [_damage_dict(item) for item in damage],
            "categories": report}


def _damage_dict(item: Damage) -> dict[str, Any]:
    return {"offset": item.offset, "bytes": item.length, "why": item.why}


# --------------------------------------------------------------------------------------------
# check


def check(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Everything a reader of ``path`` would skip or drop, and where: damaged records (offset,
    bytes, why; the reader resynchronises past each), a tail of bytes after the last whole
    record, and entries whose values are refused.  ``clean`` is True when there is none.
    The file is only read."""
    path = os.fspath(path)
    skipped: list[tuple[str, str, str]] = []
    damage: list[Damage] = []
    data = load(path, skipped, damage)
    found = cachefile.probe(path)
    size = os.path.getsize(path) if found.kind != cachefile.EMPTY else 0
    return {"file": path, "format": found.kind, "bytes": size, "summary": _count(data),
            "damage": [_damage_dict(item) for item in damage],
            "skipped": [{"category": c, "key": k, "why": why} for c, k, why in skipped],
            "clean": not damage and not skipped}


def _device_category(spec: str | None) -> str | None:
    """The category text of the device ``spec`` names on this machine (None for None)."""
    if spec is None:
        return None
    from fastrun.devices import get_device

    try:
        return get_device(spec).category
    except ValueError as error:
        raise CacheToolError(f"cannot compare with device {spec!r}: {error}") from None


def _applies(category: str, here: str | None) -> dict[str, Any]:
    """Whether a category's entries apply on the device whose category text is ``here``,
    and the facts that differ (a category of another kind of device never applies)."""
    if here is None:
        return {}
    try:
        cached = category_module.parse(category)
    except category_module.CategoryError:
        return {"applies_here": False, "differences": ["not a category in the usual form"]}
    wanted = category_module.parse(category_module.text(here, cached.operator,
                                                        cached.algorithms))
    found = category_module.differences(cached, wanted)
    return {"applies_here": not found, "differences": [str(d) for d in found]}


# --------------------------------------------------------------------------------------------
# export


def export(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The whole cache as one JSON-ready document (format in docs/cache-format.md)."""
    data = load(path)
    return {
        "format": CACHE_EXPORT_FORMAT,
        "version": CACHE_EXPORT_VERSION,
        "categories": {
            category: {key: [e.to_dict() for e in entries] for key, entries in keys.items()}
            for category, keys in data.items()
        },
    }


def import_json(document: Any) -> Categories:
    """The contents of an exported document; CacheToolError says what does not fit the format.

    The inverse of :func:`export`: it lets the export format be checked (and lets other tools
    build caches from JSON) without a second description of it.
    """
    if not isinstance(document, dict) or document.get("format") != CACHE_EXPORT_FORMAT:
        raise CacheToolError(f"not a {CACHE_EXPORT_FORMAT} document")
    if document.get("version") != CACHE_EXPORT_VERSION:
        raise CacheToolError(f"{CACHE_EXPORT_FORMAT} version {document.get('version')!r} is not "
                             f"the supported version {CACHE_EXPORT_VERSION}")
    categories = document.get("categories")
    if not isinstance(categories, dict):
        raise CacheToolError("'categories' is missing or not an object")
    result: Categories = {}
    for category, keys in categories.items():
        if not isinstance(keys, dict):
            raise CacheToolError(f"category {category!r} is not an object")
        for key, entries in keys.items():
            if not isinstance(entries, list):
                raise CacheToolError(f"category {category!r} key {key!r} is not a list")
            try:
                result.setdefault(category, {})[key] = [_entry_from_dict(e) for e in entries]
            except (KeyError, TypeError, ValueError) as error:
                raise CacheToolError(
                    f"category {category!r} key {key!r}: bad entry ({error})") from None
    return result


def _entry_from_dict(item: dict[str, Any]) -> Entry:
    return Entry(
        algorithm=str(item["algorithm"]),
        attributes=AlgoAttribute.from_names(item["attributes"]),
        time_s=float(item["time_s"]),
        spread_s=float(item["spread_s"]),
        workspace_bytes=int(item["workspace_bytes"]),
        error=None if item["error"] is None else float(item["error"]),
        repeats=int(item["repeats"]),
        measured_at=float(item["measured_at"]),
        version=str(item["version"]),
    )


# --------------------------------------------------------------------------------------------
# merge


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)


def _rewrite(path: str, transform, force: bool = False) -> bool:
    """FileCache.rewrite with file problems turned into CacheToolError."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a tool reports problems as errors instead
            cache = FileCache(path)
        return cache.rewrite(transform, force=force)
    except CacheFormatError as error:
        raise CacheToolError(f"{error} (the file was left unchanged)") from None
    except OSError as error:
        raise CacheToolError(f"cannot write cache file {path}: {error.strerror or error}") \
            from None


def compact(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Fold a cache file's log of measurements into a new snapshot (atomically, under its
    lock); a format-1 or format-2 file is converted.  Entries that are not valid and damaged
    records are dropped; every whole record is kept."""
    path = os.fspath(path)
    load(path)  # missing or not a cache: a clear error, and nothing is touched
    before = os.path.getsize(path)
    _rewrite(path, None, force=True)
    counts = _count(load(path))
    return {"file": path, "bytes_before": before, "bytes_after": os.path.getsize(path),
            **counts}


def merge(inputs: Sequence[str | os.PathLike[str]],
          output: str | os.PathLike[str]) -> dict[str, Any]:
    """Merge cache files into ``output`` by the cache's merge rule (:func:`merge_entries`).

    For every key, entries are combined by algorithm; of two measurements of one algorithm the
    steady one wins (a low-confidence measurement loses to a steady one), then the one with
    more repeats, then the newer one, then the one from the later input; the union is pruned.
    ``output`` may be one of the inputs. If it exists and is not an input, its contents are
    kept and merged too, as the first input: merging into a live cache never drops what is
    already there. The output is written once, atomically, under its lock; inputs are only
    read.

    Returns the counts: per source its keys, the keys only it has, the entries of the result
    taken from it; and the conflicts (one algorithm of one key measured differently in several
    sources) by the part of the rule that resolved them.
    """
    inputs = [os.fspath(p) for p in inputs]
    output = os.fspath(output)
    if not inputs:
        raise CacheToolError("merge needs at least one input file")
    loaded = {path: load(path) for path in inputs}
    if os.path.exists(output):
        load(output)  # a corrupt output is reported before anything is done
    output_is_input = any(_same_file(path, output) for path in inputs)
    report: dict[str, Any] = {}

    def transform(current: Categories) -> Categories | None:
        sources: list[tuple[str, Categories]] = []
        if not output_is_input and current:
            sources.append((f"{output} (existing contents)", current))
        for path in inputs:
            # The output's own contents are taken as read under the lock, not from the earlier
            # snapshot: a search may have added to it meanwhile.
            sources.append((path, current if _same_file(path, output) else loaded[path]))
        result, stats = _merge_sources(sources)
        report.update(stats)
        return None if result == current else result

    written = _rewrite(output, transform)
    return {"output": output, "written": written, **report}


def _merge_sources(sources: Sequence[tuple[str, Categories]]) -> tuple[Categories, dict]:
    origin: dict[int, int] = {}  # id(entry) -> index of its source
    seen: dict[tuple[str, str], list[int]] = {}
    grouped: dict[tuple[str, str], list[Entry]] = {}
    for index, (_, data) in enumerate(sources):
        for category, keys in data.items():
            for key, entries in keys.items():
                seen.setdefault((category, key), []).append(index)
                grouped.setdefault((category, key), []).extend(entries)
                for entry in entries:
                    origin[id(entry)] = index

    result: Categories = {}
    conflicts = {"steady": 0, "more_repeats": 0, "newer": 0, "later_input": 0}
    identical = pruned = 0
    kept = [0] * len(sources)
    for (category, key), entries in grouped.items():
        # One merge over all sources in order is the rule applied input after input, without
        # letting an entry pruned early keep a later input's measurement of it out.
        merged = merge_entries(entries, ())
        result.setdefault(category, {})[key] = merged
        for entry in merged:
            kept[origin[id(entry)]] += 1
        by_algorithm: dict[str, list[Entry]] = {}
        for entry in entries:
            by_algorithm.setdefault(entry.algorithm, []).append(entry)
        for versions in by_algorithm.values():
            distinct = list(dict.fromkeys(versions))
            identical += len(versions) - len(distinct)
            if len(distinct) > 1:
                conflicts[_resolved_by(distinct)] += 1
        pruned += len(by_algorithm) - len(merged)

    per_source = []
    for index, (name, data) in enumerate(sources):
        pairs = [(c, k) for c, keys in data.items() for k in keys]
        per_source.append({
            "path": name,
            "keys": len(pairs),
            "keys_only_here": sum(1 for pair in pairs if seen[pair] == [index]),
            "entries": sum(len(e) for keys in data.values() for e in keys.values()),
            "entries_kept": kept[index],
        })
    stats = {
        "sources": per_source,
        "result": _count(result),
        "shared_keys": sum(1 for indices in seen.values() if len(indices) > 1),
        "conflicts": sum(conflicts.values()),
        "resolved_by": conflicts,
        "identical_duplicates": identical,
        "pruned": pruned,
    }
    return result, stats


def _resolved_by(versions: list[Entry]) -> str:
    """Which part of the merge rule (:func:`merge_rank`) decided between differing
    measurements of one algorithm: the first part whose best value only one of them has."""
    ranks = [merge_rank(e) for e in versions]
    for depth, part in enumerate(("steady", "more_repeats", "newer"), start=1):
        best = max(rank[:depth] for rank in ranks)
        if sum(1 for rank in ranks if rank[:depth] == best) == 1:
            return part
    return "later_input"


# --------------------------------------------------------------------------------------------
# diff


def diff(path_a: str | os.PathLike[str], path_b: str | os.PathLike[str],
         threshold: float = 0.1) -> dict[str, Any]:
    """What changed from cache A to cache B.

    Same device (the files share a device category): categories are matched exactly and
    absolute times compared. Different devices (no device category in common, e.g. two
    machines, or two thread counts): times of different machines say nothing about a
    regression, so categories are matched by ``op@version`` and, per key, each
    algorithm's time relative to a *reference* algorithm (A's fastest of those both files
    measured) is compared between the files. A ratio is flagged when it is beyond
    ``threshold``: above ``1 + threshold`` or below ``1 / (1 + threshold)``.
    """
    if not threshold >= 0:
        raise CacheToolError(f"threshold must be a non-negative number, not {threshold}")
    a, b = load(path_a), load(path_b)
    devices_a = sorted({split_category(c)[0] for c in a})
    devices_b = sorted({split_category(c)[0] for c in b})
    cross = bool(a) and bool(b) and not set(devices_a) & set(devices_b)

    def group(data: Categories) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for category in data:
            groups.setdefault(split_category(category)[1] if cross else category, []).append(
                category)
        return groups

    groups_a, groups_b = group(a), group(b)
    only_a = sorted(set(groups_a) - set(groups_b))
    only_b = sorted(set(groups_b) - set(groups_a))
    keys_only_a: list[dict[str, str]] = []
    keys_only_b: list[dict[str, str]] = []
    common: list[dict[str, Any]] = []
    for ident in sorted(set(groups_a) & set(groups_b)):
        keys_a = {(key, c) for c in groups_a[ident] for key in a[c]}
        keys_b = {(key, c) for c in groups_b[ident] for key in b[c]}
        names_a, names_b = {k for k, _ in keys_a}, {k for k, _ in keys_b}
        keys_only_a += [{"category": c, "key": k} for k, c in sorted(keys_a) if k not in names_b]
        keys_only_b += [{"category": c, "key": k} for k, c in sorted(keys_b) if k not in names_a]
        for key, category_a in sorted(keys_a):
            for key_b, category_b in sorted(keys_b):
                if key_b == key:
                    common.append(_compare_key(category_a, category_b, key, a[category_a][key],
                                               b[category_b][key], cross, threshold))
    if cross:
        note = ("the files come from different device categories: categories are matched by "
                "operator@version and key across devices, and each algorithm's time "
                "relative to a reference algorithm is compared, not absolute times")
    else:
        note = "same device category: absolute times are compared (ratio = B/A)"
    return {
        "a": os.fspath(path_a),
        "b": os.fspath(path_b),
        "threshold": threshold,
        "cross_device": cross,
        "devices_a": devices_a,
        "devices_b": devices_b,
        "note": note,
        "categories_only_in_a": [{"category": i, "keys": sum(len(a[c]) for c in groups_a[i]),
                                  "differs_from_b": _explain(b, i, ("B", "A"))}
                                 for i in only_a],
        "categories_only_in_b": [{"category": i, "keys": sum(len(b[c]) for c in groups_b[i]),
                                  "differs_from_a": _explain(a, i, ("A", "B"))}
                                 for i in only_b],
        "keys_only_in_a": keys_only_a,
        "keys_only_in_b": keys_only_b,
        "common": common,
        "summary": {
            "common_keys": len(common),
            "winner_changes": sum(1 for item in common if item["winner_changed"]),
            "flagged": sum(1 for item in common for alg in item["algorithms"] if alg["flagged"]),
            "keys_only_in_a": len(keys_only_a),
            "keys_only_in_b": len(keys_only_b),
        },
    }


def _explain(other: Categories, category: str, labels: tuple[str, str]) -> str | None:
    """Which facts differ between ``category`` and the closest one of the same operator in
    the other file (None when there is none, or across devices, where ``category`` is only
    ``operator@version``)."""
    try:
        return category_module.explain(other, category, labels)
    except category_module.CategoryError:
        return None


def _beyond(ratio: float | None, threshold: float) -> bool:
    return ratio is None or ratio > 1 + threshold or ratio < 1 / (1 + threshold)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or None when undefined (a time of 0 or an undefined ratio,
    only in hand-made caches): None stays valid JSON where infinity would not, and counts as
    beyond any threshold."""
    if numerator is None or denominator is None:
        return None
    if denominator > 0:
        return numerator / denominator
    return 1.0 if numerator == 0 else None


def _compare_key(category_a: str, category_b: str, key: str, entries_a: list[Entry],
                 entries_b: list[Entry], cross: bool, threshold: float) -> dict[str, Any]:
    ranked_a, ranked_b = ranking(entries_a), ranking(entries_b)
    time_a = {e.algorithm: e.time_s for e in ranked_a}
    time_b = {e.algorithm: e.time_s for e in ranked_b}
    shared = [name for name in time_a if name in time_b]  # in A's ranking order
    winner_a = ranked_a[0].algorithm if ranked_a else None
    winner_b = ranked_b[0].algorithm if ranked_b else None
    reference = shared[0] if cross and shared else None
    algorithms = []
    for name in shared:
        item: dict[str, Any] = {
            "algorithm": name,
            "time_a": time_a[name],
            "time_b": time_b[name],
            "delta_s": time_b[name] - time_a[name],
            "time_ratio": _ratio(time_b[name], time_a[name]),
        }
        if reference is not None:
            item["relative_a"] = _ratio(time_a[name], time_a[reference])
            item["relative_b"] = _ratio(time_b[name], time_b[reference])
            item["ratio"] = _ratio(item["relative_b"], item["relative_a"])
        else:
            item["ratio"] = item["time_ratio"]
        item["flagged"] = _beyond(item["ratio"], threshold)
        algorithms.append(item)
    return {
        "category_a": category_a,
        "category_b": category_b,
        "key": key,
        "winner_a": winner_a,
        "winner_b": winner_b,
        "winner_changed": winner_a != winner_b,
        "reference": reference,
        "algorithms": algorithms,
        "only_in_a": [name for name in time_a if name not in time_b],
        "only_in_b": [name for name in time_b if name not in time_a],
    }


# --------------------------------------------------------------------------------------------
# prune

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_VERSION = re.compile(r"^\s*v?(\d+(?:\.\d+)*)")


def parse_duration(text: str) -> float:
    """Seconds in ``30d``, ``12h``, ``90m``, ``45s`` or ``2w``."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"cannot read duration {text!r}: expected a number and a unit "
                         "s, m, h, d or w, e.g. 30d, 12h, 90m")
    return float(match[1]) * _UNIT_SECONDS[match[2].lower()]


def parse_version(text: str) -> tuple[int, ...] | None:
    """The numeric release part of a version (``0.2.0rc1`` -> (0, 2, 0)); None if there is none.

    Pre-release and local suffixes are ignored, so ``--version-below 0.2.0`` never removes
    measurements of a 0.2.0 pre-release: only versions certainly older go.
    """
    match = _VERSION.match(text)
    if not match:
        return None
    parts = [int(p) for p in match[1].split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()  # 0.2 == 0.2.0
    return tuple(parts)


def plan_prune(data: Categories, categories: Sequence[str] = (), operator: str | None = None,
               older_than_s: float | None = None, version_below: str | None = None,
               now: float | None = None) -> tuple[Categories, dict[str, Any]]:
    """What is left after pruning, and what goes.

    ``categories``/``operator`` choose where to prune; ``older_than_s``/``version_below``
    choose which entries there go (an entry goes when it matches every one given). Without an
    entry criterion, the selected categories go whole. A key whose entries all go is removed,
    and so is a category whose keys all go. ``data`` is not changed.
    """
    if not (categories or operator or older_than_s is not None or version_below is not None):
        raise CacheToolError("nothing to prune: give --category, --operator, --older-than or "
                             "--version-below (to delete the whole cache, delete the file)")
    cutoff = None if older_than_s is None else (time.time() if now is None else now) - older_than_s
    below = None
    if version_below is not None:
        below = parse_version(version_below)
        if below is None:
            raise CacheToolError(f"cannot read version {version_below!r}: expected e.g. 0.2.0")
    selected = select(data, categories, operator)

    def goes(entry: Entry) -> bool:
        if cutoff is not None and not entry.measured_at < cutoff:
            return False
        if below is not None:
            version = parse_version(entry.version)
            if version is None or not version < below:
                return False
        return True

    result: Categories = {}
    removed_keys: list[dict[str, Any]] = []
    removed_categories: list[str] = []
    removed_entries = 0
    for category, keys in data.items():
        if category not in selected:
            result[category] = keys
            continue
        kept_keys: dict[str, list[Entry]] = {}
        for key, entries in keys.items():
            kept = [e for e in entries if not goes(e)]
            removed_entries += len(entries) - len(kept)
            if kept:
                kept_keys[key] = kept
            else:
                removed_keys.append({"category": category, "key": key, "entries": len(entries)})
        if kept_keys:
            result[category] = kept_keys
        else:
            removed_categories.append(category)
    report = {
        "removed": {"categories": len(removed_categories), "keys": len(removed_keys),
                    "entries": removed_entries},
        "left": _count(result),
        "removed_categories": removed_categories,
        "removed_keys": removed_keys,
    }
    return result, report


def prune(path: str | os.PathLike[str], categories: Sequence[str] = (),
          operator: str | None = None, older_than_s: float | None = None,
          version_below: str | None = None, dry_run: bool = False,
          now: float | None = None) -> dict[str, Any]:
    """Remove entries, keys or categories from a cache file (see :func:`plan_prune`).

    The plan is made and written under the file's lock from what is on disk at that moment, so
    results a search adds meanwhile are kept. ``dry_run`` reports the same without writing (and
    without taking the lock or touching the file).
    """
    path = os.fspath(path)
    data = load(path)  # missing or corrupt: a clear error, and nothing is touched
    options = {"categories": categories, "operator": operator, "older_than_s": older_than_s,
               "version_below": version_below, "now": now}
    _, preview = plan_prune(data, **options)  # bad options fail here, before the lock
    if dry_run:
        return {"file": path, "dry_run": True, "written": False, **preview}
    report = {}

    def transform(current: Categories) -> Categories | None:
        result, plan = plan_prune(current, **options)
        report.update(plan)
        return None if result == current else result

    written = _rewrite(path, transform)
    return {"file": path, "dry_run": False, "written": written, **report}
