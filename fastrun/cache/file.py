"""The cache file's bytes: format 3, an append-only log of measurements behind a snapshot.

Why a log: format 1 was one msgpack document, so every ``put`` re-read, re-encoded and
replaced the whole file under the lock (418 ms at 50,000 problems).  Here a ``put`` appends one
record, so it costs O(its record), and a reader that already holds the file reads only the
records appended since.  See ``docs/cache-format.md`` for the layout; in short::

    header  = MAGIC (8 bytes) + version (uint16 LE, 3) + 2 reserved bytes
              + generation (16 random bytes) + crc32 of the 28 bytes before it (uint32 LE)
    record  = RECORD_MAGIC (4 bytes) + length (uint32 LE)
              + crc32 of the length's 4 bytes and the payload (uint32 LE) + payload (msgpack)
    file    = header, one snapshot record, then any number of put records

    snapshot payload = ["snapshot", {"written_at": time, "fastrun": version},
                        [[category facts, {key: [raw_entry, ...]}], ...]]
    put payload      = ["put", category facts, key, [raw_entry, ...]]

Why a generation: a compaction replaces the file, and a process that holds the old one must
know before it appends or catches up.  Inode numbers cannot tell (ext4 hands a freed number
back at once), so every new file carries 16 random bytes in its checksummed header, and a
reader or writer compares them with what it loaded.

Why a magic per record: a damaged record (a flipped byte, zeros written over it) must cost
that record only.  :func:`scan` finds the next record by its magic, length and checksum and
reports the bytes it skipped; bytes after the last whole record are the *tail* (a write cut
short, or one still in progress), never mistaken for damage.

Format 2 (the same without generation, record magic or header checksum) is still read, and
converted to format 3 by the first write.

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
from fastrun.base.formats import CACHE_FORMAT1_NAME
from fastrun.category import CategoryError

MAGIC = b"FASTRUN\x1a"  # \x1a: a text tool stops there; no text or msgpack file starts so
VERSION = 3
_HEADER = struct.Struct("<8sHH16s")
_HEADER_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size + _HEADER_CRC.size
GENERATION_SIZE = 16
RECORD_MAGIC = b"\xf5FRr"
_RECORD = struct.Struct("<4sII")
RECORD_HEADER_SIZE = _RECORD.size
_LENGTH = struct.Struct("<I")

#: Format 2's header and record framing (read for conversion only).
_HEADER2 = struct.Struct("<8sHH")
_RECORD2 = struct.Struct("<II")

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
#: Longest category text and key (a problem of many inputs has a long key).
MAX_NAME = 64 * 1024

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
(EMPTY, CURRENT, FORMAT1, FORMAT2, NEWER, DAMAGED, FOREIGN, NOT_A_FILE, TOO_LARGE, MISSING,
 UNREADABLE) = ("empty", "current", "format 1", "format 2", "newer", "damaged", "foreign",
                "not a file", "too large", "missing", "unreadable")
#: kinds whose contents this fastrun reads (the older ones are converted by the first write)
READABLE = (CURRENT, FORMAT1, FORMAT2)


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

    return config.CACHE_MAX_BYTES.get()


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
        if len(head) < _HEADER2.size:
            return Probe(DAMAGED, "is a fastrun cache cut short inside its header")
        _, version, _ = _HEADER2.unpack_from(head)
        if version > VERSION:
            return Probe(NEWER, f"was written by a newer fastrun (cache format {version}; this "
                         f"fastrun reads formats 1 to {VERSION})")
        if version == 2:
            return Probe(FORMAT2)
        if version != VERSION:
            return Probe(DAMAGED, f"is a fastrun cache with an unknown format {version}")
        try:
            generation(head)
        except CacheFormatError as problem:
            return Probe(DAMAGED, f"is a fastrun cache whose {problem}")
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


# -- names ---------------------------------------------------------------------------------

def check_name(what: str, text: Any) -> str | None:
    """What is wrong with a category text or a key, or None: one rule for every put and every
    read, so that nothing a put accepts is refused by a reader or dropped by a compaction.  A
    name is a non-empty string of at most :data:`MAX_NAME` printable characters without
    leading or trailing spaces (a tab, a newline or a trailing space would make two names that
    look the same in every tool's output)."""
    if not isinstance(text, str):
        return f"the {what} is {type(text).__name__}, not a string"
    if not text:
        return f"the {what} is empty"
    if len(text) > MAX_NAME:
        return f"the {what} is {len(text)} characters long (at most {MAX_NAME})"
    if not text.isprintable():
        bad = next(c for c in text if not c.isprintable())
        return f"the {what} {text[:80]!r} holds the control character {bad!r}"
    if text != text.strip():
        return f"the {what} {text[:80]!r} begins or ends with a space"
    return None


# -- records -------------------------------------------------------------------------------

def _pack(payload: Any) -> bytes:
    return msgpack.packb(payload, use_bin_type=True)


def _checksum(length: bytes, body: bytes | memoryview) -> int:
    return zlib.crc32(body, zlib.crc32(length))


def record(payload: Any) -> bytes:
    """One record's bytes: magic, length, checksum (of length and payload), payload."""
    data = _pack(payload)
    length = _LENGTH.pack(len(data))
    return RECORD_MAGIC + length + _HEADER_CRC.pack(_checksum(length, data)) + data


def header() -> bytes:
    """A format-3 header naming a new generation: random, so no two files (and no reused
    inode) share one."""
    head = _HEADER.pack(MAGIC, VERSION, 0, os.urandom(GENERATION_SIZE))
    return head + _HEADER_CRC.pack(zlib.crc32(head))


def generation(data: bytes | memoryview) -> bytes:
    """The generation id of a format-3 file beginning with ``data``; :class:`CacheFormatError`
    when its header is cut short or fails its checksum."""
    if len(data) < HEADER_SIZE:
        raise CacheFormatError("header is cut short")
    magic, version, _, generation_id = _HEADER.unpack_from(data)
    (checksum,) = _HEADER_CRC.unpack_from(data, _HEADER.size)
    if magic != MAGIC or version != VERSION:
        raise CacheFormatError(f"header is not a format-{VERSION} header")
    if zlib.crc32(bytes(data[:_HEADER.size])) != checksum:
        raise CacheFormatError("header fails its checksum")
    return bytes(generation_id)


#: The one fact of a category text that is not in the documented form (a library user's own
#: namespace): stored and read back verbatim.
_VERBATIM = "text"


def _facts(category: str) -> dict[str, str]:
    """A category's map for the file: its facts where they give back exactly this text, else
    the text itself (a library user's namespace), so any valid name comes back unchanged."""
    try:
        facts = categories_module.parse(category).facts()
        if categories_module.Category.from_facts(facts).text == category:
            return facts
    except CategoryError:
        pass
    return {_VERBATIM: category}


def put_record(category: str, key: str, raws: list[RawEntry]) -> bytes:
    return record(["put", _facts(category), key, raws])


def snapshot_file(raw: RawCategories, meta: dict[str, Any]) -> bytes:
    """A whole format-3 file holding ``raw`` as its snapshot and no log, under a new
    generation."""
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


@dataclass(frozen=True)
class Damage:
    """Bytes a reader skipped: where (an offset in the file), how many, and why."""

    offset: int
    length: int
    why: str

    def __str__(self) -> str:
        return f"{self.length} bytes at offset {self.offset}: {self.why}"


@dataclass
class Frames:
    """What :func:`scan` found in a run of bytes: the whole records' payloads (undecoded),
    the damaged spans it resynchronised past, and where the tail begins (``end``: after the
    last whole record; bytes from there on hold no whole record)."""

    bodies: list[tuple[int, memoryview]] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)
    end: int = 0
    size: int = 0
    #: the scanned bytes, and the file offset of their first byte
    data: bytes = b""
    base: int = 0

    @property
    def tail(self) -> int:
        return self.size - self.end

    def whole_records(self) -> bytes:
        """The whole records' bytes, framing included, without the damage between them: what
        a compaction copies as it is."""
        return b"".join(self.data[offset - self.base:
                                  offset - self.base + RECORD_HEADER_SIZE + len(body)]
                        for offset, body in self.bodies)


