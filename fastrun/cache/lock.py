"""The cache file's lock: an ``flock`` on ``<target>.lock`` that waiters sleep on.

Why not poll: a lock taken with ``LOCK_NB`` and retried every few milliseconds (what
``filelock`` does) favours whoever happens to ask right after a release.  With 64 writers
putting 40-entry records, pollers fell to 7 puts/s and 8 of them waited the whole 60 s
timeout.  A waiter here blocks in the kernel, which wakes the waiters as soon as the lock is
free; the wait is bounded by a helper thread, because a blocked ``flock`` cannot be given a
timeout.  A lock that is free is taken with one ``LOCK_NB`` call and no thread.

The lock file is never deleted (deleting it would let two processes each lock a file of that
name), and a lock taken on a file that was deleted or replaced meanwhile is taken again on the
new one.  It is the same ``flock`` that ``filelock`` takes, so older fastrun versions sharing
the file exclude each other with this one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time


class LockTimeout(OSError):
    """The lock stayed held by another process for the whole wait."""


class FileLock:
    """An exclusive lock on ``path``, re-entrant within one owner (the cache serialises its
    threads with a lock of its own)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._depth = 0

    @property
    def held(self) -> bool:
        return self._depth > 0

    def acquire(self, timeout: float) -> None:
        """Take the lock within ``timeout`` seconds, else :class:`LockTimeout`; an OSError when
        the lock file cannot be opened (a read-only directory, a permission)."""
        if self._depth:
            self._depth += 1
            return
        deadline = time.monotonic() + timeout
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not _wait(fd, deadline - time.monotonic()):
                    raise LockTimeout(f"waited {timeout:g} s for the lock {self.path}") from None
            except BaseException:
                os.close(fd)
                raise
            if self._still_named(fd):
                self._fd, self._depth = fd, 1
                return
            _unlock(fd)  # taken on a file that is no longer at the path: take the new one

    def try_acquire(self) -> bool:
        """Take the lock only if it is free now (no wait); whether it was taken."""
        if self._depth:
            self._depth += 1
            return True
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        if not self._still_named(fd):
            _unlock(fd)
            return False
        self._fd, self._depth = fd, 1
        return True

    def release(self) -> None:
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0 and self._fd is not None:
            fd, self._fd = self._fd, None
            _unlock(fd)

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        except PermissionError as refused:
            # another user's lock file that this one may only read: flock works on it too
            try:
                return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                raise refused from None

    def _still_named(self, fd: int) -> bool:
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path))
        except OSError:
            return False


def _unlock(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _wait(fd: int, timeout: float) -> bool:
    """Block on ``fd``'s lock for at most ``timeout`` seconds; True when it was taken.  On
    False the helper thread keeps ``fd``: should the lock come later, it is let go at once."""
    taken = threading.Event()
    guard = threading.Lock()
    state: dict[str, object] = {"abandoned": False, "error": None}

    def wait() -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as error:
            state["error"] = error
        with guard:
            if state["abandoned"]:
                with contextlib.suppress(OSError):
                    _unlock(fd)
                return
            taken.set()

    threading.Thread(target=wait, name="fastrun-cache-lock", daemon=True).start()
    if taken.wait(max(0.0, timeout)):
        pass
    else:
        with guard:
            if not taken.is_set():
                state["abandoned"] = True
                return False
    if state["error"] is not None:
        os.close(fd)
        raise state["error"]  # type: ignore[misc]
    return True
