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
* when the same algorithm was measured in both, a steady measurement beats an unstable one
  (:func:`unstable`: a re-measurement replaces the timing a loaded machine spoilt, whatever
  their repeats); then the one with more ``repeats`` wins (it is the better estimate); on
  equal repeats the newer ``measured_at`` wins; if that ties too, the incoming (new) entry
  wins;
* the union is then pruned: an entry is dropped when another entry *with exactly the same
  attributes* is no slower and needs no more workspace.

The file
--------
:class:`FileCache` keeps a cache in a format-3 file (:mod:`fastrun.cache.file`, documented in
``docs/cache-format.md``): a header naming the file's generation, a snapshot, then an
append-only log of measurements written under a file lock, each record framed with a magic,
its length and its checksum, so that several processes share one file without losing each
other's results, a writer killed at any moment leaves at worst a torn last record (detected,
reported and cut by the next writer), a damaged record costs only itself, and a put costs
O(its record).  Entries are kept as plain lists after loading (a cache of 10,000 problems must
load in a few milliseconds), merged as such, and become :class:`Entry` objects, checked field
by field, only when asked for.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from fastrun import config
from fastrun.attribute import AlgoAttribute
from fastrun.base.files import Replacement, is_stale_temporary
from fastrun.cache import file as cachefile
from fastrun.cache.file import CacheFormatError
from fastrun.cache.lock import FileLock, LockTimeout

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

    @property
    def unstable(self) -> bool:
        """Timed on a machine too busy to trust it (see :func:`unstable`)."""
        return unstable(self.time_s, self.spread_s)

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


#: A measurement is unstable when the middle half of its repeats (the interquartile range)
#: spans more than this share of its median.  On a quiet machine the spread is a few percent
#: of the median; issue 36 reported a conv on a loaded 2-core machine cached at 6.33 ms with
#: a spread of 9.73 ms, while a candidate ten times faster there ranked last.
UNSTABLE_SPREAD = 0.5
#: ... and more than this many seconds.  A microsecond-scale step spreads over half its
#: median from timer and interpreter jitter alone (a softmax of 1000 values did, in the test
#: suite on the 2-core VM); flagged, it would be searched again by every fast-run load, for no
#: gain a model could see.
UNSTABLE_FLOOR_S = 20e-6


def unstable(time_s: float, spread_s: float) -> bool:
    """Whether a median of ``time_s`` with interquartile range ``spread_s`` is too noisy to
    rank by: a search re-times such candidates, and a problem whose pick stays unstable is
    low-confidence (:func:`low_confidence`)."""
    return spread_s > max(UNSTABLE_SPREAD * time_s, UNSTABLE_FLOOR_S)


def low_confidence(entries: Sequence[Entry]) -> Entry | None:
    """The fastest entry of a problem if its timing is unstable, else None.  Such a pick may
    be a lucky one: ``fastrun tune`` and searches measure the problem again, and ``cache show``
    marks it.  Derived from the stored spread, so caches of every version carry it."""
    if not entries:
        return None
    fastest = min(entries, key=entry_order)
    return fastest if fastest.unstable else None


def entry_order(entry: Entry) -> tuple[float, int, str]:
    """The order entries are kept and shown in: fastest first, then smaller workspace, then
    the algorithm's name (a sort key)."""
    return (entry.time_s, entry.workspace_bytes, entry.algorithm)


def _pareto(items: Iterable[Any], order: Callable[[Any], Any], attributes: Callable[[Any], Any],
            workspace: Callable[[Any], int]) -> list[Any]:
    """The pruning rule of :func:`prune`, for entries and raw entries alike."""
    kept: list[Any] = []
    # Smallest workspace among the kept entries of each attribute set. Every earlier entry in
    # sort order is no slower, so the new one is dominated iff that minimum is <= its workspace.
    smallest_workspace: dict[Any, int] = {}
    for item in sorted(items, key=order):
        key, size = attributes(item), workspace(item)
        smallest = smallest_workspace.get(key)
        if smallest is not None and smallest <= size:
            continue
        kept.append(item)
        smallest_workspace[key] = size
    return kept


def _union(sources: Iterable[Iterable[Any]], algorithm: Callable[[Any], str],
           rank: Callable[[Any], tuple[float, float]]) -> list[Any]:
    """The merge rule's union, for entries and raw entries alike: one measurement per
    algorithm, the later source's where its (steady, repeats, measured_at) is no smaller."""
    by_algorithm: dict[str, Any] = {}
    for source in sources:
        for item in source:
            name = algorithm(item)
            current = by_algorithm.get(name)
            if current is None or rank(item) >= rank(current):
                by_algorithm[name] = item
    return list(by_algorithm.values())