def _frame_at(data: bytes, offset: int) -> tuple[int, str | None]:
    """``(end of the record at offset, None)`` for a whole record, else ``(0, why not)``."""
    if offset + RECORD_HEADER_SIZE > len(data):
        return 0, "a record header cut short"
    magic, length, checksum = _RECORD.unpack_from(data, offset)
    if magic != RECORD_MAGIC:
        return 0, "no record begins there"
    start = offset + RECORD_HEADER_SIZE
    if length > len(data) - start:
        return 0, "a record cut short"
    body = memoryview(data)[start:start + length]
    if _checksum(data[offset + 4:offset + 8], body) != checksum:
        return 0, "a record that fails its checksum"
    return start + length, None


def _next_frame(data: bytes, offset: int) -> int | None:
    """The offset of the next whole record at or after ``offset``, or None."""
    while True:
        found = data.find(RECORD_MAGIC, offset)
        if found < 0:
            return None
        if _frame_at(data, found)[1] is None:
            return found
        offset = found + 1


def scan(data: bytes, start: int = 0, base: int = 0) -> Frames:
    """The records of ``data`` from ``start`` on, checked by magic, length and checksum but not
    decoded.  A bad record followed by a whole one is *damage* (reported, skipped: the reader
    resynchronises on the next record's magic); bad bytes with no whole record after them are
    the *tail*.  Offsets in the result are ``base`` + offsets in ``data``."""
    frames = Frames(size=base + len(data), data=data, base=base)
    offset = start
    while offset < len(data):
        end, why = _frame_at(data, offset)
        if why is None:
            frames.bodies.append((base + offset, memoryview(data)[offset + RECORD_HEADER_SIZE:end]))
            offset = end
            continue
        following = _next_frame(data, offset + 1)
        if following is None:
            break
        frames.damage.append(Damage(base + offset, following - offset, why))
        offset = following
    frames.end = base + offset
    return frames


