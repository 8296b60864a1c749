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

The file
--------
:class:`FileCache` keeps a cache in a format-2 file (:mod:`fastrun.cache.file`, documented in
``docs/cache-format.md``): a snapshot, then an append-only log of measurements written under a
file lock, each record with its length and checksum, so that several processes share one file
without losing each other's results, a writer killed at any moment leaves at worst a torn last
record (detected and dropped), and a put costs O(its record).  Entries are kept as plain lists
after loading (a cache of 10,000 problems must load in a few milliseconds) and become
:class:`Entry` objects, checked field by field, only when asked for.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import filelock

from fastrun import config
from fastrun._files import atomic_write
from fastrun.attribute import AlgoAttribute
from fastrun.cache import file as cachefile
from fastrun.cache.file import CacheFormatError

logger = logging.getLogger(__name__)

#: The file format this fastrun writes (see :mod:`fastrun.cache.file`).
CACHE_FORMAT_VERSION = cachefile.VERSION

#: Raw cache contents: category -> key -> list of raw entries.
_RawCategories = cachefile.RawCategories


class CacheCorruptWarning(UserWarning):
    """A damaged cache file could not be read and was moved aside (its contents are not
    used)."""

@dataclass(frozen=True, slots=True)
class Entry:
    """One measured algorithm for one problem: the one measurement record of the cache, the
    rankings (:mod:`fastrun.analysis.rankings`), the report and the cache tools."""

    algorithm: str  #: AlgorithmDesc text, e.g. "blocked(kb=256,mb=64,nb=64)"
    attributes: AlgoAttribute
    time_s: float  #: median time of the timed repeats
    spread_s: float  #: interquartile range of the timed repeats
    workspace_bytes: int
    error: float | None  #: numerical error against the reference; None = not checked
    repeats: int  #: how many timed repeats the median is from
    measured_at: float  #: unix time
    version: str  #: fastrun version that measured it
    #: timing stopped after a few repeats because it was clearly slower than the best so far,
    #: so its median rests on few runs (kept by rankings; a cache does not store it)
    early_stopped: bool = False

    @property
    def relative_spread(self) -> float:
        return self.spread_s / self.time_s if self.time_s > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        """The JSON form every tool prints (``fastrun profile --json``, ``cache show
        --json``, the export): the fields, attributes as their names."""
        return {"algorithm": self.algorithm, "attributes": self.attributes.names(),
                "time_s": self.time_s, "spread_s": self.spread_s,
                "workspace_bytes": self.workspace_bytes, "error": self.error,
                "repeats": self.repeats, "measured_at": self.measured_at,
                "version": self.version}


#: Decoded cache contents: category -> key -> entries (what :func:`read_cache_file` returns and
#: what :meth:`FileCache.rewrite` hands to its transform).
Categories = dict[str, dict[str, list[Entry]]]


# --------------------------------------------------------------------------------------------
# Pruning and merging


def entry_order(entry: Entry) -> tuple[float, int, str]:
    """The order entries are kept and shown in: fastest first, then smaller workspace, then
    the algorithm's name (a sort key)."""
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
    for entry in sorted(entries, key=entry_order):
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

    def keys(self, category: str) -> list[str]:
        """The problem keys stored in one category (no entries built: the nearest-neighbour
        index reads every key of a category)."""
        ...


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

    def keys(self, category: str) -> list[str]:
        with self._lock:
            return list(self._data.get(category, ()))

    def __repr__(self) -> str:
        return f"InMemoryCache({len(self)} keys)"


# --------------------------------------------------------------------------------------------
# File cache


def entry_to_raw(entry: Entry) -> list[Any]:
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


