"""The persistent cache: what profiling measured, kept so that it is paid for only once.

Structure: ``category -> key -> list[Entry]``. A *category* names the device, operator and
algorithm-set version the measurements are valid for; a *key* names one problem (shapes, dtypes,
parameters). Each value is the list of measured algorithms, sorted by time and pruned (see
:func:`prune`).

Merge rule for conflicting entries
----------------------------------
Whenever entries meet entries already stored for the same key (a ``put``, two processes writing one
file, ``fastrun cache merge``), they are combined by :func:`merge_entries`:

* the result is the union of both lists, matched by ``algorithm``;
* when the same algorithm was measured in both, the measurement with more ``repeats`` wins (it is
  the better estimate); on equal repeats the newer ``measured_at`` wins; if that ties too, the
  incoming (new) entry wins;
* the union is then pruned: an entry is dropped when another entry *with exactly the same
  attributes* is no slower and needs no more workspace.

File format (:class:`FileCache`)
--------------------------------
One msgpack document (``use_bin_type=True``)::

    {"format": "fastrun-cache", "version": 1,
     "categories": {category: {key: [raw_entry, ...]}}}

    raw_entry = [algorithm, [attribute names], time_s, spread_s, workspace_bytes,
                 error_or_None, repeats, measured_at, fastrun_version]

Attributes are stored by name (not by flag value) so that adding an attribute to
:class:`~fastrun.attribute.AlgoAttribute` does not change the meaning of old files. Entries are
plain lists because a cache of 10,000 problems must load in a few milliseconds; they become
:class:`Entry` objects only when they are asked for.

Every write is read-merge-write under a file lock followed by an atomic ``os.replace``, so several
processes can share one file without losing each other's results, and a writer killed at any
moment leaves either the old or the new file, never a torn one. A file that cannot be read is
never overwritten: it is moved aside to ``<path>.corrupt-<timestamp>`` with a
:class:`CacheCorruptWarning`.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import filelock
import msgpack

from fastrun import config
from fastrun._files import atomic_write
from fastrun.attribute import AlgoAttribute

logger = logging.getLogger(__name__)

CACHE_FORMAT = "fastrun-cache"
CACHE_FORMAT_VERSION = 1

#: Number of fields of a raw (on-disk) entry.
_RAW_ENTRY_FIELDS = 9

#: Raw cache contents: category -> key -> list of raw entries.
_RawCategories = dict[str, dict[str, list[list[Any]]]]


class CacheCorruptWarning(UserWarning):
    """A cache file could not be read and was moved aside (its contents are not used)."""


class CacheFormatError(ValueError):
    """Raised internally when a cache file's contents are not a valid fastrun cache."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One measured algorithm for one problem."""

    algorithm: str  #: AlgorithmDesc text, e.g. "blocked(kb=256,mb=64,nb=64)"
    attributes: AlgoAttribute
    time_s: float  #: median time of the timed repeats
    spread_s: float  #: interquartile range of the timed repeats
    workspace_bytes: int
    error: float | None  #: numerical error against the reference; None = not checked
    repeats: int  #: how many timed repeats the median is from
    measured_at: float  #: unix time
    version: str  #: fastrun version that measured it


#: Decoded cache contents: category -> key -> entries (what :func:`read_cache_file` returns and
#: what :meth:`FileCache.rewrite` hands to its transform).
Categories = dict[str, dict[str, list[Entry]]]


# --------------------------------------------------------------------------------------------
# Pruning and merging


def _sort_key(entry: Entry) -> tuple[float, int, str]:
    return (entry.time_s, entry.workspace_bytes, entry.algorithm)


def prune(entries: Iterable[Entry]) -> list[Entry]:
    """Sort by time and drop every entry dominated by another entry with the same attributes.

    An entry is dominated when another one with exactly the same attributes is no slower and
    needs no more workspace: no strategy and no workspace limit could ever prefer it. Entries with
    different attributes are never compared, so a REPRODUCIBLE choice survives a faster
    non-reproducible one. Ties in time are broken by smaller workspace, then algorithm name; of
    exact duplicates in (time, workspace) the first in that order is kept.
    """
    kept: list[Entry] = []
    # Smallest workspace among the kept entries of each attribute set. Every earlier entry in
    # sort order is no slower, so the new one is dominated iff that minimum is <= its workspace.
    smallest_workspace: dict[AlgoAttribute, int] = {}
    for entry in sorted(entries, key=_sort_key):
        smallest = smallest_workspace.get(entry.attributes)
        if smallest is not None and smallest <= entry.workspace_bytes:
            continue
        kept.append(entry)
        smallest_workspace[entry.attributes] = entry.workspace_bytes
    return kept


