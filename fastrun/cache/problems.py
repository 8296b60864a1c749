"""The problems file: every problem a deployment met that its cache did not hold.

Why: a fleet is tuned for what production runs, not for a guess.  A session with
``record=PATH`` (``FASTRUN_RECORD``, ``load_and_run --record PATH``) appends each problem that
missed the cache to this file, for a fleet to tune exactly those later (``fastrun tune
--problems``, :mod:`fastrun.fleet`, docs/fleet.md).

The file is JSON lines: a header ``{"format": "fastrun-problems", "version": 1}``, then one
record per problem with the operator, shapes, dtypes and canonical parameters (enough to
build the problem again through the registry), its key, and the category it missed in (the
device's facts and the operator's algorithm set)::

    {"operator": "conv", "shapes": [[1, 64, 56, 56], ...], "dtypes": ["float32", ...],
     "params": {...}, "key": "...", "category": "cpu;processor=...|conv@...",
     "recorded_at": 1795000000.0}

Each (category, key) is stored once, whatever the number of processes appending: a writer
takes the file's lock, reads the records added since it last looked, and appends its line only
if the problem is not there yet.  A process killed in the middle of a line leaves a torn last
line; readers skip it and the next writer starts on a fresh line.  Recording happens on a cache
miss only, which a process meets once per problem (decisions are kept in memory), so a call
that dispatches costs nothing more.

What it may import: the base modules (``fastrun.config``, ``fastrun.base.formats``) and filelock.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import filelock

from fastrun.base.formats import PROBLEMS_FORMAT, PROBLEMS_VERSION

HEADER = json.dumps({"format": PROBLEMS_FORMAT, "version": PROBLEMS_VERSION})


class ProblemsFileError(ValueError):
    """A problems file that is not one (another file kind, a newer version, unreadable)."""


@dataclass(frozen=True)
class RecordedProblem:
    """One problem as recorded: enough to pose it again (``registry.operator(operator)
    .problem(shapes, dtypes, **params)``) and to tell which cache category it missed in."""

    operator: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    params: Mapping[str, Any]
    key: str
    category: str
    recorded_at: float

    @property
    def ident(self) -> tuple[str, str]:
        return (self.category, self.key)

    def to_json(self) -> str:
        return json.dumps({"operator": self.operator, "shapes": [list(s) for s in self.shapes],
                           "dtypes": list(self.dtypes), "params": _plain(self.params),
                           "key": self.key, "category": self.category,
                           "recorded_at": self.recorded_at}, sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecordedProblem:
        return cls(str(data["operator"]), tuple(tuple(int(d) for d in s) for s in data["shapes"]),
                   tuple(str(d) for d in data["dtypes"]), dict(data["params"]),
                   str(data["key"]), str(data["category"]), float(data["recorded_at"]))


def _plain(value: Any) -> Any:
    """Parameters as JSON values: tuples become lists, mappings keep their keys."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def read_problems(path: str | os.PathLike[str]) -> list[RecordedProblem]:
    """Every problem of a problems file, once each, in the order recorded (torn or damaged
    lines are skipped); ProblemsFileError when the file is not a problems file."""
    return list(_records(os.fspath(path), 0)[0].values())


def _records(path: str, offset: int) -> tuple[dict[tuple[str, str], RecordedProblem], int]:
    """The records from ``offset`` on, and the offset after the last whole line."""
    found: dict[tuple[str, str], RecordedProblem] = {}
    try:
        with open(path, "rb") as file:
            file.seek(offset)
            data = file.read()
    except FileNotFoundError:
        return found, 0
    except OSError as error:
        raise ProblemsFileError(f"cannot read problems file {path}: "
                                f"{error.strerror or error}") from None
    if offset == 0 and not data:
        return found, 0  # an empty file: a new one (the first record writes the header)
    end = data.rfind(b"\n") + 1  # a torn last line is left for later (or for ever)
    lines = data[:end].splitlines()
    if offset == 0:
        _check_header(path, lines[0] if lines else data)
        lines = lines[1:]
    for line in lines:
        try:
            record = RecordedProblem.from_dict(json.loads(line))
        except (ValueError, KeyError, TypeError):
            continue  # the rest of a torn line, or a line someone edited badly
        found.setdefault(record.ident, record)
    return found, offset + end


def _check_header(path: str, first: bytes) -> None:
    try:
        header = json.loads(first) if first else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != PROBLEMS_FORMAT:
        kind = header.get("format") if isinstance(header, dict) else "not JSON lines"
        raise ProblemsFileError(f"{path} is not a fastrun problems file (format: {kind!r}; "
                                f"expected {PROBLEMS_FORMAT!r}, written by a session with "
                                f"record=PATH or load_and_run --record)")
    if header.get("version") != PROBLEMS_VERSION:
        raise ProblemsFileError(f"{path} is problems format version {header.get('version')!r}; "
                                f"this fastrun reads version {PROBLEMS_VERSION}")


class ProblemRecorder:
    """Appends the problems a session misses to one problems file, each (category, key) once
    across every process that records into it."""

    def __init__(self, path: str | os.PathLike[str], lock_timeout: float = 30.0):
        self.path = os.fspath(path)
        self._lock = filelock.FileLock(self.path + ".lock", timeout=lock_timeout)
        self._thread_lock = threading.Lock()
        self._known: set[tuple[str, str]] = set()
        self._offset = 0
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise ProblemsFileError(f"cannot record problems into {self.path}: {directory} "
                                    f"is not a directory")
        self._read_existing()

    def _read_existing(self) -> None:
        """Read what is already there (so a bad file is refused when the session starts)."""
        found, self._offset = _records(self.path, 0)
        self._known.update(found)

    def record(self, operator: str, shapes: Sequence[Sequence[int]], dtypes: Sequence[str],
               params: Mapping[str, Any], key: str, category: str) -> bool:
        """Append one missed problem unless some process already did; True when appended."""
        ident = (category, key)
        if ident in self._known:
            return False
        line = RecordedProblem(operator, tuple(tuple(s) for s in shapes), tuple(dtypes),
                               params, key, category, time.time()).to_json()
        with self._thread_lock, self._lock:
            found, self._offset = _records(self.path, self._offset)
            self._known.update(found)
            if ident in self._known:
                return False
            self._append(line)
            self._known.add(ident)
            return True

    def _append(self, line: str) -> None:
        """One write per line, starting on a fresh line (after a torn one if a writer died)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            text = line + "\n"
            if size == 0:
                text = HEADER + "\n" + text
            else:
                with open(self.path, "rb") as file:
                    file.seek(size - 1)
                    if file.read(1) != b"\n":
                        text = "\n" + text
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        self._offset = os.path.getsize(self.path)

    def __iter__(self) -> Iterator[RecordedProblem]:
        return iter(read_problems(self.path))
