"""The cache file's bytes: format 2, an append-only log of measurements behind a snapshot.

Why a log: format 1 was one msgpack document, so every ``put`` re-read, re-encoded and
replaced the whole file under the lock (418 ms at 50,000 problems).  Here a ``put`` appends one
record, so it costs O(its record), and a reader that already holds the file reads only the
records appended since.  See ``docs/cache-format.md`` for the layout; in short::

    header  = MAGIC (8 bytes) + version (uint16, little-endian) + 2 reserved bytes
    record  = length (uint32 LE) + crc32 of the payload (uint32 LE) + payload (msgpack)
    file    = header, one snapshot record, then any number of put records

    snapshot payload = ["snapshot", {"written_at": time, "fastrun": version},
                        [[category facts, {key: [raw_entry, ...]}], ...]]
    put payload      = ["put", category facts, key, [raw_entry, ...]]

A record whose length runs past the end of the file or whose checksum does not match ends the
log: it is the torn tail of a writer that was killed, and it is dropped (a writer truncates it
under the lock before appending).  A bad snapshot makes the file a *damaged* fastrun cache.

This module only reads and writes bytes and checks values; what entries mean, how they merge
and who may write when is :mod:`fastrun.cache`'s business.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import stat
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack

from fastrun import category as categories_module
from fastrun.category import CategoryError
from fastrun.formats import CACHE_FORMAT1_NAME

MAGIC = b"FASTRUN\x1a"  # \x1a: a text tool stops there; no text or msgpack file starts so
VERSION = 2
_HEADER = struct.Struct("<8sHH")
HEADER_SIZE = _HEADER.size
_RECORD = struct.Struct("<II")
RECORD_HEADER_SIZE = _RECORD.size

#: Number of fields of a raw (on-disk) entry.
RAW_ENTRY_FIELDS = 9

# -- bounds of an entry's values (docs/cache-format.md, "Validation") --------------------------
#: A measured time above a day is no kernel time.
MAX_TIME_S = 86400.0
#: Workspace above 1 PiB is no machine's.
MAX_WORKSPACE = 1 << 50
MAX_REPEATS = 10**9
#: Measurements are dated from the epoch to 2100-01-01 (UTC): a date a tool can print.
MIN_MEASURED_AT, MAX_MEASURED_AT = 0.0, 4102444800.0
MAX_TEXT = 1024

#: Default bound on a cache file's size (``FASTRUN_CACHE_MAX_BYTES``): a file beyond it is not
#: read, so a wrong path (a disk image, /dev/zero) cannot exhaust memory.
DEFAULT_MAX_BYTES = 1 << 30

RawEntry = list[Any]
#: category text -> key -> raw entries
RawCategories = dict[str, dict[str, list[RawEntry]]]


class CacheFormatError(ValueError):
    """A file's contents are not a readable fastrun cache (the message says what was found)."""


# -- what a path holds ---------------------------------------------------------------------

#: kinds :func:`probe` tells apart
EMPTY, CURRENT, FORMAT1, NEWER, DAMAGED, FOREIGN, NOT_A_FILE, TOO_LARGE, MISSING, UNREADABLE = (
    "empty", "current", "format 1", "newer", "damaged", "foreign", "not a file", "too large",
    "missing", "unreadable")


@dataclass
class Probe:
    """What a cache path holds, found without reading more than its first bytes.

    ``kind`` is one of the constants above; ``detail`` is a sentence for the user.  Only
    ``DAMAGED`` files (clearly fastrun caches that cannot be read) may be moved aside; a file
    of a newer format or a file that is not a fastrun cache is never renamed or overwritten.
    """

    kind: str
    detail: str = ""


def max_bytes() -> int:
    from fastrun import config

    return config.cache_max_bytes()


