"""Replacing a file so that no reader ever sees half of it, and telling beforehand whether one
could be written at all."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import time


class Replacement:
    """A new version of ``path``, written beside it, that replaces it atomically on
    :meth:`commit`.

    Why in two steps: a cache compaction writes megabytes, and only the rename must happen
    under the cache's lock.  The bulk is written and flushed to disk when the replacement is
    made (outside the lock); :meth:`append` adds what must be read under the lock, and
    :meth:`commit` flushes that little and renames.  The temporary file's name says which
    host and process writes it (:func:`is_stale_temporary` tells a dead writer's leftover from
    one in progress).  A reader sees the old file or the new one, never a mix; the file keeps
    the old one's permissions, or gets 0644 (mkstemp's 0600 would hide a shared cache or
    baseline from other users).
    """

    def __init__(self, path: str | os.PathLike[str], data: bytes | str = b"") -> None:
        self.path = os.fspath(path)
        self.directory, name = os.path.split(os.path.abspath(self.path))
        try:
            self.mode = os.stat(self.path).st_mode & 0o777
        except FileNotFoundError:
            self.mode = 0o644
        prefix = f".{name}.{_HOST}.{os.getpid()}."
        fd, self.temporary = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=self.directory)
        self._file = os.fdopen(fd, "wb")
        try:
            self.append(data)
            self._sync()
        except BaseException:
            self.discard()
            raise

    def append(self, data: bytes | str) -> None:
        self._file.write(data.encode("utf-8") if isinstance(data, str) else data)

    def _sync(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def commit(self) -> os.stat_result:
        """Flush what was appended and rename over the path; returns the new file's status."""
        try:
            self._sync()
            if hasattr(os, "fchmod"):  # not on Windows before Python 3.13
                os.fchmod(self._file.fileno(), self.mode)
            status = os.fstat(self._file.fileno())
            self._file.close()
            os.replace(self.temporary, self.path)
        except BaseException:
            self.discard()
            raise
        _fsync_directory(self.directory)
        return status

    def discard(self) -> None:
        """Remove the temporary file (the path keeps its old contents)."""
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(OSError):
            os.unlink(self.temporary)

    def __enter__(self) -> Replacement:
        return self

    def __exit__(self, kind: object, *rest: object) -> None:
        if kind is not None:
            self.discard()


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> os.stat_result:
    """Replace ``path`` by ``data`` at once (see :class:`Replacement`); an interrupted write
    (KeyboardInterrupt included) leaves no temporary file behind."""
    return Replacement(path, data).commit()


_HOST = socket.gethostname().replace(".", "_") or "host"

#: A temporary file of another host, whose writer this host cannot see, is a leftover once it
#: is this old.
STALE_AFTER_S = 3600.0


def is_stale_temporary(directory: str, name: str, leftover: str) -> bool:
    """Whether ``leftover`` (in ``directory``) is a temporary file of ``name`` that no live
    writer will rename: one of a process of this host that is gone, one of another host
    untouched for :data:`STALE_AFTER_S`, or one named by an older fastrun, which wrote them
    only under the lock the caller holds."""
    prefix = f".{name}."
    if not (leftover.startswith(prefix) and leftover.endswith(".tmp")):
        return False
    parts = leftover[len(prefix):-len(".tmp")].split(".")
    if len(parts) != 3 or not parts[1].isdigit():
        return True  # an older fastrun's: written only under the lock
    host, pid = parts[0], int(parts[1])
    if host == _HOST:
        return not _alive(pid)
    try:
        age = time.time() - os.stat(os.path.join(directory, leftover)).st_mtime
    except OSError:
        return False
    return age > STALE_AFTER_S


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def _fsync_directory(directory: str) -> None:
    """Make the rename durable too (a power loss could otherwise bring back the old file)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def unwritable_reason(path: str | os.PathLike[str]) -> str | None:
    """Why a file could not be written at ``path`` (a directory there, or no directory to hold
    it, or one that is not writable), or None: what a command checks before the work whose
    result it would write there."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return "is a directory, not a file"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"its folder {folder} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"its folder {folder} is not writable"
    return None