def entry_from_raw(raw: list[Any]) -> Entry:
    """Build an Entry from its stored list; ValueError says what is wrong with it."""
    problem = cachefile.check_raw(raw)
    if problem is None:
        try:
            attributes = AlgoAttribute.from_names(raw[1])
        except (TypeError, ValueError) as error:
            problem = str(error)
    if problem is not None:
        raise ValueError(f"malformed cache entry {_short(raw)}: {problem}")
    algorithm, _, time_s, spread_s, workspace, error, repeats, measured_at, version = raw
    return Entry(algorithm=algorithm, attributes=attributes, time_s=float(time_s),
                 spread_s=float(spread_s), workspace_bytes=workspace,
                 error=None if error is None else float(error), repeats=repeats,
                 measured_at=float(measured_at), version=version)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _entries_from_raw(category: str, key: str, raws: list[list[Any]],
                      skipped: list[tuple[str, str, str]] | None = None) -> list[Entry]:
    """Convert one key's stored entries, skipping (and reporting) any that are not valid."""
    entries = []
    for raw in raws if type(raws) is list else ():
        try:
            entries.append(entry_from_raw(raw))
        except ValueError as problem:
            logger.warning("cache category %r key %r: skipping entry: %s", category, key, problem)
            if skipped is not None:
                skipped.append((category, key, str(problem)))
    return entries


def check_entries(category: str, key: str, entries: Iterable[Entry]) -> list[Entry]:
    """``entries`` as a list, or ValueError naming the problem when one would be refused on
    reading (a NaN or negative time, say): nothing invalid is ever stored."""
    result = list(entries)
    for entry in result:
        problem = cachefile.check_raw(entry_to_raw(entry))
        if problem is not None:
            raise ValueError(f"cache category {category!r} key {key!r}: refusing entry "
                             f"{entry.algorithm!r}: {problem}")
    return result


class CacheUnwritableWarning(UserWarning):
    """A cache file cannot be used or written: the run keeps its measurements in memory."""


class CacheLockTimeout(OSError):
    """Another process held a cache file's lock for longer than the lock timeout."""


def _lock_holder(lock_path: str) -> int | None:
    """The pid holding a lock on ``lock_path``, from /proc/locks (Linux), or None."""
    try:
        status = os.stat(lock_path)
        with open("/proc/locks") as locks:
            lines = locks.read().splitlines()
    except OSError:
        return None
    wanted = f":{status.st_ino}"
    for line in lines:
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:56789 0 EOF"; a waiter's line has "->"
        if len(fields) >= 6 and "->" not in fields and fields[5].endswith(wanted):
            major, minor = (int(part, 16) for part in fields[5].split(":")[:2])
            if (major, minor) == (os.major(status.st_dev), os.minor(status.st_dev)):
                return int(fields[4])
    return None


#: Which file the loaded records came from, (inode, device): a compaction replaces the inode,
#: appends only grow the file past ``FileCache._end``.
_FileSignature = tuple[int, int] | None

#: The log is folded into a new snapshot once it is larger than this and than the snapshot.
COMPACT_AFTER_BYTES = 1 << 20


