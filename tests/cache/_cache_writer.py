"""Writes to a FileCache from a separate process, for the multi-process tests in test_cache.py.

Usage:
    python _cache_writer.py distinct PATH WRITER COUNT GO_FILE
        wait until GO_FILE exists, then COUNT puts of keys "w<WRITER>-k<j>" (alternating between
        two categories), each also adding one entry to the shared key ("shared", "k")
    python _cache_writer.py loop PATH
        put big keys "loop-<n>" until killed; prints "ready" after the first one. Each fsync is
        slowed down so that most of the time is spent inside a write: a kill then most likely
        lands between creating the temporary file and replacing the cache file.
    python _cache_writer.py one PATH CATEGORY KEY
        a single put

The expected entries of every key come from make_entries, which the tests import from this file.
"""

from __future__ import annotations

import os
import sys
import time

from fastrun.attribute import AlgoAttribute
from fastrun.cache import Entry, FileCache

_ATTRIBUTE_CYCLE = [
    AlgoAttribute.NONE,
    AlgoAttribute.REPRODUCIBLE,
    AlgoAttribute.REPRODUCIBLE | AlgoAttribute.NAIVE,
]

SHARED = ("shared", "k")
DISTINCT_CATEGORIES = ("cat-a", "cat-b")


def make_entries(key: str, count: int, pad: int = 0) -> list[Entry]:
    """Deterministic entries for a key, none dominated by another (time up, workspace down)."""
    return [
        Entry(
            algorithm=f"{key}-algo{i:04d}" + "x" * pad,
            attributes=_ATTRIBUTE_CYCLE[i % len(_ATTRIBUTE_CYCLE)],
            time_s=0.001 * (i + 1),
            spread_s=0.0001 * i,
            workspace_bytes=1000 * (count - i),
            error=None if i % 4 == 0 else 1e-7 * i,
            repeats=10 + i,
            measured_at=1_700_000_000.0 + i,
            version="0.1.0",
        )
        for i in range(count)
    ]


def shared_entry(index: int) -> Entry:
    """The entry that put number ``index`` adds to the shared key (never dominated)."""
    return Entry(
        algorithm=f"shared-{index}",
        attributes=AlgoAttribute.NONE,
        time_s=1.0 + index,
        spread_s=0.0,
        workspace_bytes=10_000 - index,
        error=None,
        repeats=5,
        measured_at=1_700_000_000.0,
        version="0.1.0",
    )


def distinct(path: str, writer: int, count: int, go_file: str) -> None:
    deadline = time.monotonic() + 30
    while not os.path.exists(go_file):
        if time.monotonic() > deadline:
            raise SystemExit("go file never appeared")
        time.sleep(0.005)
    cache = FileCache(path)
    for j in range(count):
        key = f"w{writer}-k{j}"
        category = DISTINCT_CATEGORIES[j % 2]
        cache.put_many(
            [
                (category, key, make_entries(key, 3)),
                (*SHARED, [shared_entry(writer * count + j)]),
            ]
        )


def loop(path: str) -> None:
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(0.02)
        real_fsync(fd)

    os.fsync = slow_fsync
    cache = FileCache(path)
    n = 0
    while True:
        key = f"loop-{n}"
        cache.put("loop", key, make_entries(key, 200, pad=40))
        if n == 0:
            print("ready", flush=True)
        n += 1


def main(argv: list[str]) -> None:
    mode, path, *rest = argv
    if mode == "distinct":
        distinct(path, int(rest[0]), int(rest[1]), rest[2])
    elif mode == "loop":
        loop(path)
    elif mode == "one":
        category, key = rest
        FileCache(path).put(category, key, make_entries(key, 3))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