def _prefer_second(first: Entry, second: Entry) -> bool:
    """Whether ``second`` replaces ``first`` (one algorithm): more repeats, then newer, then new."""
    return (second.repeats, second.measured_at) >= (first.repeats, first.measured_at)


def merge_entries(old: Iterable[Entry], new: Iterable[Entry]) -> list[Entry]:
    """Combine two measurement lists of one key by the module's documented merge rule."""
    by_algorithm: dict[str, Entry] = {}
    for source in (old, new):
        for entry in source:
            current = by_algorithm.get(entry.algorithm)
            if current is None or _prefer_second(current, entry):
                by_algorithm[entry.algorithm] = entry
    return prune(by_algorithm.values())


# --------------------------------------------------------------------------------------------
# Protocol and in-memory implementation


@runtime_checkable
class PersistentCache(Protocol):
    """What the chooser and the CLI need from a cache, whatever stores it."""

    def get(self, category: str, key: str) -> list[Entry] | None:
        """The stored entries of one problem, or None if it was never stored."""
        ...

    def put(self, category: str, key: str, entries: Iterable[Entry]) -> None:
        """Merge entries into one problem's stored entries (see :func:`merge_entries`)."""
        ...

    def put_many(self, items: Iterable[tuple[str, str, Iterable[Entry]]]) -> None:
        """Like ``put`` for several problems, in one write."""
        ...

    def __iter__(self) -> Iterator[tuple[str, str, list[Entry]]]: ...

    def __len__(self) -> int: ...

    def categories(self) -> list[str]: ...


