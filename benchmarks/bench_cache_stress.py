"""How much abuse the cache file takes, and what a put costs (issue 14).

Prints four figures, each measured here and now:

1. **writers x puts**: ``--writers`` processes each put ``--puts`` problems into one file at
   once, and with each a re-measurement of one of the 10 algorithms of a key they all share;
   then every problem must be there, and for the shared key the measurement the merge rule
   keeps (the most repeats) of each algorithm.  Target: 64 x 100 with 0 lost.
2. **kills**: a writer putting as fast as it can (with compactions every 64 KiB of log, so
   kills land in appends and in snapshot replacements alike) is killed with SIGKILL
   ``--kills`` times at random moments; after each kill the file must read as a fastrun cache
   and hold every put the writer had reported done.  Stale temporary files are counted after a
   final compaction.  Target: 200 kills, 0 unreadable files, 0 lost puts, 0 stale tmp files.
3. **damaged files**: kinds of damage (a cut at every offset class, flipped bytes in the
   header, snapshot and log, foreign files, special files); each is opened by a
   :class:`FileCache`, read by the tools' reader and written to; *handled* means no exception
   escaped, the outcome is the documented one, and a foreign file is left byte for byte.
4. **put cost** at 1k, 10k and 100k problems: the median time of a put into a format-2 file,
   against a put into a format-1 file (read, merge, re-encode and replace the whole document
   under the lock, as fastrun 0.1 did), measured here.  Target: under 5 ms at 100k.

    python -m benchmarks.bench_cache_stress [--writers 64] [--puts 100] [--kills 200]
        [--sizes 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import filelock
import msgpack

from benchmarks._common import header
from fastrun import cache as cache_module
from fastrun.attribute import AlgoAttribute
from fastrun.cache import Entry, FileCache, read_cache_file
from fastrun.cache import file as cachefile

CATEGORY = "cpu;processor=Stress CPU;isa=x86-64-v4;threads=16|matmul@4"
SHARED = (CATEGORY.replace("matmul", "shared"), "k")


def entries_of(key: str, count: int = 3) -> list[Entry]:
    return [Entry(f"{key}-a{i}", AlgoAttribute.NONE if i % 2 else AlgoAttribute.REPRODUCIBLE,
                  1e-3 * (i + 1), 1e-5, 1000 * (count - i), None, 10 + i,
                  1_700_000_000.0 + i, "0.2.0") for i in range(count)]


#: the shared key holds measurements of this many algorithms, re-measured by every writer
SHARED_ALGORITHMS = 10


def shared_entry(index: int) -> Entry:
    """Put number ``index`` (over all writers) re-measures one algorithm of the shared key with
    ``index + 1`` repeats: by the merge rule (more repeats wins) the file must end with each
    algorithm's measurement of the highest index, whatever order the writers ran in."""
    algorithm = index % SHARED_ALGORITHMS
    return Entry(f"shared-{algorithm}", AlgoAttribute.NONE, 1e-3 * (algorithm + 1), 0.0,
                 10**6 - algorithm, None, index + 1, 1_700_000_000.0, "0.2.0")


# -- workers (each its own process) ----------------------------------------------------------

def worker_writer(path: str, writer: int, puts: int, go: str) -> None:
    while not os.path.exists(go):
        time.sleep(0.001)
    cache = FileCache(path)
    for j in range(puts):
        key = f"w{writer}-k{j}"
        shared = shared_entry(writer * puts + j)
        cache.put_many([(CATEGORY, key, entries_of(key)), (*SHARED, [shared])])


def worker_loop(path: str) -> None:
    cache_module.COMPACT_AFTER_BYTES = 64 * 1024
    cache = FileCache(path)
    n = 0
    while True:
        key = f"loop-{os.getpid()}-{n}"
        cache.put(CATEGORY, key, entries_of(key, 8))
        print(key, flush=True)  # reported only once the put returned
        n += 1


# -- 1. writers x puts ---------------------------------------------------------------------