def probe(path: str, limit: int | None = None) -> Probe:
    """Classify ``path`` from its status and first bytes (never opens a FIFO or a device)."""
    limit = max_bytes() if limit is None else limit
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return Probe(MISSING, "does not exist")
    except OSError as error:
        return _unreadable(path, error)
    if stat.S_ISDIR(status.st_mode):
        return Probe(NOT_A_FILE, "is a directory, not a cache file")
    if not stat.S_ISREG(status.st_mode):
        what = ("a named pipe (FIFO)" if stat.S_ISFIFO(status.st_mode) else
                "a device" if stat.S_ISCHR(status.st_mode) or stat.S_ISBLK(status.st_mode)
                else "a socket" if stat.S_ISSOCK(status.st_mode) else "not a regular file")
        return Probe(NOT_A_FILE, f"is {what}, not a cache file")
    if status.st_size == 0:
        return Probe(EMPTY, "is empty")
    if status.st_size > limit:
        return Probe(TOO_LARGE, f"is {status.st_size} bytes, over the {limit}-byte limit on "
                     "cache files (FASTRUN_CACHE_MAX_BYTES)")
    try:
        with open(path, "rb") as file:
            head = file.read(64)
    except OSError as error:
        return _unreadable(path, error)
    return _classify(head)


def _unreadable(path: str, error: OSError) -> Probe:
    return Probe(UNREADABLE, f"cannot be read ({error.strerror or error}: {path})")


def _classify(head: bytes) -> Probe:
    if head.startswith(MAGIC):
        if len(head) < HEADER_SIZE:
            return Probe(DAMAGED, "is a fastrun cache cut short inside its header")
        _, version, _ = _HEADER.unpack_from(head)
        if version > VERSION:
            return Probe(NEWER, f"was written by a newer fastrun (cache format {version}; this "
                         f"fastrun reads formats 1 to {VERSION})")
        if version != VERSION:
            return Probe(DAMAGED, f"is a fastrun cache with an unknown format {version}")
        return Probe(CURRENT)
    if CACHE_FORMAT1_NAME.encode() in head[:40] and head[:1] in (b"\x83", b"\x82", b"\x84",
                                                                   b"\x85"):
        return Probe(FORMAT1)  # a msgpack map naming the format-1 document
    return Probe(FOREIGN, f"is not a fastrun cache ({_looks_like(head)})")


def _looks_like(head: bytes) -> str:
    stripped = head.lstrip()
    if stripped[:1] in (b"{", b"["):
        return "it looks like JSON or text"
    if head[:1] == b"\x08":
        return "it looks like a protobuf message such as an ONNX model"
    if head[:4] == b"PK\x03\x04":
        return "it looks like a zip archive"
    if (head[:1] and 0x80 <= head[0] <= 0x8f) or head[:1] in (b"\xde", b"\xdf"):
        return "a msgpack map of another format"
    try:
        head.decode("ascii")
        return "it looks like text"
    except UnicodeDecodeError:
        return f"it begins with bytes {head[:8].hex()}"


# -- values --------------------------------------------------------------------------------

def _finite(value: Any, name: str, low: float, high: float) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{name} is {type(value).__name__}, not a number"
    if not math.isfinite(value):
        return f"{name} is {value}, not a finite number"
    if not low <= value <= high:
        return f"{name} {value!r} is outside [{low:g}, {high:g}]"
    return None


def check_raw(raw: Any) -> str | None:
    """What is wrong with one stored entry, or None: every field's type and range
    (finite non-negative times, bounded workspace and repeats, a date before 2100).
    An entry that fails is skipped and reported; it never crashes a lookup or a tool."""
    if type(raw) is not list or len(raw) != RAW_ENTRY_FIELDS:
        return f"not a list of {RAW_ENTRY_FIELDS} fields"
    algorithm, names, time_s, spread_s, workspace, error, repeats, measured_at, version = raw
    if not isinstance(algorithm, str) or not 0 < len(algorithm) <= MAX_TEXT:
        return "algorithm is not a non-empty string"
    if not isinstance(version, str) or len(version) > MAX_TEXT:
        return "version is not a string"
    if type(names) is not list or not all(isinstance(name, str) for name in names):
        return "attributes are not a list of names"
    problem = (_finite(time_s, "time_s", 0.0, MAX_TIME_S)
               or _finite(spread_s, "spread_s", 0.0, MAX_TIME_S)
               or _finite(measured_at, "measured_at", MIN_MEASURED_AT, MAX_MEASURED_AT)
               or (None if error is None else _finite(error, "error", 0.0, math.inf)))
    if problem:
        return problem
    for value, name, high in ((workspace, "workspace_bytes", MAX_WORKSPACE),
                              (repeats, "repeats", MAX_REPEATS)):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{name} is {value!r}, not an integer"
        if not 0 <= value <= high:
            return f"{name} {value} is outside [0, {high}]"
    return None