class InMemoryCache:
    """A cache that lives as long as the process: the default when no cache file is configured."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._data: dict[str, dict[str, list[Entry]]] = {}

    def get(self, category: str, key: str) -> list[Entry] | None:
        with self._lock:
            entries = self._data.get(category, {}).get(key)
            return None if entries is None else list(entries)

    def put(self, category: str, key: str, entries: Iterable[Entry]) -> None:
        self.put_many([(category, key, entries)])

    def put_many(self, items: Iterable[tuple[str, str, Iterable[Entry]]]) -> None:
        with self._lock:
            for category, key, entries in items:
                keys = self._data.setdefault(category, {})
                keys[key] = merge_entries(keys.get(key, ()), list(entries))

    def __iter__(self) -> Iterator[tuple[str, str, list[Entry]]]:
        # Snapshot under the lock so that iterating while another thread puts is safe.
        with self._lock:
            snapshot = [
                (category, key, list(entries))
                for category, keys in self._data.items()
                for key, entries in keys.items()
            ]
        return iter(snapshot)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(keys) for keys in self._data.values())

    def categories(self) -> list[str]:
        with self._lock:
            return list(self._data)

    def __repr__(self) -> str:
        return f"InMemoryCache({len(self)} keys)"


# --------------------------------------------------------------------------------------------
# File cache


def _entry_to_raw(entry: Entry) -> list[Any]:
    return [
        entry.algorithm,
        entry.attributes.names(),
        float(entry.time_s),
        float(entry.spread_s),
        int(entry.workspace_bytes),
        None if entry.error is None else float(entry.error),
        int(entry.repeats),
        float(entry.measured_at),
        entry.version,
    ]


def _entry_from_raw(raw: list[Any]) -> Entry:
    """Build an Entry from its on-disk list; ValueError says what is wrong with it."""
    try:
        algorithm, names, time_s, spread_s, workspace, error, repeats, measured_at, version = raw
        if not isinstance(algorithm, str) or not isinstance(version, str):
            raise TypeError("algorithm and version must be strings")
        return Entry(
            algorithm=algorithm,
            attributes=AlgoAttribute.from_names(names),
            time_s=float(time_s),
            spread_s=float(spread_s),
            workspace_bytes=int(workspace),
            error=None if error is None else float(error),
            repeats=int(repeats),
            measured_at=float(measured_at),
            version=version,
        )
    except (TypeError, ValueError) as problem:
        raise ValueError(f"malformed cache entry {raw!r}: {problem}") from None


def _entries_from_raw(category: str, key: str, raws: list[list[Any]]) -> list[Entry]:
    """Convert one key's raw entries, skipping (and logging) any that cannot be read."""
    entries = []
    for raw in raws:
        try:
            entries.append(_entry_from_raw(raw))
        except ValueError as problem:
            logger.warning("cache %r key %r: skipping entry: %s", category, key, problem)
    return entries


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while unpacking.

    Unpacking a large cache creates ~10^5 lists; each few hundred allocations trigger a collection
    that walks them all again, which more than doubles the load time. The unpacked data has no
    cycles, so nothing is lost by not collecting during it.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _decode(data: bytes) -> _RawCategories:
    """Unpack and check a cache file's bytes; CacheFormatError says what is wrong.

    The check is structural only (maps of lists of 9-field lists): it is what a loader can verify
    in a few milliseconds for tens of thousands of entries. Field values are checked when an entry
    is converted.
    """
    try:
        with _gc_paused():
            document = msgpack.unpackb(data, raw=False)
    except Exception as problem:  # msgpack raises several unrelated types for bad input
        detail = f"{type(problem).__name__}: {problem}" if str(problem) else type(problem).__name__
        raise CacheFormatError(f"not a msgpack document ({detail})") from None
    if not isinstance(document, dict):
        raise CacheFormatError(f"top level is a {type(document).__name__}, not a map")
    if document.get("format") != CACHE_FORMAT:
        raise CacheFormatError(
            f"format is {document.get('format')!r}, expected {CACHE_FORMAT!r} (not a fastrun cache)"
        )
    if document.get("version") != CACHE_FORMAT_VERSION:
        raise CacheFormatError(
            f"format version {document.get('version')!r} is not the supported version "
            f"{CACHE_FORMAT_VERSION} (written by another fastrun version?)"
        )
    categories = document.get("categories")
    if not isinstance(categories, dict):
        raise CacheFormatError("'categories' is missing or not a map")
    for category, keys in categories.items():
        if not isinstance(category, str) or not isinstance(keys, dict):
            raise CacheFormatError(f"category {category!r} is not a string mapped to a map")
        for key, raws in keys.items():
            if not isinstance(key, str) or not isinstance(raws, list):
                raise CacheFormatError(
                    f"category {category!r}: key {key!r} is not mapped to a list"
                )
            for raw in raws:
                if type(raw) is not list or len(raw) != _RAW_ENTRY_FIELDS:
                    raise CacheFormatError(
                        f"category {category!r} key {key!r}: entry {raw!r} is not a list of "
                        f"{_RAW_ENTRY_FIELDS} fields"
                    )
    return categories


def _encode(categories: _RawCategories) -> bytes:
    document = {
        "format": CACHE_FORMAT,
        "version": CACHE_FORMAT_VERSION,
        "categories": categories,
    }
    return msgpack.packb(document, use_bin_type=True)


#: What identifies one version of the file on disk: a write replaces the inode, and
#: (mtime, size) catch editors that rewrite in place. None = no file.
_FileSignature = tuple[int, int, int] | None


def _signature(stat: os.stat_result) -> tuple[int, int, int]:
    return (stat.st_ino, stat.st_mtime_ns, stat.st_size)


