"""What the command line does with measurements its cache file could not take.

A search whose cache file cannot be written (read-only, full, locked for too long, or not a
fastrun cache at all) goes on in memory (:class:`fastrun.cache.FileCache`); at the end the
measurements go to ``--save-cache-to FILE``, or to the cache file again where it has become
writable, and the user is told in one line where they went or that they are lost.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import warnings
from collections.abc import Sequence


def add_argument(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--save-cache-to", metavar="FILE",
                       help="where this run's measurements go if the --algo-policy file "
                            "cannot be written (read-only, full, locked, not a cache)")
    where.add_argument("--no-save", action="store_true",
                       help="read the --algo-policy file but never write it (no lock file "
                            "either): this run's measurements live only as long as it")


def number_error(flag: str, value: float | None, least: float,
                 strictly: bool = False) -> str | None:
    """Why a numeric argument is out of range (below ``least``, or not above it when
    ``strictly``), or None (also for an argument not given)."""
    if value is None or (value > least if strictly else value >= least):
        return None
    return f"{flag} must be {'>' if strictly else '>='} {least:g}, got {value:g}"


def output_paths_error(args: argparse.Namespace, names: Sequence[str]) -> str | None:
    """What is wrong with an output file argument (``names``: their dests) that would be
    written only after the work, or None: checked before any."""
    from fastrun.base.files import unwritable_reason

    for name in names:
        path = getattr(args, name, None)
        if path:
            problem = unwritable_reason(path)
            if problem:
                return f"--{name.replace('_', '-')} {path}: {problem}"
    return None


def cache_path_error(path: str, remedy: str = "name another file, or add --save-cache-to "
                                              "FILE to save them elsewhere") -> str | None:
    """Why a search could not save its results to the cache file at ``path`` (a directory,
    a read-only cache, a file that is no fastrun cache or of a newer format, a missing
    folder), or None.  Checked before any work, and before a lock file would be made beside
    a path that is not a cache."""
    from fastrun.base.files import unwritable_reason
    from fastrun.cache import file as cache_file

    found = cache_file.probe(path)
    unusable = found.detail if found.kind in (
        cache_file.NOT_A_FILE, cache_file.FOREIGN, cache_file.NEWER, cache_file.TOO_LARGE,
        cache_file.UNREADABLE) else None
    if found.kind in cache_file.READABLE and not os.access(path, os.W_OK):
        unusable = "is read-only"
    if unusable:
        return (f"--algo-policy {path} {unusable}: the search's results could not be saved "
                f"there ({remedy})")
    if found.kind == cache_file.MISSING:
        problem = unwritable_reason(path)
        if problem:
            return f"--algo-policy {path}: {problem}"
    return None


def session_cache(args: argparse.Namespace) -> object:
    """The cache a command's session uses: the ``--algo-policy`` file (shared, written as
    measurements arrive), or with ``--no-save`` an in-memory copy of it (a missing file is an
    empty cache; one that is no readable cache is refused, naming what it holds), or an
    in-memory cache without a file."""
    from fastrun.cache import InMemoryCache, read_cache_file

    if not args.algo_policy:
        return InMemoryCache()
    if not getattr(args, "no_save", False):
        return args.algo_policy
    cache = InMemoryCache()
    try:
        contents = read_cache_file(args.algo_policy)
    except FileNotFoundError:
        return cache
    cache.put_many((category, key, entries) for category, keys in contents.items()
                   for key, entries in keys.items())
    return cache


def quiet_warnings() -> None:
    """The cache's warnings reach a command-line user as one log line each; the Python
    warning with its source line would say the same again."""
    from fastrun.cache import CacheCorruptWarning, CacheUnwritableWarning

    warnings.simplefilter("ignore", CacheCorruptWarning)
    warnings.simplefilter("ignore", CacheUnwritableWarning)


def quiet_interrupted_finalizers() -> None:
    """A Ctrl-C that lands while Python runs an object's finalizer (numba compiling a kernel
    frees llvmlite's strings that way) cannot stop the program there: Python prints it as
    "Exception ignored in ..." with a traceback, and drops it.  This hook sends the signal
    again instead, from a short-lived thread a moment later (sent from the hook itself, it
    would be raised inside the hook and dropped the same way), so that it stops the program at
    the next point that can stop, with the usual one line and exit status 130.  Other
    unraisable errors are reported as before."""
    default = sys.unraisablehook

    def hook(unraisable: object) -> None:
        if isinstance(getattr(unraisable, "exc_value", None), KeyboardInterrupt):
            threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGINT)).start()
        else:
            default(unraisable)

    sys.unraisablehook = hook


def finish(cache: object, save_to: str | None, program: str) -> None:
    """Write what the cache file could not take, and say where it went."""
    from fastrun.cache import FileCache

    if not isinstance(cache, FileCache) or not cache.unsaved:
        return
    count, reason = cache.unsaved, cache.unwritable
    where = cache.save_unsaved(save_to)
    if where is not None:
        print(f"{program}: {count} problem(s) measured in this run could not be written to "
              f"{cache.path} ({reason}); they were saved to {where}", file=sys.stderr)
        return
    hint = ("" if save_to else "; rerun with --save-cache-to FILE to keep them")
    print(f"{program}: warning: {count} problem(s) measured in this run were not saved "
          f"({cache.unwritable or reason}){hint}", file=sys.stderr)


def interrupted(session: object, path: str | None, program: str) -> int:
    """One line for Ctrl-C: how many problems were measured and where they are, so the user
    knows that running again resumes (only ``interrupted`` where no search ran: ``session`` is
    None); returns the exit status (130, 128 + SIGINT)."""
    from fastrun.cache import FileCache

    if session is None:  # nothing was being searched (a report, a cache tool, a load)
        print(f"{program}: interrupted", file=sys.stderr)
        return 130
    count = session.stats.profiled
    cache = getattr(session, "cache", None)
    if path and isinstance(cache, FileCache) and cache.unwritable is None:
        where = f"saved to {path}; run again to resume"
    elif path and isinstance(cache, FileCache):
        where = f"not saved to {path} ({cache.unwritable})"
    elif path:  # read into memory: --no-save
        where = "not saved (--no-save)"
    else:
        where = "not saved (no --algo-policy)"
    print(f"{program}: interrupted: {count} problem(s) measured, {where}", file=sys.stderr)
    return 130