def prune(entries: Iterable[Entry]) -> list[Entry]:
    """Sort by time and drop every entry dominated by another entry with the same attributes.

    An entry is dominated when another one with exactly the same attributes is no slower and
    needs no more workspace: no strategy and no workspace limit could ever prefer it. Entries with
    different attributes are never compared, so a REPRODUCIBLE choice survives a faster
    non-reproducible one. Ties in time are broken by smaller workspace, then algorithm name; of
    exact duplicates in (time, workspace) the first in that order is kept.
    """
    return _pareto(entries, entry_order, lambda e: e.attributes, lambda e: e.workspace_bytes)


def merge_rank(entry: Entry) -> tuple[bool, int, float]:
    """What decides between two measurements of one algorithm, best highest: the steady one,
    then more repeats, then the newer (a tie goes to the later input)."""
    return (not entry.unstable, entry.repeats, entry.measured_at)


def merge_entries(old: Iterable[Entry], new: Iterable[Entry]) -> list[Entry]:
    """Combine two measurement lists of one key by the module's documented merge rule: the
    union by algorithm (:func:`merge_rank`; a tie goes to the new), pruned."""
    return prune(_union((old, new), lambda e: e.algorithm, merge_rank))


#: Attribute names as a file stores them -> the set they name, for the raw merge.
_KNOWN_ATTRIBUTES = frozenset(m.name for m in AlgoAttribute if m.value)


def merge_raw(category: str, key: str, old: list[list[Any]] | None, new: list[list[Any]],
              skipped: list[tuple[str, str, str]] | None = None,
              checked: bool = False) -> list[list[Any]]:
    """:func:`merge_entries` on raw (stored) entries, without building :class:`Entry`
    objects: a reader applies every log record this way (merging 80,000 entries as objects
    took 1.5 s of a load).  ``new`` entries that are not valid are skipped and reported,
    unless ``checked`` says they were (``old`` ones were checked when they were merged, or
    are checked when used)."""
    valid = new if checked else []
    for raw in () if checked else new if type(new) is list else ():
        problem = cachefile.check_raw(raw)
        if problem is None and not _KNOWN_ATTRIBUTES.issuperset(raw[1]):
            problem = f"unknown attribute in {raw[1]!r}"
        if problem is None:
            valid.append(raw)
            continue
        why = f"malformed cache entry {_short(raw)}: {problem}"
        logger.warning("cache category %r key %r: skipping entry: %s", category, key, why)
        if skipped is not None:
            skipped.append((category, key, why))
    union = _union((old or (), valid), lambda r: r[0],
                   lambda r: (not unstable(r[2], r[3]), r[6], r[7]))
    return _pareto(union, lambda r: (r[2], r[4], r[0]), lambda r: frozenset(r[1]),
                   lambda r: r[4])


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
        batch = [(category, key, check_entries(category, key, entries))
                 for category, key, entries in items]
        with self._lock:
            for category, key, entries in batch:
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
    """``entries`` as a list, or ValueError naming what is wrong when the category, the key
    or an entry would be refused on reading (a NaN or negative time, a name with a tab or a
    trailing space): every put of every cache, in a file or in memory, takes only what every
    reader takes back."""
    return checked_raws(category, key, entries)[0]


def checked_raws(category: str, key: str,
                 entries: Iterable[Entry]) -> tuple[list[Entry], list[list[Any]]]:
    """:func:`check_entries`, and the entries' raw (stored) form, made once."""
    for what, name in (("category", category), ("key", key)):
        problem = cachefile.check_name(what, name)
        if problem is not None:
            raise ValueError(f"cache category {_short(category)} key {_short(key)}: refusing "
                             f"the put: {problem}")
    result = list(entries)
    raws = []
    for entry in result:
        raw = entry_to_raw(entry) if isinstance(entry, Entry) else None
        problem = (f"{type(entry).__name__} is not a cache Entry" if raw is None
                   else cachefile.check_raw(raw))
        if problem is not None:
            raise ValueError(f"cache category {category!r} key {key!r}: refusing entry "
                             f"{getattr(entry, 'algorithm', entry)!r}: {problem}")
        raws.append(raw)
    return result, raws