class FileCache:
    """A cache kept in one msgpack file, shared safely between threads and processes.

    ``get`` is a dictionary lookup; on a miss it checks with ``os.stat`` whether another process
    replaced the file and reloads it if so, so that problems profiled elsewhere are found. ``put``
    re-reads the file under a lock, merges, and atomically replaces it (see the module docstring).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.RLock()
        # Waiters poll; a short interval keeps many concurrent writers from idling.
        self._file_lock = filelock.FileLock(self.path + ".lock", poll_interval=0.01)
        self._raw: _RawCategories = {}
        self._signature: _FileSignature = None
        self.reload()

    # ---- reading

    def reload(self) -> None:
        """Replace the in-memory state with the file's current contents."""
        with self._lock:
            raw, signature, problem = self._read()
            if problem is not None:
                # Move aside only under the file lock, after reading again: the bad file may
                # have been replaced by a writer meanwhile, and that file must not be moved.
                try:
                    with self._locked_file():
                        raw, signature = self._read_or_move_aside()
                except OSError as error:
                    # E.g. a read-only directory. Reading can go on without the file; a put
                    # will fail on the same error rather than overwrite it. The bad file's
                    # signature is kept so that every get miss does not warn again.
                    self._warn_corrupt(
                        f"{problem}. It could not be moved aside ({error}) and is left as it is"
                    )
                    raw = {}
            self._raw, self._signature = raw, signature

    def _read(self) -> tuple[_RawCategories, _FileSignature, CacheFormatError | None]:
        """Read and decode the file; a missing or empty file is an empty cache."""
        try:
            with open(self.path, "rb") as file:
                signature = _signature(os.fstat(file.fileno()))
                data = file.read()
        except FileNotFoundError:
            return {}, None, None
        if not data:
            return {}, signature, None
        try:
            return _decode(data), signature, None
        except CacheFormatError as problem:
            return {}, signature, problem

    def _read_or_move_aside(self) -> tuple[_RawCategories, _FileSignature]:
        """Read the file (the file lock must be held); a bad file is moved aside, not used."""
        raw, signature, problem = self._read()
        if problem is None:
            return raw, signature
        moved_to = self._move_aside()
        self._warn_corrupt(f"{problem}. It was moved to {moved_to}")
        return {}, None

    def _warn_corrupt(self, what: str) -> None:
        message = (
            f"fastrun cache file {self.path} cannot be read: {what}; an empty cache is used "
            "instead, so its results will be measured again."
        )
        logger.warning("%s", message)
        warnings.warn(message, CacheCorruptWarning, stacklevel=5)

    def _move_aside(self) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = f"{self.path}.corrupt-{stamp}"
        counter = 0
        while os.path.exists(target):
            counter += 1
            target = f"{self.path}.corrupt-{stamp}-{counter}"
        os.rename(self.path, target)
        return target

    def _refresh_if_changed(self) -> None:
        """Reload when the file on disk is not the version last loaded."""
        try:
            current: _FileSignature = _signature(os.stat(self.path))
        except FileNotFoundError:
            current = None
        if current != self._signature:
            logger.debug("cache file %s changed on disk; reloading", self.path)
            self.reload()

    def get(self, category: str, key: str) -> list[Entry] | None:
        with self._lock:
            raws = self._raw.get(category, {}).get(key)
            if raws is None:
                self._refresh_if_changed()
                raws = self._raw.get(category, {}).get(key)
                if raws is None:
                    return None
        return _entries_from_raw(category, key, raws)

    def __iter__(self) -> Iterator[tuple[str, str, list[Entry]]]:
        """Every stored problem, as of the last load or write (call ``reload`` for the latest)."""
        with self._lock:
            # Loads and writes replace the whole state instead of changing it: a snapshot.
            raw = self._raw
        for category, keys in raw.items():
            for key, raws in keys.items():
                yield category, key, _entries_from_raw(category, key, raws)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(keys) for keys in self._raw.values())

    def categories(self) -> list[str]:
        with self._lock:
            return list(self._raw)

    # ---- writing

    def put(self, category: str, key: str, entries: Iterable[Entry]) -> None:
        self.put_many([(category, key, entries)])

    def put_many(self, items: Iterable[tuple[str, str, Iterable[Entry]]]) -> None:
        batch = [(category, key, list(entries)) for category, key, entries in items]
        with self._lock, self._locked_file():
            # Merge into what is on disk now, not into what this process loaded earlier:
            # other processes may have added results since. The freshly decoded state is this
            # call's own, so it is changed in place; self._raw is replaced only once the write
            # succeeded.
            raw, _ = self._read_or_move_aside()
            for category, key, entries in batch:
                keys = raw.setdefault(category, {})
                old = _entries_from_raw(category, key, keys.get(key, []))
                keys[key] = [_entry_to_raw(entry) for entry in merge_entries(old, entries)]
            signature = self._write(_encode(raw))
            self._raw, self._signature = raw, signature
        logger.debug("wrote %d problem(s) to cache file %s", len(batch), self.path)

    def rewrite(self, transform: Callable[[Categories], Categories | None]) -> bool:
        """Replace the whole file by ``transform(current contents)``, under the file lock.

        For the maintenance tools (``fastrun cache prune``/``merge``), which must remove or
        replace entries, something ``put``'s merge can never do. The read, the transform and
        the atomic replace all happen under the file lock, so no concurrent ``put`` is lost.
        ``transform`` may change its argument in place; returning None means "no change" and
        nothing is written. Unlike a ``put``, an unreadable file is not moved aside: a tool
        asked to edit a file must not silently start it over, so :class:`CacheFormatError`
        (naming the file) is raised and the file stays as it is. Entries that cannot be read
        are dropped (and logged), as a load would skip them. Returns whether it wrote.
        """
        with self._lock, self._locked_file():
            raw, _, problem = self._read()
            if problem is not None:
                raise CacheFormatError(f"cache file {self.path}: {problem}")
            current = {
                category: {key: _entries_from_raw(category, key, raws)
                           for key, raws in keys.items()}
                for category, keys in raw.items()
            }
            result = transform(current)
            if result is None:
                return False
            raw = {
                category: {key: [_entry_to_raw(entry) for entry in entries]
                           for key, entries in keys.items()}
                for category, keys in result.items()
            }
            signature = self._write(_encode(raw))
            self._raw, self._signature = raw, signature
        logger.debug("rewrote cache file %s", self.path)
        return True

    def _locked_file(self) -> filelock.FileLock:
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        return self._file_lock

    def _write(self, data: bytes) -> tuple[int, int, int]:
        """Atomically replace the file with ``data``; returns the new file's signature."""
        return _signature(atomic_write(self.path, data))

    def __repr__(self) -> str:
        return f"FileCache({self.path!r}, {len(self)} keys)"