@dataclass
class Contents:
    """What reading a file (or the tail appended since) found.

    ``generation``: the file's id (None when only a tail was read, or for older formats);
    ``snapshot``: the snapshot's categories (None when only a tail was read, or when the
    snapshot was damaged) and ``snapshot_end`` the offset after it; ``puts``: the put records
    in order, as ``(category text, key, raw entries)``; ``end``: the offset after the last
    whole record; ``torn``: bytes after ``end`` that hold no whole record; ``damage``: spans
    skipped between whole records and whole records that could not be used; ``skipped``:
    ``(category, key, why)`` for categories, keys and records that could not be used.
    """

    generation: bytes | None = None
    snapshot: RawCategories | None = None
    snapshot_end: int = 0
    puts: list[tuple[str, str, list[RawEntry]]] = field(default_factory=list)
    end: int = 0
    torn: int = 0
    damage: list[Damage] = field(default_factory=list)
    skipped: list[tuple[str, str, str]] = field(default_factory=list)


def _unpack(body: memoryview) -> Any:
    """A checksum-valid payload, or the exception msgpack raised (a record written wrong)."""
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False)
    except Exception as problem:  # msgpack raises several unrelated types
        return problem


def decode(frames: Frames, contents: Contents) -> None:
    """Decode ``frames``' put records into ``contents`` (a record that is no put is damage)."""
    contents.damage.extend(frames.damage)
    with _gc_paused():
        for offset, body in frames.bodies:
            payload = _unpack(body)
            why = _put(payload, contents)
            if why is not None:
                contents.damage.append(Damage(offset, RECORD_HEADER_SIZE + len(body), why))
    contents.end, contents.torn = frames.end, frames.tail


def _category_text(facts: Any) -> str:
    if isinstance(facts, dict) and list(facts) == [_VERBATIM]:
        text = facts[_VERBATIM]
        problem = check_name("category", text)
        if problem is not None:
            raise CategoryError(problem)
        return text
    return categories_module.Category.from_facts(facts).text


def read(data: bytes) -> Contents:
    """Decode a whole format-3 file.  :class:`CacheFormatError` when its header is unreadable
    or when not one whole record follows it (nothing of it can be trusted); damaged records
    between whole ones are skipped and listed in ``damage``."""
    if not data.startswith(MAGIC):
        raise CacheFormatError("no fastrun cache header")
    with _gc_paused():
        return _read(data, generation(data))