class FileCache:
    """A cache kept in one file, shared safely between threads and processes.

    The file is format 2 (:mod:`fastrun.cache.file`): a snapshot followed by an append-only log
    of measurements, so a ``put`` appends one record under the lock, O(its record), and a
    lookup that misses reads only the records other processes appended since.  Reading merges
    snapshot and log by the module's merge rule; once the log outgrows the snapshot it is
    compacted into a new snapshot by atomic replace.  A format-1 file is read and converted on
    its first write.

    What a path holds decides what happens to it (:func:`fastrun.cache.file.probe`): a damaged
    fastrun cache is moved aside (``<path>.corrupt-<time>``) with a
    :class:`CacheCorruptWarning`; anything else that is no readable cache (a newer format, an
    ONNX model, JSON, a directory, a FIFO, a device, a file over the size limit) is never
    renamed or overwritten.  Then, and whenever the file cannot be written (read-only, full,
    permission, a lock held too long), the run goes on in memory after one
    :class:`CacheUnwritableWarning` naming the path and the reason; :attr:`unwritable` says
    why, and :meth:`save_unsaved` writes what was measured elsewhere.  A symlinked path is
    followed: writes go to its target.
    """

    def __init__(self, path: str | os.PathLike[str], read_only: bool = False) -> None:
        self.path = os.fspath(path)
        #: a run that searches nothing (cache-only): the file is never moved or written, a
        #: damaged one included, and puts stay in memory
        self.read_only = read_only
        #: where the bytes go: a symlink is followed, so a shared target is written, not forked
        self.target = os.path.realpath(self.path)
        self._lock = threading.RLock()
        # Waiters poll; a short interval keeps many concurrent writers from idling.
        self._file_lock = filelock.FileLock(self.target + ".lock", poll_interval=0.01)
        self._raw: _RawCategories = {}
        self._signature: _FileSignature = None
        self._end = 0  # offset after the last record applied (0: no format-2 file loaded)
        #: the file's status when last read or written: unchanged means nothing to read
        self._seen: tuple[int, int, int, int] | None = None
        self._snapshot_bytes = 0
        self._needs_snapshot = True  # no format-2 file yet (missing, empty or format 1)
        #: Why this cache keeps its measurements in memory (None: it writes its file).
        self.unwritable: str | None = None
        self._unsaved: list[tuple[str, str, list[Entry]]] = []
        #: (category, key, why) of the log's records and entries skipped on reading (snapshot
        #: entries are checked when they are used, and skipped there with a log line).
        self.skipped: list[tuple[str, str, str]] = []
        self.reload()

    # ---- reading

    def reload(self) -> None:
        """Replace the in-memory state with the file's current contents."""
        with self._lock:
            found = cachefile.probe(self.target)
            problem = self._load(found)
            if problem is not None and self.read_only:
                self._raw = {}
                self._set_unwritable(f"it is a damaged fastrun cache ({problem}); it is left "
                                     "untouched")
            elif problem is not None:
                # Move aside only under the file lock, after reading again: the bad file may
                # have been replaced by a writer meanwhile, and that file must not be moved.
                try:
                    with self._locked_file():
                        self._load_or_move_aside()
                except OSError as error:
                    # E.g. a read-only directory. Reading goes on without the file, which is
                    # left as it is; the run keeps its results in memory.
                    self._raw = {}
                    self._set_unwritable(f"it is a damaged fastrun cache that could not be "
                                         f"moved aside ({_reason(error)})", corrupt=True)

    def _load(self, found: cachefile.Probe) -> str | None:
        """Load what ``found`` describes; returns why a fastrun cache is damaged, or None.
        A path that is no usable cache leaves the state empty and the cache in memory."""
        self._raw, self._signature, self._end, self._snapshot_bytes = {}, None, 0, 0
        self._needs_snapshot = True
        self._seen = _seen(_status(self.target))
        if found.kind in (cachefile.MISSING, cachefile.EMPTY):
            return None
        if found.kind == cachefile.DAMAGED:
            return found.detail  # known from its header: nothing more to read
        if found.kind not in (cachefile.CURRENT, cachefile.FORMAT1):
            self._set_unwritable(f"it {found.detail}; it is left untouched")
            return None
        try:
            with open(self.target, "rb") as file:
                status = os.fstat(file.fileno())
                data = file.read(cachefile.max_bytes() + 1)
        except OSError as error:
            self._set_unwritable(f"it cannot be read ({_reason(error)})")
            return None
        try:
            if found.kind == cachefile.FORMAT1:
                self._raw = cachefile.read_format1(data)
            else:
                contents = cachefile.read(data)
                self._raw = contents.snapshot or {}
                self._snapshot_bytes = contents.snapshot_end
                self._apply_contents(contents)
                self._end = contents.end
                self._needs_snapshot = False
        except cachefile.CacheFormatError as problem:
            self._raw = {}
            return str(problem)
        self._signature = (status.st_ino, status.st_dev)
        self._seen = _seen(status)
        return None

    def _load_or_move_aside(self) -> None:
        """Load the file (the file lock must be held); a damaged cache is moved aside."""
        found = cachefile.probe(self.target)
        problem = self._load(found)
        if problem is None:
            return
        self._raw = {}
        moved_to = self._move_aside()
        self._warn(f"fastrun cache file {self.path} cannot be read: {problem}. It was moved "
                   f"to {moved_to}; an empty cache is used instead, so its results will be "
                   "measured again.", CacheCorruptWarning)
        self._signature, self._end, self._needs_snapshot = None, 0, True
        self._seen = None

    def _apply_contents(self, contents: cachefile.Contents) -> None:
        for category, key, raws in contents.puts:
            self._apply(category, key, _entries_from_raw(category, key, raws, self.skipped))
        for problem in contents.skipped:
            logger.warning("cache file %s: %s (category %r, key %r)", self.path, problem[2],
                           problem[0], problem[1])
        self.skipped.extend(contents.skipped)

    def _apply(self, category: str, key: str, entries: list[Entry]) -> None:
        """Merge entries into the in-memory state (the state is replaced key by key, so an
        iteration in progress keeps a consistent snapshot of each key)."""
        keys = self._raw.setdefault(category, {})
        old = keys.get(key)
        merged = merge_entries(_entries_from_raw(category, key, old) if old else (), entries)
        keys[key] = [entry_to_raw(entry) for entry in merged]

    def _warn(self, message: str, category: type[Warning]) -> None:
        logger.warning("%s", message)
        warnings.warn(message, category, stacklevel=4)

    def _set_unwritable(self, reason: str, corrupt: bool = False) -> None:
        if self.unwritable is None:
            self._warn(f"fastrun cache file {self.path} is not used: {reason}. This run keeps "
                       "its measurements in memory.",
                       CacheCorruptWarning if corrupt else CacheUnwritableWarning)
        self.unwritable = reason

    def _move_aside(self) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = f"{self.target}.corrupt-{stamp}"
        counter = 0
        while os.path.exists(target):
            counter += 1
            target = f"{self.target}.corrupt-{stamp}-{counter}"
        os.rename(self.target, target)
        return target

    def _catch_up(self) -> None:
        """Apply what other processes wrote since the last read: the appended records alone
        when the file only grew, else the whole file."""
        status = _status(self.target)
        if _seen(status) == self._seen:
            return
        if (status is not None and not self._needs_snapshot
                and (status.st_ino, status.st_dev) == self._signature
                and status.st_size > self._end and self._read_tail(status)):
            return
        logger.debug("cache file %s changed on disk; reloading", self.path)
        self.reload()

    def _read_tail(self, status: os.stat_result) -> bool:
        """Read and apply the whole records appended after ``self._end`` (a record still
        being written is left for later); False when the file is no longer the one loaded."""
        try:
            with open(self.target, "rb") as file:
                current = os.fstat(file.fileno())
                if (current.st_ino, current.st_dev) != self._signature:
                    return False
                file.seek(self._end)
                data = file.read(max(0, min(current.st_size, cachefile.max_bytes()) - self._end))
        except OSError:
            return False
        contents = cachefile.read_log(data)
        self._apply_contents(contents)
        self._end += contents.end
        self._seen = _seen(current)
        return True

    def get(self, category: str, key: str) -> list[Entry] | None:
        with self._lock:
            raws = self._raw.get(category, {}).get(key)
            if raws is None:
                self._catch_up()
                raws = self._raw.get(category, {}).get(key)
                if raws is None:
                    return None
        return _entries_from_raw(category, key, raws)

    def __iter__(self) -> Iterator[tuple[str, str, list[Entry]]]:
        """Every stored problem, as of the last load or write (call ``reload`` for the latest)."""
        with self._lock:
            snapshot = [(category, key, raws) for category, keys in self._raw.items()
                        for key, raws in keys.items()]
        for category, key, raws in snapshot:
            yield category, key, _entries_from_raw(category, key, raws)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(keys) for keys in self._raw.values())

    def categories(self) -> list[str]:
        with self._lock:
            return list(self._raw)

    def keys(self, category: str) -> list[str]:
        with self._lock:
            return list(self._raw.get(category, ()))

    # ---- writing

    def put(self, category: str, key: str, entries: Iterable[Entry]) -> None:
        self.put_many([(category, key, entries)])

    def put_many(self, items: Iterable[tuple[str, str, Iterable[Entry]]]) -> None:
        batch = [(category, key, check_entries(category, key, entries))
                 for category, key, entries in items]
        if not batch:
            return
        with self._lock:
            if self.read_only and self.unwritable is None:
                self.unwritable = "opened read-only: this run searches nothing"
            if self.unwritable is None:
                try:
                    with self._locked_file():
                        self._write_batch(batch)
                    logger.debug("wrote %d problem(s) to cache file %s", len(batch), self.path)
                    return
                except OSError as error:
                    self._set_unwritable(f"it cannot be written ({_reason(error)})")
            for category, key, entries in batch:
                self._apply(category, key, entries)
            self._unsaved.extend(batch)

    def _write_batch(self, batch: list[tuple[str, str, list[Entry]]]) -> None:
        """Under the file lock: catch up with the file, then append the batch's records (or
        write a whole new file where there is no format-2 file yet)."""
        status = _status(self.target)
        if (self._needs_snapshot or status is None or status.st_size < self._end
                or (status.st_ino, status.st_dev) != self._signature):
            self._load_or_move_aside()  # replaced, truncated, format 1, or not there yet
        elif status.st_size > self._end:
            self._read_tail(status)
        if self.unwritable is not None:
            raise OSError(self.unwritable)
        for category, key, entries in batch:
            self._apply(category, key, entries)
        if self._needs_snapshot:
            self._write_snapshot()
            return
        records = b"".join(cachefile.put_record(category, key, [entry_to_raw(e) for e in entries])
                           for category, key, entries in batch)
        with open(self.target, "r+b") as file:
            file.seek(self._end)
            file.write(records)
            file.truncate()  # drops a torn tail that lay beyond the last whole record
            file.flush()
            self._seen = _seen(os.fstat(file.fileno()))
        self._end += len(records)
        if self._end - self._snapshot_bytes > max(self._snapshot_bytes, COMPACT_AFTER_BYTES):
            try:
                self._write_snapshot()
            except OSError as error:  # the records are written: compaction can wait
                logger.warning("cache file %s: could not compact its log (%s)", self.path,
                               _reason(error))

    def _write_snapshot(self) -> None:
        """Replace the file by a snapshot of the whole state (the file lock must be held)."""
        data = cachefile.snapshot_file(self._raw, {"written_at": time.time(),
                                                   "fastrun": _fastrun_version()})
        status = atomic_write(self.target, data)
        self._signature = (status.st_ino, status.st_dev)
        self._seen = _seen(status)
        self._end = self._snapshot_bytes = len(data)
        self._needs_snapshot = False
        self._remove_stale_temporaries()

    def _remove_stale_temporaries(self) -> None:
        """Temporary files of writers killed mid-write: under the lock no writer of this file
        is writing one, so every ``.<name>.*.tmp`` beside it is left over."""
        directory, name = os.path.split(self.target)
        with contextlib.suppress(OSError):
            for leftover in os.listdir(directory):
                if leftover.startswith(f".{name}.") and leftover.endswith(".tmp"):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(directory, leftover))
                        logger.info("removed stale temporary file %s", leftover)

    def rewrite(self, transform: Callable[[Categories], Categories | None],
                force: bool = False) -> bool:
        """Replace the whole file by ``transform(current contents)``, under the file lock.

        For the maintenance tools (``fastrun cache prune``/``merge``/``compact``), which must
        remove or replace entries, something ``put``'s merge can never do. The read, the
        transform and the atomic replace all happen under the file lock, so no concurrent
        ``put`` is lost. ``transform`` may change its argument in place; returning None means
        "no change" and nothing is written (unless ``force``: ``compact`` writes a new
        snapshot of the same contents). Unlike a ``put``, a file that is not a readable cache
        is not moved aside: a tool asked to edit a file must not silently start it over, so
        :class:`CacheFormatError` (naming the file) is raised and the file stays as it is.
        Entries that cannot be read are dropped (and logged). Returns whether it wrote.
        """
        with self._lock, self._locked_file():
            found = cachefile.probe(self.target)
            if found.kind not in (cachefile.MISSING, cachefile.EMPTY, cachefile.CURRENT,
                                  cachefile.FORMAT1):
                raise CacheFormatError(f"cache file {self.path} {found.detail}")
            unwritable, self.unwritable = self.unwritable, None
            problem = self._load(found)
            if problem is not None or self.unwritable is not None:
                self.unwritable = unwritable
                raise CacheFormatError(f"cache file {self.path}: {problem or self.unwritable}")
            current = {
                category: {key: _entries_from_raw(category, key, raws, self.skipped)
                           for key, raws in keys.items()}
                for category, keys in self._raw.items()
            }
            result = transform(current)
            if result is None:
                if not force:
                    return False
                result = current
            self._raw = {
                category: {key: [entry_to_raw(entry) for entry in entries]
                           for key, entries in keys.items()}
                for category, keys in result.items()
            }
            self._write_snapshot()
        logger.debug("rewrote cache file %s", self.path)
        return True

    # ---- measurements that could not be written

    @property
    def unsaved(self) -> int:
        """How many problems' measurements this process could not write to the file."""
        with self._lock:
            return len(self._unsaved)

    def save_unsaved(self, path: str | os.PathLike[str] | None = None) -> str | None:
        """Write the measurements that could not be written: to ``path``, or to this cache's
        own file when ``path`` is None (where it has become writable since).  Returns where
        they went, or None when they could not be written (the reason stays in
        :attr:`unwritable`)."""
        with self._lock:
            batch = list(self._unsaved)
            if not batch:
                return None
            if path is not None and os.path.realpath(path) != self.target:
                other = FileCache(path)
                other.put_many(batch)
                if other.unwritable is not None:
                    return None
                self._unsaved.clear()
                return other.path
            self.unwritable = None
            self._unsaved.clear()
            self.put_many(batch)
            return self.path if self.unwritable is None else None

    def _locked_file(self) -> _TimedLock:
        directory = os.path.dirname(self.target)
        os.makedirs(directory, exist_ok=True)
        return _TimedLock(self._file_lock, config.cache_lock_timeout())

    def __repr__(self) -> str:
        return f"FileCache({self.path!r}, {len(self)} keys)"


