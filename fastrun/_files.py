"""Replacing a file so that no reader ever sees half of it."""

from __future__ import annotations

import contextlib
import os
import tempfile


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> os.stat_result:
    """Write ``data`` to a temporary file beside ``path``, flush it to disk and rename it over
    ``path``; returns the new file's status.

    A reader (another process loading a cache, a browser reloading a report) sees the old file
    or the new one, never a mix, and an interrupted write (KeyboardInterrupt included) leaves
    no temporary file behind.  The file keeps the old one's permissions, or gets 0644: mkstemp's
    0600 would hide a shared cache or baseline from other users.
    """
    path = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(path))
    try:
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            if hasattr(os, "fchmod"):  # not on Windows before Python 3.13
                os.fchmod(file.fileno(), mode)
            os.fsync(file.fileno())
            status = os.fstat(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    _fsync_directory(directory)
    return status


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