# -- records -------------------------------------------------------------------------------

def _pack(payload: Any) -> bytes:
    return msgpack.packb(payload, use_bin_type=True)


def record(payload: Any) -> bytes:
    """One record's bytes: length, checksum, payload."""
    data = _pack(payload)
    return _RECORD.pack(len(data), zlib.crc32(data)) + data


def header() -> bytes:
    return _HEADER.pack(MAGIC, VERSION, 0)


#: The one fact of a category text that is not in the documented form (a library user's own
#: namespace): stored and read back verbatim.
_VERBATIM = "text"


def _facts(category: str) -> dict[str, str]:
    """A category's map for the file: its facts, or the text itself when it is not in the
    documented form (so that any text a caller uses comes back exactly)."""
    try:
        parsed = categories_module.parse(category)
    except CategoryError:
        parsed = None
    if parsed is None or parsed.text != category:
        return {_VERBATIM: category}
    return parsed.facts()


def put_record(category: str, key: str, raws: list[RawEntry]) -> bytes:
    return record(["put", _facts(category), key, raws])


def snapshot_file(raw: RawCategories, meta: dict[str, Any]) -> bytes:
    """A whole format-2 file holding ``raw`` as its snapshot and no log."""
    listed = [[_facts(category), keys] for category, keys in raw.items() if keys]
    return header() + record(["snapshot", meta, listed])


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Unpacking a large snapshot creates ~10^5 lists and the cyclic collector would walk them
    again and again (more than doubling the load time); the data has no cycles."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass
class Contents:
    """What reading a file (or the tail appended since) found.

    ``snapshot``: the snapshot's categories (None when only a tail was read) and
    ``snapshot_end`` the offset after it; ``puts``: the put records in order, as
    ``(category text, key, raw entries)``; ``end``: the offset after the last whole record;
    ``torn``: bytes after ``end`` that are no whole record; ``skipped``: ``(category, key,
    why)`` for records or categories that could not be used.
    """

    snapshot: RawCategories | None = None
    snapshot_end: int = 0
    puts: list[tuple[str, str, list[RawEntry]]] = field(default_factory=list)
    end: int = 0
    torn: int = 0
    skipped: list[tuple[str, str, str]] = field(default_factory=list)


def _records(data: bytes | memoryview, offset: int) -> Iterator[tuple[int, Any]]:
    """``(end offset, payload)`` of each whole record from ``offset``; stops at a torn one."""
    size = len(data)
    while offset + RECORD_HEADER_SIZE <= size:
        length, checksum = _RECORD.unpack_from(data, offset)
        start = offset + RECORD_HEADER_SIZE
        if length > size - start:
            return
        body = data[start:start + length]
        if zlib.crc32(body) != checksum:
            return
        try:
            payload = msgpack.unpackb(body, raw=False, strict_map_key=False)
        except Exception:  # msgpack raises several unrelated types; the checksum matched
            return
        offset = start + length
        yield offset, payload


def _category_text(facts: Any) -> str:
    if isinstance(facts, dict) and list(facts) == [_VERBATIM]:
        text = facts[_VERBATIM]
        if not isinstance(text, str) or len(text) > MAX_TEXT * 4:
            raise CategoryError("a category text that is not a string")
        return text
    return categories_module.Category.from_facts(facts).text


def read(data: bytes) -> Contents:
    """Decode a whole format-2 file; :class:`CacheFormatError` when its header or snapshot is
    unreadable (a torn or bad log record only ends the log)."""
    if len(data) < HEADER_SIZE or not data.startswith(MAGIC):
        raise CacheFormatError("no fastrun cache header")
    view = memoryview(data)
    with _gc_paused():
        first = next(_records(view, HEADER_SIZE), None)
        if first is None:
            raise CacheFormatError("its snapshot record is cut short or fails its checksum")
        skipped: list[tuple[str, str, str]] = []
        snapshot = _snapshot(first[1], skipped)
        contents = _log(view, first[0])
    contents.snapshot, contents.snapshot_end = snapshot, first[0]
    contents.skipped[:0] = skipped
    return contents