class _TimedLock:
    """The file lock with a timeout whose error names the lock and, where known, its holder."""

    def __init__(self, lock: filelock.FileLock, timeout: float) -> None:
        self.lock, self.timeout = lock, timeout

    def __enter__(self) -> None:
        try:
            self.lock.acquire(timeout=self.timeout)
        except filelock.Timeout:
            holder = _lock_holder(self.lock.lock_file)
            held_by = f"held by pid {holder}" if holder else "held by another process"
            raise CacheLockTimeout(
                f"waited {self.timeout:g} s for the lock {self.lock.lock_file}, {held_by} "
                "(FASTRUN_CACHE_LOCK_TIMEOUT sets the wait)") from None

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def _status(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def _seen(status: os.stat_result | None) -> tuple[int, int, int, int] | None:
    if status is None:
        return None
    return (status.st_ino, status.st_dev, status.st_size, status.st_mtime_ns)


def _reason(error: OSError) -> str:
    """An OSError as a short reason: 'Permission denied: /path'."""
    if isinstance(error, CacheLockTimeout):
        return str(error)
    where = f": {error.filename}" if getattr(error, "filename", None) else ""
    return f"{error.strerror or error}{where}"


def _fastrun_version() -> str:
    from fastrun._version import __version__

    return __version__


def read_cache_file(path: str | os.PathLike[str],
                    skipped: list[tuple[str, str, str]] | None = None) -> Categories:
    """Load a cache file without changing anything on disk (for the read-only tools).

    A :class:`FileCache` moves a damaged file aside so that a search can go on; a tool that
    only inspects a file (``fastrun cache show``/``diff``/``export``) must leave it exactly as
    it is and say what is wrong instead. Raises ``FileNotFoundError`` when the file does not
    exist (another ``OSError`` when it cannot be opened) and :class:`CacheFormatError`, naming
    the file and what it holds, when it is not a readable fastrun cache (a directory, a FIFO,
    a newer format, a file over the size limit...). An empty file is an empty cache; entries
    that are not valid are skipped, logged and added to ``skipped`` as (category, key, why).
    """
    path = os.fspath(path)
    _, raw, contents = cachefile.read_file(path)
    found: list[tuple[str, str, str]] = [] if skipped is None else skipped
    result: Categories = {
        category: {key: _entries_from_raw(category, key, raws, found)
                   for key, raws in keys.items()}
        for category, keys in raw.items()
    }
    if contents is not None:
        found.extend(contents.skipped)
        for category, key, raws in contents.puts:
            keys = result.setdefault(category, {})
            keys[key] = merge_entries(keys.get(key, ()),
                                      _entries_from_raw(category, key, raws, found))
    return result


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