def read_cache_file(path: str | os.PathLike[str]) -> Categories:
    """Load a cache file without changing anything on disk (for the read-only tools).

    A :class:`FileCache` moves an unreadable file aside so that a search can go on; a tool that
    only inspects a file (``fastrun cache show``/``diff``/``export``) must leave it exactly as it
    is and say what is wrong instead. Raises ``FileNotFoundError`` (or another ``OSError``) when
    the file cannot be opened and :class:`CacheFormatError`, naming the file, when it is not a
    fastrun cache. An empty file is an empty cache; unreadable single entries are skipped and
    logged, as a load would.
    """
    path = os.fspath(path)
    with open(path, "rb") as file:
        return decode_cache_bytes(file.read(), f"cache file {path}")


def decode_cache_bytes(data: bytes, name: str) -> Categories:
    """The contents of a cache file's bytes; :class:`CacheFormatError` naming ``name`` when
    they are not a fastrun cache (an empty file is an empty cache)."""
    if not data:
        return {}
    try:
        raw = _decode(data)
    except CacheFormatError as problem:
        raise CacheFormatError(f"{name}: {problem}") from None
    return {
        category: {key: _entries_from_raw(category, key, raws) for key, raws in keys.items()}
        for category, keys in raw.items()
    }


# --------------------------------------------------------------------------------------------
# Process-wide default


_default_lock = threading.Lock()
_default: PersistentCache | None = None


def default_cache() -> PersistentCache:
    """The process-wide cache: a FileCache at $FASTRUN_CACHE if set, else an InMemoryCache.

    Created on first use; :func:`set_default_cache` replaces it (None makes the next call read
    the environment again).
    """
    global _default
    with _default_lock:
        if _default is None:
            path = config.cache_path()
            _default = FileCache(path) if path else InMemoryCache()
            logger.debug("default cache: %r", _default)
        return _default


def set_default_cache(cache: PersistentCache | None) -> None:
    """Replace the process-wide cache; None resets it to be created again from the environment."""
    global _default
    with _default_lock:
        _default = cache