class CacheUnwritableWarning(UserWarning):
    """A cache file cannot be used or written: the run keeps its measurements in memory."""


class CacheLockTimeout(LockTimeout):
    """Another process held a cache file's lock for longer than the lock timeout."""


class CacheFull(OSError):
    """A write would take the cache file past this process's size limit: refused, never cut."""


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


#: Puts on their way to the file: (category, key, entries, the entries' raw form) each.
_Batch = list[tuple[str, str, list[Entry], list[list[Any]]]]

#: The log is folded into a new snapshot once it is larger than this and than the snapshot.
COMPACT_AFTER_BYTES = 1 << 20

#: How long the last try to save a run's measurements into its own file waits for a lock that
#: already made a put wait the whole timeout (it is stuck, not busy).
RETRY_LOCK_TIMEOUT = 1.0


class FileCache:
    """A cache kept in one file, shared safely between threads and processes.

    The file is format 3 (:mod:`fastrun.cache.file`): a snapshot followed by an append-only log
    of measurements, so a ``put`` appends one record under the lock, O(its record), and a
    lookup that misses reads only the records other processes appended since.  Reading merges
    snapshot and log by the module's merge rule; once the log outgrows the snapshot it is
    compacted into a new snapshot by atomic replace.  A format-1 or format-2 file is read and
    converted on its first write.

    What makes it safe to share (``docs/cache-format.md``, "Sharing"):

    * a process recognises a replaced file by the generation id in its header, never by its
      inode; before every append it checks, under the lock and through the descriptor it
      writes with, that the file is the generation it read and holds whole records up to the
      offset it appends at;
    * no process cuts what it did not verify: the size limit refuses a write
      (:class:`CacheFull`), and only a tail of bytes after the last whole record, which no
      whole record follows, is cut (and reported);
    * a damaged record costs that record only: readers resynchronise on the next one, and
      the damage is reported (:attr:`damage`, one :class:`CacheCorruptWarning`);
    * records other processes appended are checked under the lock but decoded only when this
      process next reads, so the lock is held for the time of an append, not of a merge.

    What a path holds decides what happens to it (:func:`fastrun.cache.file.probe`): a damaged
    fastrun cache (an unreadable header, or not one whole record) is moved aside
    (``<path>.corrupt-<time>``) with a :class:`CacheCorruptWarning`; anything else that is no
    readable cache (a newer format, an ONNX model, JSON, a directory, a FIFO, a device, a file
    over the size limit) is never renamed or overwritten.  Then, and whenever the file cannot
    be written (read-only, full, permission, a lock held too long), the run goes on in memory
    after one :class:`CacheUnwritableWarning` naming the path and the reason;
    :attr:`unwritable` says why, and :meth:`save_unsaved` writes what was measured elsewhere.
    A symlinked path is followed: writes go to its target.
    """

    def __init__(self, path: str | os.PathLike[str], read_only: bool = False) -> None:
        self.path = os.fspath(path)
        #: a run that searches nothing (cache-only): the file is never moved or written, a
        #: damaged one included, and puts stay in memory
        self.read_only = read_only
        #: where the bytes go: a symlink is followed, so a shared target is written, not forked
        self.target = os.path.realpath(self.path)
        self._lock = threading.RLock()
        self._file_lock = FileLock(self.target + ".lock")
        #: held by the one process that compacts the log (the others go on appending)
        self._compacting = FileLock(self.target + ".compacting.lock")
        self._raw: _RawCategories = {}
        #: the generation id of the format-3 file loaded (None: none is, e.g. missing/format 1)
        self._generation: bytes | None = None
        #: offset after the last whole record checked (0: no format-3 file loaded)
        self._end = 0
        self._snapshot_bytes = 0
        self._needs_snapshot = True  # no format-3 file yet (missing, empty, format 1 or 2)
        #: records checked under the lock but not yet decoded into ``_raw``
        self._pending: list[cachefile.Frames] = []
        #: the file was replaced since ``_raw`` was read: read it whole before the next lookup
        self._stale = False
        #: status of a file that has no generation (missing, format 1 or 2) when last read
        self._seen: tuple[int, int, int, int] | None = None
        #: log size at the last compaction that failed (it is tried again once the log doubled)
        self._compaction_failed_at: int | None = None
        #: Why this cache keeps its measurements in memory (None: it writes its file).
        self.unwritable: str | None = None
        self._warned = self._warned_damage = False
        self._unsaved: list[tuple[str, str, list[Entry]]] = []
        #: (category, key, why) of the log's records and entries skipped on reading (snapshot
        #: entries are checked when they are used, and skipped there with a log line).
        self.skipped: list[tuple[str, str, str]] = []
        #: damaged bytes this cache skipped or cut, as they were found (each said once)
        self.damage: list[cachefile.Damage] = []
        self._reported: set[tuple[bytes | None, int]] = set()
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
        self._raw, self._generation, self._end, self._snapshot_bytes = {}, None, 0, 0
        self._needs_snapshot, self._pending, self._stale = True, [], False
        self._seen = _seen(_status(self.target))
        if found.kind in (cachefile.MISSING, cachefile.EMPTY):
            return None
        if found.kind == cachefile.DAMAGED:
            return found.detail  # known from its header: nothing more to read
        if found.kind not in cachefile.READABLE:
            self._set_unwritable(f"it {found.detail}; it is left untouched")
            return None
        try:
            with open(self.target, "rb") as file:
                status = os.fstat(file.fileno())
                data = file.read(cachefile.max_bytes() + 1)
        except OSError as error:
            self._set_unwritable(f"it cannot be read ({_reason(error)})")
            return None
        if len(data) > cachefile.max_bytes():
            self._set_unwritable(_over_limit(len(data)))
            return None
        try:
            contents = cachefile.read_any(found.kind, data)
            if contents is None:
                self._raw = cachefile.read_format1(data)
            else:
                self._raw = contents.snapshot or {}
                self._apply_contents(contents)
                if found.kind == cachefile.CURRENT:
                    self._generation = contents.generation
                    self._end, self._snapshot_bytes = contents.end, contents.snapshot_end
                    self._needs_snapshot = False
        except cachefile.CacheFormatError as problem:
            self._raw = {}
            return str(problem)
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
        self._seen = None

    def _apply_contents(self, contents: cachefile.Contents) -> None:
        for category, key, raws in contents.puts:
            self._apply_raw(category, key, raws)
        for problem in contents.skipped:
            logger.warning("cache file %s: %s (category %r, key %r)", self.path, problem[2],
                           problem[0], problem[1])
        self.skipped.extend(contents.skipped)
        self._report_damage(contents.damage)

    def _report_damage(self, damage: Iterable[cachefile.Damage], action: str = "skipped") -> None:
        """Say each damaged span once (a log line per span, one warning per cache)."""
        fresh = [d for d in damage if (self._generation, d.offset) not in self._reported]
        if not fresh:
            return
        for item in fresh:
            self._reported.add((self._generation, item.offset))
            self.damage.append(item)
            logger.warning("cache file %s: %s %s", self.path, action, item)
        self._warn_once(f"fastrun cache file {self.path} is damaged: {action} "
                        + "; ".join(str(d) for d in fresh[:3])
                        + (f" and {len(fresh) - 3} more" if len(fresh) > 3 else "")
                        + ". Every whole record around the damage is used; `fastrun cache "
                        "check` lists it.", CacheCorruptWarning)

    def _apply_raw(self, category: str, key: str, raws: list[list[Any]],
                   checked: bool = False) -> None:
        """Merge raw entries into the in-memory state (the state is replaced key by key, so an
        iteration in progress keeps a consistent snapshot of each key)."""
        keys = self._raw.setdefault(category, {})
        keys[key] = merge_raw(category, key, keys.get(key), raws, self.skipped, checked)

    def _warn(self, message: str, category: type[Warning]) -> None:
        logger.warning("%s", message)
        warnings.warn(message, category, stacklevel=4)

    def _warn_once(self, message: str, category: type[Warning]) -> None:
        """A Python warning the first time only (the log has every line)."""
        if not self._warned_damage:
            self._warned_damage = True
            warnings.warn(message, category, stacklevel=5)

    def _set_unwritable(self, reason: str, corrupt: bool = False) -> None:
        if not self._warned:
            self._warned = True
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

    def _fresh(self) -> None:
        """Bring ``_raw`` up to what was read: the whole file again where it was replaced,
        else the records checked since (the lock held by the caller: ``self._lock``)."""
        if self._stale:
            self.reload()
        while self._pending:
            contents = cachefile.Contents()
            cachefile.decode(self._pending.pop(0), contents)
            self._apply_contents(contents)

    def _catch_up(self) -> None:
        """Apply what other processes wrote since the last read: the appended records alone
        when the file is the same generation and grew, else the whole file."""
        if self._generation is None:
            status = _status(self.target)
            if status is not None and _seen(status) != self._seen:
                self.reload()
            return
        try:
            with open(self.target, "rb") as file:
                head = file.read(cachefile.HEADER_SIZE)
                size = os.fstat(file.fileno()).st_size
                if _generation_of(head) != self._generation or size < self._end:
                    replaced = True
                else:
                    replaced = False
                    if size > cachefile.max_bytes():
                        self._set_unwritable(_over_limit(size))
                        return
                    file.seek(self._end)
                    data = file.read(size - self._end)
        except FileNotFoundError:
            replaced = True
        except OSError:
            return
        if replaced:
            logger.debug("cache file %s was replaced; reading it again", self.path)
            self.reload()
            return
        if data:
            frames = cachefile.scan(data, 0, self._end)
            self._end = frames.end
            self._pending.append(frames)
        self._fresh()

    def get(self, category: str, key: str) -> list[Entry] | None:
        with self._lock:
            self._fresh()
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
            self._fresh()
            snapshot = [(category, key, raws) for category, keys in self._raw.items()
                        for key, raws in keys.items()]
        for category, key, raws in snapshot:
            yield category, key, _entries_from_raw(category, key, raws)

    def __len__(self) -> int:
        with self._lock:
            self._fresh()
            return sum(len(keys) for keys in self._raw.values())

    def categories(self) -> list[str]:
        with self._lock:
            self._fresh()
            return list(self._raw)

    def keys(self, category: str) -> list[str]:
        with self._lock:
            self._fresh()
            return list(self._raw.get(category, ()))

    # ---- writing

    def put(self, category: str, key: str, entries: Iterable[Entry]) -> None:
        self.put_many([(category, key, entries)])

    def put_many(self, items: Iterable[tuple[str, str, Iterable[Entry]]]) -> None:
        batch = [(category, key, *checked_raws(category, key, entries))
                 for category, key, entries in items]
        if batch:
            self._put_batch(batch, config.CACHE_LOCK_TIMEOUT.get())

    def _put_batch(self, batch: _Batch, timeout: float) -> None:
        # The records are encoded before the lock is taken: under it, only the append.
        records = b"".join(cachefile.put_record(category, key, raws)
                           for category, key, _, raws in batch)
        with self._lock:
            if self.read_only and self.unwritable is None:
                self.unwritable = "opened read-only: this run searches nothing"
            if self.unwritable is None:
                try:
                    with self._locked_file(timeout):
                        self._write_batch(batch, records)
                    logger.debug("wrote %d problem(s) to cache file %s", len(batch), self.path)
                except OSError as error:
                    self._set_unwritable(f"it cannot be written ({_reason(error)})")
                else:
                    self._compact_if_due()
                    return
            self._apply_batch(batch)
            self._unsaved.extend((category, key, entries) for category, key, entries, _ in batch)

    def _apply_batch(self, batch: _Batch) -> None:
        for category, key, _, raws in batch:
            self._apply_raw(category, key, raws, checked=True)

    def _write_batch(self, batch: _Batch, records: bytes) -> None:
        """Under the file lock: check the file against what was read (its generation, whole
        records up to the end), then append ``records`` there, or write a whole new file where
        there is no format-3 file yet."""
        fd = self._open_checked()
        if fd is None:
            self._load_or_move_aside()  # missing, format 1 or 2, damaged, or foreign
            if self.unwritable is not None:
                raise OSError(self.unwritable)
            fd = None if self._needs_snapshot else self._open_checked()
        if fd is None:
            self._apply_batch(batch)
            self._write_snapshot()
            return
        try:
            limit = cachefile.max_bytes()
            if self._end + len(records) > limit:
                raise CacheFull(errno.EFBIG, f"the file would grow to {self._end + len(records)} "
                                f"bytes, over this process's limit of {limit} "
                                "(FASTRUN_CACHE_MAX_BYTES); nothing in it was cut")
            written = os.pwrite(fd, records, self._end)
            if written != len(records):
                raise OSError(errno.ENOSPC, f"only {written} of {len(records)} bytes written")
            self._end += len(records)
        finally:
            os.close(fd)
        self._apply_batch(batch)

    def _compact_if_due(self) -> None:
        """Fold the log into a new snapshot once it outgrew the snapshot (and
        :data:`COMPACT_AFTER_BYTES`); a compaction that fails is said once and tried again
        when the log has doubled."""
        log = self._end - self._snapshot_bytes
        if not (log > max(self._snapshot_bytes, COMPACT_AFTER_BYTES) and (
                self._compaction_failed_at is None or log > 2 * self._compaction_failed_at)):
            return
        try:
            # One process compacts; the others, finding it at work, go on appending (64
            # writers each reading and encoding the whole file at once took 30 s on 2 cores).
            if not self._compacting.try_acquire():
                return
            try:
                self._fresh()
                self._replace(self._raw, self._generation, self._end)
            finally:
                self._compacting.release()
            self._compaction_failed_at = None
        except OSError as error:  # the records are written: compaction can wait
            if self._compaction_failed_at is None:
                logger.warning("cache file %s: could not compact its log (%s); tried again "
                               "once the log has doubled", self.path, _reason(error))
            self._compaction_failed_at = log

    def _replace(self, raw: _RawCategories, generation: bytes | None, end: int) -> bool:
        """Replace the file by a snapshot of ``raw``, which holds the file of ``generation``
        up to ``end``, and the records appended after ``end`` meanwhile, copied as they are.
        The snapshot is encoded and written to disk before the lock is taken; under it, only
        the records since ``end`` are read and the file renamed.  False, and nothing written,
        when the file is no longer that generation (another process replaced it first)."""
        data = cachefile.snapshot_file(raw, {"written_at": time.time(),
                                            "fastrun": _fastrun_version()})
        with Replacement(self.target, data) as replacement, self._locked_file():
            checked = len(self._pending)
            fd = self._open_checked()
            if fd is not None:
                os.close(fd)
            if fd is None or self._generation != generation or self._stale:
                replacement.discard()
                return False
            records = b"".join(frames.whole_records() for frames in self._pending[checked:])
            replacement.append(records)
            replacement.commit()
            self._generation = cachefile.generation(data)
            self._snapshot_bytes = len(data)
            self._end = len(data) + len(records)
            # the records since ``end`` are still to be decoded (self._pending), their offsets
            # those of the old file: only damage reports use them
            self._remove_stale_temporaries()
        return True

    def _open_checked(self) -> int | None:
        """The file opened for writing, once checked to be the format-3 generation that was
        read with whole records up to ``_end``; the records others appended since are checked
        (and kept to decode later), and a torn tail after them is cut.  None when the file must
        be read again whole (missing, replaced by an unreadable or older file)."""
        if self._needs_snapshot:
            return None
        try:
            fd = os.open(self.target, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size > cachefile.max_bytes():
                raise CacheFull(errno.EFBIG, _over_limit(size))
            if _generation_of(os.pread(fd, cachefile.HEADER_SIZE, 0)) != self._generation \
                    or size < self._end:
                if not self._adopt(fd, size):
                    os.close(fd)
                    return None
            elif size > self._end:
                frames = cachefile.scan(os.pread(fd, size - self._end, self._end), 0, self._end)
                self._checked(fd, frames)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _adopt(self, fd: int, size: int) -> bool:
        """Take on a file that replaced the one read (another process compacted it): check its
        header and records, remember to read it whole before the next lookup (this state is
        a part of it, unless a tool removed entries), and append to it.  False when it is no
        readable format-3 file."""
        data = os.pread(fd, size, 0)
        try:
            generation = cachefile.generation(data)
        except cachefile.CacheFormatError:
            return False
        frames = cachefile.scan(data, cachefile.HEADER_SIZE)
        if not frames.bodies:
            return False
        logger.debug("cache file %s was replaced; appending to the new file", self.path)
        self._generation, self._pending, self._stale = generation, [], True
        offset, body = frames.bodies[0]
        self._snapshot_bytes = (offset + cachefile.RECORD_HEADER_SIZE + len(body)
                                if offset == cachefile.HEADER_SIZE else 0)
        self._end = cachefile.HEADER_SIZE
        self._checked(fd, frames)
        return True

    def _checked(self, fd: int, frames: cachefile.Frames) -> None:
        """Keep records checked under the lock to decode later, report damage, and cut a torn
        tail: bytes after the last whole record that no whole record follows are what a writer
        killed mid-append left (under the lock nobody is appending)."""
        self._report_damage(frames.damage)
        if not self._stale:
            self._pending.append(frames)
        if frames.tail:
            cut = cachefile.Damage(frames.end, frames.tail, "a write cut short (no whole record "
                                   "follows); cut off before appending")
            os.ftruncate(fd, frames.end)
            self._report_damage([cut], action="dropped")
        self._end = frames.end

    def _write_snapshot(self) -> None:
        """Replace the file by a snapshot of the whole state (the file lock must be held)."""
        data = cachefile.snapshot_file(self._raw, {"written_at": time.time(),
                                                   "fastrun": _fastrun_version()})
        Replacement(self.target, data).commit()
        self._generation = cachefile.generation(data)
        self._end = self._snapshot_bytes = len(data)
        self._needs_snapshot, self._pending, self._stale = False, [], False
        self._remove_stale_temporaries()

    def _remove_stale_temporaries(self) -> None:
        """Temporary files of writers killed mid-write
        (:func:`fastrun.base.files.is_stale_temporary`: a compaction writes its temporary
        file before it takes the lock, so a live one may be there; it names its host and
        process)."""
        directory, name = os.path.split(self.target)
        with contextlib.suppress(OSError):
            for leftover in os.listdir(directory):
                if is_stale_temporary(directory, name, leftover):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(directory, leftover))
                        logger.info("removed stale temporary file %s", leftover)

    def rewrite(self, transform: Callable[[Categories], Categories | None] | None,
                force: bool = False) -> bool:
        """Replace the whole file by ``transform(current contents)``.

        For the maintenance tools (``fastrun cache prune``/``merge``/``compact``), which must
        remove or replace entries, something ``put``'s merge can never do. The read, the
        transform and the atomic replace all happen under the file lock, so no concurrent
        ``put`` is lost. ``transform`` may change its argument in place; returning None means
        "no change" and nothing is written (unless ``force``: ``compact`` writes a new
        snapshot of the same contents, and passes no ``transform`` at all). The read and the
        transform happen before the lock is taken; under it, the records appended meanwhile
        are copied after the new snapshot, and the file renamed. Unlike a ``put``, a file that
        is not a readable cache is not moved aside: a tool asked to edit a file must not
        silently start it over, so :class:`CacheFormatError` (naming the file) is raised and
        the file stays as it is.
        Entries that cannot be read are dropped (and logged); every whole record around a
        damaged one is kept. Returns whether it wrote.
        """
        with self._lock:
            # The read and the transform happen before the lock is taken, the rename under it
            # with the records appended meanwhile (see _replace); should another process
            # replace the file in between, again, and at last all of it under the lock.
            for _ in range(3):
                found = self._load_for_rewrite()
                if found.kind != cachefile.CURRENT:
                    break  # no generation to check the file against
                generation, end = self._generation, self._end
                result = self._transformed(transform, force)
                if result is None:
                    return False
                if self._replace(result, generation, end):
                    self._raw = result
                    logger.debug("rewrote cache file %s", self.path)
                    return True
            with self._locked_file():
                self._load_for_rewrite()
                result = self._transformed(transform, force)
                if result is None:
                    return False
                self._raw = result
                self._write_snapshot()
        logger.debug("rewrote cache file %s", self.path)
        return True

    def _load_for_rewrite(self) -> cachefile.Probe:
        """Read the file for :meth:`rewrite`: a file that is no readable cache is an error."""
        found = cachefile.probe(self.target)
        if found.kind not in (cachefile.MISSING, cachefile.EMPTY, *cachefile.READABLE):
            raise CacheFormatError(f"cache file {self.path} {found.detail}")
        unwritable, self.unwritable = self.unwritable, None
        problem = self._load(found)
        if problem is not None or self.unwritable is not None:
            self.unwritable = unwritable
            raise CacheFormatError(f"cache file {self.path}: {problem or self.unwritable}")
        return found

    def _transformed(self, transform: Callable[[Categories], Categories | None] | None,
                     force: bool) -> _RawCategories | None:
        """The state after ``transform``, raw; None when it changes nothing (and not
        ``force``).  No ``transform``: the state with its invalid entries dropped, without
        making an :class:`Entry` of each (what ``compact`` writes)."""
        if transform is None:
            if not force:
                return None
            return {category: {key: merge_raw(category, key, None, raws, self.skipped)
                               for key, raws in keys.items()}
                    for category, keys in self._raw.items()}
        current = {
            category: {key: _entries_from_raw(category, key, raws, self.skipped)
                       for key, raws in keys.items()}
            for category, keys in self._raw.items()
        }
        result = transform(current)
        if result is None:
            if not force:
                return None
            result = current
        return {category: {key: [entry_to_raw(entry) for entry in entries]
                           for key, entries in keys.items()}
                for category, keys in result.items()}

    # ---- measurements that could not be written

    @property
    def unsaved(self) -> int:
        """How many problems' measurements this process could not write to the file."""
        with self._lock:
            return len(self._unsaved)

    def save_unsaved(self, path: str | os.PathLike[str] | None = None) -> str | None:
        """Write the measurements that could not be written: to ``path``, or to this cache's
        own file when ``path`` is None (where it has become writable since; a lock that made a
        put wait the whole timeout is waited for only :data:`RETRY_LOCK_TIMEOUT` more).
        Returns where they went, or None when they could not be written (the reason stays in
        :attr:`unwritable`; nothing is said twice)."""
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
            timeout = config.CACHE_LOCK_TIMEOUT.get()
            if self.unwritable is not None and "waited" in self.unwritable:
                timeout = min(timeout, RETRY_LOCK_TIMEOUT)
            self.unwritable = None
            self._unsaved.clear()
            self._put_batch([(category, key, *checked_raws(category, key, entries))
                             for category, key, entries in batch], timeout)
            return self.path if self.unwritable is None else None

    def _locked_file(self, timeout: float | None = None) -> _TimedLock:
        directory = os.path.dirname(self.target)
        os.makedirs(directory, exist_ok=True)
        return _TimedLock(self._file_lock,
                          config.CACHE_LOCK_TIMEOUT.get() if timeout is None else timeout)

    def __repr__(self) -> str:
        return f"FileCache({self.path!r}, {len(self)} keys)"