def writers_and_puts(writers: int, puts: int, directory: str) -> dict:
    path = os.path.join(directory, "writers.bin")
    go = os.path.join(directory, "go")
    processes = [subprocess.Popen([sys.executable, "-m", "benchmarks.bench_cache_stress",
                                   "--worker", "writer", path, str(w), str(puts), go])
                 for w in range(writers)]
    time.sleep(1.0)  # let every process start before any writes
    started = time.perf_counter()
    Path(go).touch()
    failed = sum(process.wait() != 0 for process in processes)
    seconds = time.perf_counter() - started
    cache = FileCache(path)
    lost = sum(cache.get(CATEGORY, f"w{w}-k{j}") != entries_of(f"w{w}-k{j}")
               for w in range(writers) for j in range(puts))
    total = writers * puts
    expected = sorted((shared_entry(index) for index in range(total - SHARED_ALGORITHMS, total)),
                      key=lambda e: e.algorithm)
    found = sorted(cache.get(*SHARED) or [], key=lambda e: e.algorithm)
    lost_shared = sum(1 for want in expected if want not in found)
    return {"writers": writers, "puts": puts, "lost": lost, "lost_shared": lost_shared,
            "failed_processes": failed, "seconds": seconds}


# -- 2. kills ------------------------------------------------------------------------------

def kills(count: int, directory: str, rng: random.Random) -> dict:
    path = os.path.join(directory, "kills.bin")
    unreadable = lost = torn = 0
    reported: list[str] = []
    for _ in range(count):
        process = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_cache_stress",
                                    "--worker", "loop", path], stdout=subprocess.PIPE,
                                   text=True)
        first = process.stdout.readline()  # one put done: the writer is in its loop
        time.sleep(rng.uniform(0.0, 0.05))
        process.send_signal(signal.SIGKILL)
        rest, _ = process.communicate()
        reported += [line for line in (first + rest).splitlines() if line]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                _, _, contents = cachefile.read_file(path)
            torn += bool(contents is not None and contents.torn)
        except Exception:
            unreadable += 1
            continue
    data = read_cache_file(path)
    found = data.get(CATEGORY, {})
    lost = sum(found.get(key) != entries_of(key, 8) for key in reported)
    stale_before = len(_temporaries(path))
    FileCache(path).rewrite(lambda contents: None, force=True)  # what `cache compact` does
    return {"kills": count, "unreadable": unreadable, "lost_puts": lost,
            "reported_puts": len(reported), "torn_tails_seen": torn,
            "stale_tmp_before_compaction": stale_before,
            "stale_tmp_after": len(_temporaries(path))}


def _temporaries(path: str) -> list[str]:
    directory, name = os.path.split(path)
    return [f for f in os.listdir(directory) if f.startswith(f".{name}.") and f.endswith(".tmp")]


# -- 3. damaged files ----------------------------------------------------------------------

def _valid(directory: str) -> bytes:
    path = os.path.join(directory, "valid.bin")
    cache = FileCache(path)
    cache.put_many((CATEGORY, f"s{i}", entries_of(f"s{i}")) for i in range(40))
    for i in range(10):
        cache.put(CATEGORY, f"log{i}", entries_of(f"log{i}"))
    return Path(path).read_bytes()