def read_log(data: bytes) -> Contents:
    """Decode put records appended to a file, ``data`` starting at a record's beginning
    (a reader catching up); offsets in the result are relative to ``data``."""
    with _gc_paused():
        return _log(memoryview(data), 0)


def _log(view: memoryview, start: int) -> Contents:
    contents = Contents(end=start)
    for end, payload in _records(view, start):
        contents.end = end
        _put(payload, contents)
    contents.torn = len(view) - contents.end
    return contents


def _snapshot(payload: Any, skipped: list) -> RawCategories:
    if (type(payload) is not list or len(payload) != 3 or payload[0] != "snapshot"
            or type(payload[2]) is not list):
        raise CacheFormatError("its first record is not a snapshot")
    result: RawCategories = {}
    for item in payload[2]:
        try:
            facts, keys = item
            text = _category_text(facts)
        except (CategoryError, TypeError, ValueError) as problem:
            skipped.append(("?", "*", f"unreadable category: {problem}"))
            continue
        if type(keys) is not dict:
            skipped.append((text, "*", "its problems are not a map"))
            continue
        target = result.setdefault(text, {})
        for key, raws in keys.items():
            if not isinstance(key, str) or type(raws) is not list:
                skipped.append((text, str(key)[:200], "not a key mapped to a list"))
                continue
            target[key] = raws
    return result


def _put(payload: Any, contents: Contents) -> None:
    try:
        kind, facts, key, raws = payload
        if kind != "put" or not isinstance(key, str) or type(raws) is not list:
            raise ValueError("not a put record")
        text = _category_text(facts)
    except (CategoryError, TypeError, ValueError) as problem:
        contents.skipped.append(("?", "?", f"unreadable record: {problem}"))
        return
    contents.puts.append((text, key, raws))


def read_format1(data: bytes) -> RawCategories:
    """A format-1 document's categories, their texts in this format's form
    (:func:`fastrun.category.normalize`); :class:`CacheFormatError` when it is unreadable."""
    try:
        with _gc_paused():
            document = msgpack.unpackb(data, raw=False)
    except Exception as problem:  # msgpack raises several unrelated types for bad input
        detail = f"{type(problem).__name__}: {problem}" if str(problem) else type(problem).__name__
        raise CacheFormatError(f"a format-1 cache that is not a whole msgpack document "
                               f"({detail})") from None
    if not isinstance(document, dict) or document.get("format") != CACHE_FORMAT1_NAME:
        raise CacheFormatError("a format-1 cache without its format name")
    if document.get("version") != 1:
        raise CacheFormatError(f"format-1 document of version {document.get('version')!r}")
    categories = document.get("categories")
    if not isinstance(categories, dict):
        raise CacheFormatError("a format-1 cache whose 'categories' is not a map")
    result: RawCategories = {}
    for text, keys in categories.items():
        if not isinstance(text, str) or not isinstance(keys, dict):
            raise CacheFormatError(f"format-1 category {str(text)[:200]!r} is not a string "
                                   "mapped to a map")
        try:
            normal = categories_module.normalize(text)
        except CategoryError:
            normal = text  # kept as it was: it matches nothing, and a tool can still show it
        target = result.setdefault(normal, {})
        for key, raws in keys.items():
            if isinstance(key, str) and type(raws) is list:
                target[key] = raws
    return result


def read_file(path: str) -> tuple[Probe, RawCategories, Contents | None]:
    """Read a whole cache file for inspection: never locks, moves or writes.  Raises
    :class:`CacheFormatError` naming what the path holds when it is not a readable cache, and
    FileNotFoundError when it does not exist."""
    found = probe(path)
    if found.kind == MISSING:
        raise FileNotFoundError(path)
    if found.kind == EMPTY:
        return found, {}, None
    if found.kind not in (CURRENT, FORMAT1):
        raise CacheFormatError(f"cache file {path} {found.detail}")
    with open(path, "rb") as file:
        data = file.read(max_bytes() + 1)
    try:
        if found.kind == FORMAT1:
            return found, read_format1(data), None
        contents = read(data)
    except CacheFormatError as problem:
        raise CacheFormatError(f"cache file {path} is a damaged fastrun cache: {problem}") from None
    return found, contents.snapshot or {}, contents