class _TimedLock:
    """The file lock with a timeout whose error names the lock and, where known, its holder."""

    def __init__(self, lock: FileLock, timeout: float) -> None:
        self.lock, self.timeout = lock, timeout

    def __enter__(self) -> None:
        try:
            self.lock.acquire(self.timeout)
        except LockTimeout:
            holder = _lock_holder(self.lock.path)
            held_by = f"held by pid {holder}" if holder else "held by another process"
            raise CacheLockTimeout(
                f"waited {self.timeout:g} s for the lock {self.lock.path}, {held_by} "
                "(FASTRUN_CACHE_LOCK_TIMEOUT sets the wait)") from None

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def _generation_of(head: bytes) -> bytes | None:
    """The generation id in a header's bytes, or None for anything else."""
    try:
        return cachefile.generation(head)
    except cachefile.CacheFormatError:
        return None


def _over_limit(size: int) -> str:
    return (f"it is {size} bytes, over this process's limit of {cachefile.max_bytes()} "
            "(FASTRUN_CACHE_MAX_BYTES); it is left as it is")


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
    if isinstance(error, CacheLockTimeout | CacheFull):
        return str(error.strerror or error) if isinstance(error, CacheFull) else str(error)
    where = f": {error.filename}" if getattr(error, "filename", None) else ""
    return f"{error.strerror or error}{where}"