def damage_kinds(directory: str) -> list[tuple[str, object]]:
    """(name, bytes or a maker of the path) for every kind of damage tried."""
    valid = _valid(directory)
    snapshot_end = cachefile.read(valid).snapshot_end
    kinds: list[tuple[str, object]] = []
    for name, offset in [("cut in header", 5), ("cut after header", cachefile.HEADER_SIZE),
                         ("cut in snapshot length", cachefile.HEADER_SIZE + 3),
                         ("cut in snapshot", snapshot_end // 2),
                         ("cut at snapshot end", snapshot_end),
                         ("cut in first log record", snapshot_end + 5),
                         ("cut in last log record", len(valid) - 7)]:
        kinds.append((name, valid[:offset]))
    for name, offset in [("flip in magic", 2), ("flip in version", 8),
                         ("flip in snapshot length", cachefile.HEADER_SIZE + 1),
                         ("flip in snapshot checksum", cachefile.HEADER_SIZE + 5),
                         ("flip in snapshot body", snapshot_end // 2),
                         ("flip in log record", snapshot_end + 20),
                         ("flip in last record", len(valid) - 3)]:
        kinds.append((name, valid[:offset] + bytes([valid[offset] ^ 0x5A]) + valid[offset + 1:]))
    format1 = msgpack.packb({"format": "fastrun-cache", "version": 1, "categories": {
        CATEGORY: {"k": [cache_module.entry_to_raw(e) for e in entries_of("k")]}}})
    kinds += [
        ("format 1 cut short", format1[:-9]),
        ("format 1 with bad entries", msgpack.packb({"format": "fastrun-cache", "version": 1,
                                                     "categories": {CATEGORY: {"k": [[1, 2]]}}})),
        ("log record with bad values", valid + cachefile.put_record(CATEGORY, "bad", [
            ["x", [], float("nan"), 0.0, float("inf"), None, 10, 1e300, "0"]])),
        ("log record that is no put", valid + cachefile.record(["delete", {}, "k"])),
        ("newer format", cachefile.MAGIC + b"\x09\x00\x00\x00 from the future"),
        ("older unknown format", cachefile.MAGIC + b"\x01\x00\x00\x00"),
        ("empty", b""),
        ("zeros", bytes(4096)),
        ("json", b'{"categories": {}}'),
        ("onnx-like protobuf", b"\x08\x07\x12\x07pytorch"),
        ("random bytes", random.Random(1).randbytes(3000)),
        ("directory", "dir"), ("fifo", "fifo"), ("device", "device"),
        ("over the size limit", "huge"),
    ]
    return kinds


def damaged(directory: str) -> dict:
    handled = []
    failures = []
    for index, (name, content) in enumerate(damage_kinds(directory)):
        path = os.path.join(directory, f"damaged-{index}.bin")
        limit = None
        if content == "dir":
            os.mkdir(path)
        elif content == "fifo":
            os.mkfifo(path)
        elif content == "device":
            os.symlink("/dev/zero", path)
        elif content == "huge":
            Path(path).write_bytes(cachefile.header() + bytes(4096))
            limit = "1KiB"
        else:
            Path(path).write_bytes(content)
        before = None if not isinstance(content, bytes) else content
        try:
            if limit:
                os.environ["FASTRUN_CACHE_MAX_BYTES"] = limit
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cache = FileCache(path)
                cache.get(CATEGORY, "s1")
                cache.put(CATEGORY, "after", entries_of("after"))
                assert cache.get(CATEGORY, "after") == entries_of("after")
            with contextlib.suppress(cachefile.CacheFormatError, OSError):
                read_cache_file(path)  # the tools' reader: a clear error or the contents
            kind = cachefile.probe(path).kind if os.path.lexists(path) else "moved"
            if before and cachefile._classify(before[:64]).kind in (
                    cachefile.FOREIGN, cachefile.NEWER):
                assert Path(path).read_bytes() == before, "a foreign file was changed"
            handled.append((name, kind))
        except Exception as error:  # the point of the benchmark: count what escapes
            failures.append((name, f"{type(error).__name__}: {error}"))
        finally:
            os.environ.pop("FASTRUN_CACHE_MAX_BYTES", None)
    return {"tried": len(handled) + len(failures), "handled": len(handled),
            "failures": failures}


# -- 4. put cost ---------------------------------------------------------------------------

def _format1_put(path: str, lock: filelock.FileLock, category: str, key: str,
                 entries: list[Entry]) -> None:
    """A put as fastrun 0.1 made it: read, merge, re-encode and replace under the lock."""
    from fastrun._files import atomic_write

    with lock:
        document = msgpack.unpackb(Path(path).read_bytes(), raw=False)
        keys = document["categories"].setdefault(category, {})
        old = [cache_module.entry_from_raw(raw) for raw in keys.get(key, [])]
        keys[key] = [cache_module.entry_to_raw(e)
                     for e in cache_module.merge_entries(old, entries)]
        atomic_write(path, msgpack.packb(document, use_bin_type=True))


def put_cost(size: int, directory: str, puts: int) -> dict:
    raws = {f"p{i}": [cache_module.entry_to_raw(e) for e in entries_of(f"p{i}")]
            for i in range(size)}
    new = os.path.join(directory, f"v2-{size}.bin")
    Path(new).write_bytes(cachefile.snapshot_file({CATEGORY: raws}, {}))
    old = os.path.join(directory, f"v1-{size}.bin")
    Path(old).write_bytes(msgpack.packb({"format": "fastrun-cache", "version": 1,
                                         "categories": {CATEGORY: raws}}, use_bin_type=True))
    cache = FileCache(new)
    lock = filelock.FileLock(old + ".lock")
    times_new, times_old = [], []
    for j in range(puts):
        key = f"new{j}"
        started = time.perf_counter()
        cache.put(CATEGORY, key, entries_of(key))
        times_new.append(time.perf_counter() - started)
        if j < max(5, puts // 5) or size <= 10_000:
            started = time.perf_counter()
            _format1_put(old, lock, CATEGORY, key, entries_of(key))
            times_old.append(time.perf_counter() - started)
    assert len(FileCache(new)) == size + puts
    return {"problems": size, "format2_ms": statistics.median(times_new) * 1e3,
            "format1_ms": statistics.median(times_old) * 1e3,
            "file_mb": os.path.getsize(new) / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, default=64)
    parser.add_argument("--puts", type=int, default=100)
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--cost-puts", type=int, default=50, help="timed puts per size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        if kind == "writer":
            worker_writer(rest[0], int(rest[1]), int(rest[2]), rest[3])
        else:
            worker_loop(rest[0])
        return

    logging.getLogger("fastrun").setLevel(logging.ERROR)  # the damage is expected here
    print(header("cache stress: concurrent writers, kills, damaged files, put cost"))
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as directory:
        result = writers_and_puts(args.writers, args.puts, directory)
        print(f"writers x puts: {result['writers']} x {result['puts']} in "
              f"{result['seconds']:.1f} s: {result['lost']} problems lost, "
              f"{result['lost_shared']} of the shared key's {SHARED_ALGORITHMS} winning "
              f"re-measurements lost, {result['failed_processes']} "
              "writers failed (target 64 x 100, 0 lost)", flush=True)
        result = kills(args.kills, directory, rng)
        print(f"kills: {result['kills']} SIGKILLs during puts and compactions: "
              f"{result['unreadable']} unreadable files, {result['lost_puts']} of "
              f"{result['reported_puts']} reported puts lost, {result['torn_tails_seen']} torn "
              f"tails dropped, stale tmp files {result['stale_tmp_before_compaction']} before "
              f"the next compaction and {result['stale_tmp_after']} after (target 200 kills, 0 "
              "unreadable, 0 stale)", flush=True)
        result = damaged(directory)
        print(f"damaged files: {result['handled']} of {result['tried']} kinds handled"
              + "".join(f"\n  NOT HANDLED {name}: {why}" for name, why in result["failures"]),
              flush=True)
        print("| problems | file MB | format-2 put ms (median) | format-1 put ms (median) "
              "| format-1 / format-2 |")
        print("| --- | --- | --- | --- | --- |")
        for size in (int(s) for s in args.sizes.split(",")):
            cost = put_cost(size, directory, args.cost_puts)
            print(f"| {cost['problems']} | {cost['file_mb']:.1f} | {cost['format2_ms']:.3f} | "
                  f"{cost['format1_ms']:.1f} | {cost['format1_ms'] / cost['format2_ms']:.0f}x |",
                  flush=True)


if __name__ == "__main__":
    main()