def _read(data: bytes, generation_id: bytes) -> Contents:
    frames = scan(data, HEADER_SIZE)
    if not frames.bodies:
        raise CacheFormatError(f"not one whole record follows its header (its "
                               f"{frames.size - HEADER_SIZE} bytes after it are no whole "
                               "record: a snapshot cut short or failing its checksum)")
    contents = Contents(generation=generation_id)
    if frames.bodies[0][0] == HEADER_SIZE:
        offset, body = frames.bodies.pop(0)
        payload = _unpack(body)
        try:
            contents.snapshot = _snapshot(payload, contents.skipped)
            contents.snapshot_end = offset + RECORD_HEADER_SIZE + len(body)
        except CacheFormatError as problem:
            contents.damage.append(Damage(offset, RECORD_HEADER_SIZE + len(body), str(problem)))
    decode(frames, contents)
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
            problem = check_name("key", key)
            if problem is not None or type(raws) is not list:
                skipped.append((text, str(key)[:200], problem or "not a key mapped to a list"))
                continue
            target[key] = raws
    return result


def _put(payload: Any, contents: Contents) -> str | None:
    """Add one put record to ``contents``; why it is no usable put record, or None."""
    if isinstance(payload, Exception):
        return ("a record whose checksum holds but that cannot be decoded "
                f"({type(payload).__name__})")
    try:
        kind, facts, key, raws = payload
        if kind != "put" or type(raws) is not list:
            raise ValueError("not a put record")
        problem = check_name("key", key)
        if problem is not None:
            raise ValueError(problem)
        text = _category_text(facts)
    except (CategoryError, TypeError, ValueError) as problem:
        return f"a record that is no usable put ({problem})"
    contents.puts.append((text, key, raws))
    return None


# -- format 2 (read for conversion) ----------------------------------------------------------

def _records2(data: bytes, offset: int) -> Iterator[tuple[int, Any]]:
    """Format 2's ``(end offset, payload)`` records from ``offset``; stops at a torn one."""
    size = len(data)
    while offset + _RECORD2.size <= size:
        length, checksum = _RECORD2.unpack_from(data, offset)
        start = offset + _RECORD2.size
        if length > size - start:
            return
        body = memoryview(data)[start:start + length]
        if zlib.crc32(body) != checksum:
            return
        payload = _unpack(body)
        if isinstance(payload, Exception):
            return
        offset = start + length
        yield offset, payload


def read_format2(data: bytes) -> Contents:
    """A format-2 file's contents (its log ends at the first bad record, as format 2 had no way
    past one); :class:`CacheFormatError` when its snapshot is unreadable."""
    with _gc_paused():
        records = _records2(data, _HEADER2.size)
        first = next(records, None)
        if first is None:
            raise CacheFormatError("its snapshot record is cut short or fails its checksum")
        contents = Contents()
        contents.snapshot = _snapshot(first[1], contents.skipped)
        contents.snapshot_end = contents.end = first[0]
        for end, payload in records:
            _put(payload, contents)
            contents.end = end
    contents.torn = len(data) - contents.end
    return contents


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


def read_any(kind: str, data: bytes) -> Contents | None:
    """The contents of a file of a readable ``kind`` (:data:`READABLE`); None for format 1,
    which has no log (read it with :func:`read_format1`)."""
    if kind == FORMAT1:
        return None
    return read_format2(data) if kind == FORMAT2 else read(data)


def read_file(path: str) -> tuple[Probe, RawCategories, Contents | None]:
    """Read a whole cache file for inspection: never locks, moves or writes.  Raises
    :class:`CacheFormatError` naming what the path holds when it is not a readable cache, and
    FileNotFoundError when it does not exist."""
    found = probe(path)
    if found.kind == MISSING:
        raise FileNotFoundError(path)
    if found.kind == EMPTY:
        return found, {}, None
    if found.kind not in READABLE:
        raise CacheFormatError(f"cache file {path} {found.detail}")
    with open(path, "rb") as file:
        data = file.read(max_bytes() + 1)
    try:
        contents = read_any(found.kind, data)
        if contents is None:
            return found, read_format1(data), None
    except CacheFormatError as problem:
        raise CacheFormatError(f"cache file {path} is a damaged fastrun cache: {problem}") from None
    return found, contents.snapshot or {}, contents