def _fastrun_version() -> str:
    from fastrun._version import __version__

    return __version__


def read_cache_file(path: str | os.PathLike[str],
                    skipped: list[tuple[str, str, str]] | None = None,
                    damage: list[cachefile.Damage] | None = None) -> Categories:
    """Load a cache file without changing anything on disk (for the read-only tools).

    A :class:`FileCache` moves a damaged file aside so that a search can go on; a tool that
    only inspects a file (``fastrun cache show``/``check``/``diff``/``export``) must leave it
    exactly as it is and say what is wrong instead. Raises ``FileNotFoundError`` when the file
    does not exist (another ``OSError`` when it cannot be opened) and
    :class:`CacheFormatError`, naming the file and what it holds, when it is not a readable
    fastrun cache (a directory, a FIFO, a newer format, a file over the size limit...). An
    empty file is an empty cache; entries that are not valid are skipped, logged and added to
    ``skipped`` as (category, key, why); damaged bytes skipped between whole records, and a
    tail of bytes after the last one, are added to ``damage``.
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
        if damage is not None:
            damage.extend(contents.damage)
            if contents.torn:
                damage.append(cachefile.Damage(contents.end, contents.torn,
                                               "a tail that is no whole record (a write cut "
                                               "short, or one still in progress)"))
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
            path = config.CACHE.get()
            _default = FileCache(path) if path else InMemoryCache()
            logger.debug("default cache: %r", _default)
        return _default


def set_default_cache(cache: PersistentCache | None) -> None:
    """Replace the process-wide cache; None resets it to be created again from the environment."""
    global _default
    with _default_lock:
        _default = cache
