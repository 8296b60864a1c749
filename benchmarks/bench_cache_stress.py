"""How much abuse the cache file takes, and what a put costs (issues 14 and 32).

Each phase runs real processes on one file and checks every acknowledged put afterwards:

1. **writers**: ``--writers`` processes each put ``--puts`` problems (and a re-measurement of
   one of the 10 algorithms of a key they all share) while ``--compactors`` processes compact
   the file over and over (``fastrun cache compact``'s code path) and ``--readers`` long-lived
   processes, opened before the first put, look keys up throughout.  Then every problem must
   be in the file, the shared key must hold what the merge rule keeps, and every reader,
   still with the cache object it opened at the start, must find every key.  Target: 64 x 100
   with compaction throughout, 0 lost, readers 100%.
2. **throughput**: ``--writers`` processes each put ``--puts`` records of 40 entries (a conv
   search's size) with the default compaction: puts per second, and the longest wait for the
   lock (timed around the lock itself).  Target: >= 200 puts/s, no wait near the 60 s timeout.
3. **kills**: a writer putting as fast as it can (its log compacted every 64 KiB) and a
   compactor compacting as fast as it can are killed with SIGKILL ``--kills`` times in turn at
   random moments (a compactor within 50 ms of starting a rewrite); after each kill the file
   must read as a fastrun cache, and at the end hold every put the writer reported done.
   Kills that left a compaction's temporary file landed in a compaction.  Target: 200 kills,
   some in compactions, 0 unreadable, 0 lost, 0 stale temporary files after the next
   compaction.
4. **flips**: one byte flipped in each record of a file in turn (``--flips`` files): the flip
   must cost that record's key only, and be reported by ``fastrun cache check`` (a flip in
   the last record makes it a torn tail, which a reader cannot tell from a write in progress;
   ``check`` reports it, and the next writer cuts it with a report).
5. **damaged files**: kinds of damage (cuts, flips, zeros, foreign files, special files); each
   is opened, read by the tools' reader and written to; *handled* means no exception escaped,
   the outcome is the documented one, and a foreign file is left byte for byte.
6. **put cost** at 1k, 10k and 100k problems, against a put into a format-1 file (read, merge,
   re-encode and replace the whole document under the lock, as fastrun 0.1 did), measured
   here: the ratio is the peer's time over ours.

``--fs here,tmpfs,ext4`` runs phases 1-4 on each file system: ``here`` is the temporary
folder, ``tmpfs`` and ``ext4`` a fresh mount (an ext4 loop image) in a mount namespace of the
benchmark's own (root; reported and skipped where mounting is not allowed).  ext4 matters: it
hands a freed inode number back at once, which is how a compacted file once fooled a writer.

    python -m benchmarks.bench_cache_stress [--writers 64] [--puts 100] [--compactors 2]
        [--readers 4] [--kills 200] [--flips 5] [--fs here,tmpfs,ext4]
        [--sizes 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import shlex
import shutil
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
from fastrun.cache import Entry, FileCache, read_cache_file, store
from fastrun.cache import file as cachefile
from fastrun.cache import tools as cachetools

CATEGORY = "cpu;processor=Stress CPU;isa=x86-64-v4;threads=16|matmul@4"
SHARED = (CATEGORY.replace("matmul", "shared"), "k")
#: the shared key holds measurements of this many algorithms, re-measured by every writer
SHARED_ALGORITHMS = 10


def entries_of(key: str, count: int = 3) -> list[Entry]:
    return [Entry(f"{key}-a{i}", AlgoAttribute.NONE if i % 2 else AlgoAttribute.REPRODUCIBLE,
                  1e-3 * (i + 1), 1e-5, 1000 * (count - i), None, 10 + i,
                  1_700_000_000.0 + i, "0.2.0") for i in range(count)]


def shared_entry(index: int) -> Entry:
    """Put number ``index`` (over all writers) re-measures one algorithm of the shared key with
    ``index + 1`` repeats: by the merge rule (more repeats wins) the file must end with each
    algorithm's measurement of the highest index, whatever order the writers ran in."""
    algorithm = index % SHARED_ALGORITHMS
    return Entry(f"shared-{algorithm}", AlgoAttribute.NONE, 1e-3 * (algorithm + 1), 0.0,
                 10**6 - algorithm, None, index + 1, 1_700_000_000.0, "0.2.0")


def _keys(writers: int, puts: int) -> list[str]:
    return [f"w{w}-k{j}" for w in range(writers) for j in range(puts)]


def _wait_for(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(0.001)


# -- workers (each its own process) ----------------------------------------------------------

def worker_writer(path: str, writer: int, puts: int, go: str) -> None:
    _wait_for(go)
    cache = FileCache(path)
    for j in range(puts):
        key = f"w{writer}-k{j}"
        shared = shared_entry(writer * puts + j)
        cache.put_many([(CATEGORY, key, entries_of(key)), (*SHARED, [shared])])


def worker_big_writer(path: str, writer: int, puts: int, go: str) -> None:
    """Puts 40-entry records; prints the longest wait for the lock and the put latencies."""
    cache = FileCache(path)
    lock, waits = cache._file_lock, []
    acquire = lock.acquire

    def timed_acquire(timeout: float) -> None:
        started = time.perf_counter()
        try:
            acquire(timeout)
        finally:
            waits.append(time.perf_counter() - started)

    lock.acquire = timed_acquire  # instrumentation: the wait for the lock alone
    work = [(f"w{writer}-k{j}", entries_of(f"w{writer}-k{j}", 40)) for j in range(puts)]
    _wait_for(go)
    latencies = []
    for key, entries in work:
        started = time.perf_counter()
        cache.put(CATEGORY, key, entries)
        latencies.append(time.perf_counter() - started)
    print(json.dumps({"max_wait": max(waits), "latencies": latencies}))


def worker_compactor(path: str, go: str, done: str) -> None:
    """From ``go`` until ``done`` exists, compacts as ``fastrun cache compact`` does; prints
    how many times."""
    count = 0
    _wait_for(go)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        while not os.path.exists(done):
            if os.path.exists(path):
                FileCache(path).rewrite(None, force=True)
                count += 1
            time.sleep(0.005)
    print(count)


def worker_reader(path: str, writers: int, puts: int, done: str) -> None:
    """Opens the cache before the first put, looks random keys up while the writers run, and
    at the end every key, with the same cache object; prints how many it found."""
    rng = random.Random(os.getpid())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cache = FileCache(path)
        keys = _keys(writers, puts)
        while not os.path.exists(done):
            cache.get(CATEGORY, rng.choice(keys))
            time.sleep(0.01)
        print(sum(cache.get(CATEGORY, key) == entries_of(key) for key in keys))


def worker_loop(path: str) -> None:
    store.COMPACT_AFTER_BYTES = 64 * 1024  # the module that reads it (issue 32, D11)
    cache = FileCache(path)
    n = 0
    while True:
        key = f"loop-{os.getpid()}-{n}"
        cache.put(CATEGORY, key, entries_of(key, 8))
        print(key, flush=True)  # reported only once the put returned
        n += 1


def worker_compact_loop(path: str) -> None:
    while True:
        cache = FileCache(path)
        print("compacting", flush=True)  # the kill comes during the rewrite that follows
        cache.rewrite(None, force=True)


def _spawn(*arguments: str, **options) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "benchmarks.bench_cache_stress", "--worker",
                             *arguments], **options)


# -- 1. writers, compactors, readers ---------------------------------------------------------

def writers_and_puts(writers: int, puts: int, compactors: int, readers: int,
                     directory: str) -> dict:
    path = os.path.join(directory, "writers.bin")
    go, done = os.path.join(directory, "go"), os.path.join(directory, "done")
    FileCache(path).put(CATEGORY, "start", entries_of("start"))  # readers open a real file
    reading = [_spawn("reader", path, str(writers), str(puts), done, stdout=subprocess.PIPE,
                      text=True) for _ in range(readers)]
    compacting = [_spawn("compactor", path, go, done, stdout=subprocess.PIPE, text=True)
                  for _ in range(compactors)]
    processes = [_spawn("writer", path, str(w), str(puts), go) for w in range(writers)]
    time.sleep(1.0 + 0.05 * writers)  # let every process start before any writes
    started = time.perf_counter()
    Path(go).touch()
    failed = sum(process.wait() != 0 for process in processes)
    seconds = time.perf_counter() - started
    Path(done).touch()
    compactions = sum(int(p.communicate()[0] or 0) for p in compacting)
    seen = [int(p.communicate()[0] or 0) for p in reading]
    cache = FileCache(path)
    lost = sum(cache.get(CATEGORY, key) != entries_of(key) for key in _keys(writers, puts))
    total = writers * puts
    expected = sorted((shared_entry(index) for index in range(total - SHARED_ALGORITHMS, total)),
                      key=lambda e: e.algorithm)
    found = sorted(cache.get(*SHARED) or [], key=lambda e: e.algorithm)
    lost_shared = sum(1 for want in expected if want not in found)
    return {"writers": writers, "puts": puts, "lost": lost, "lost_shared": lost_shared,
            "failed_processes": failed, "seconds": seconds, "compactions": compactions,
            "readers_saw": [count / total for count in seen]}


# -- 2. throughput of 40-entry records -------------------------------------------------------

def throughput(writers: int, puts: int, directory: str) -> dict:
    path = os.path.join(directory, "big.bin")
    go = os.path.join(directory, "go-big")
    processes = [_spawn("big", path, str(w), str(puts), go, stdout=subprocess.PIPE, text=True)
                 for w in range(writers)]
    time.sleep(2.0 + 0.1 * writers)  # imports and the records made before the start
    started = time.perf_counter()
    Path(go).touch()
    reports = [json.loads(p.communicate()[0]) for p in processes]
    seconds = time.perf_counter() - started
    cache = FileCache(path)
    lost = sum(cache.get(CATEGORY, key) != entries_of(key, 40) for key in _keys(writers, puts))
    latencies = sorted(x for report in reports for x in report["latencies"])
    return {"puts_per_s": writers * puts / seconds, "seconds": seconds, "lost": lost,
            "max_wait": max(r["max_wait"] for r in reports),
            "p99_put": latencies[int(0.99 * (len(latencies) - 1))],
            "max_put": latencies[-1], "megabytes": os.path.getsize(path) / 1e6}


# -- 3. kills --------------------------------------------------------------------------------

def kills(count: int, directory: str, rng: random.Random) -> dict:
    path = os.path.join(directory, "kills.bin")
    unreadable = in_compaction = torn = 0
    reported: list[str] = []
    generations: set[bytes] = set()
    for index in range(count):
        compactor = index % 2 == 1 and os.path.exists(path)
        process = (_spawn("compact-loop", path, stdout=subprocess.PIPE, text=True) if compactor
                   else _spawn("loop", path, stdout=subprocess.PIPE, text=True))
        first = process.stdout.readline()  # in its loop: one put done, or about to compact
        time.sleep(rng.uniform(0.0, 0.05))
        process.send_signal(signal.SIGKILL)
        rest, _ = process.communicate()
        if not compactor:
            reported += [line for line in (first + rest).splitlines() if line]
        in_compaction += bool(_temporaries(path))
        with contextlib.suppress(OSError, cachefile.CacheFormatError), open(path, "rb") as file:
            generations.add(cachefile.generation(file.read(cachefile.HEADER_SIZE)))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                _, _, contents = cachefile.read_file(path)
            torn += bool(contents is not None and contents.torn)
        except Exception:
            unreadable += 1
    data = read_cache_file(path)
    found = data.get(CATEGORY, {})
    lost = sum(found.get(key) != entries_of(key, 8) for key in reported)
    stale_before = len(_temporaries(path))
    FileCache(path).rewrite(None, force=True)  # what `cache compact` does
    return {"kills": count, "unreadable": unreadable, "lost_puts": lost,
            "reported_puts": len(reported), "torn_tails_seen": torn,
            "kills_in_compaction": in_compaction, "generations": len(generations),
            "stale_tmp_before_compaction": stale_before,
            "stale_tmp_after": len(_temporaries(path))}


def _temporaries(path: str) -> list[str]:
    directory, name = os.path.split(path)
    return [f for f in os.listdir(directory) if f.startswith(f".{name}.") and f.endswith(".tmp")]


# -- 4. one flipped byte costs one record ----------------------------------------------------

def flips(files: int, directory: str, rng: random.Random) -> dict:
    tried = own_only = reported = 0
    for index in range(files):
        path = os.path.join(directory, f"flips-{index}.bin")
        _filled(path, snapshot_keys=20, log_keys=20)
        data = Path(path).read_bytes()
        frames = cachefile.scan(data, cachefile.HEADER_SIZE)
        for offset, body in frames.bodies:
            at = offset + rng.randrange(cachefile.RECORD_HEADER_SIZE + len(body))
            Path(path).write_bytes(data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))])
                                   + data[at + 1:])
            keys = (_snapshot_keys(20) if offset == cachefile.HEADER_SIZE
                    else {_record_key(body)})
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cache = FileCache(path, read_only=True)
            lost = {key for key in [*_snapshot_keys(20), *_log_keys(20)]
                    if cache.get(CATEGORY, key) != entries_of(key)}
            tried += 1
            own_only += lost <= keys
            reported += not cachetools.check(path)["clean"] or not lost
    return {"flips": tried, "own_record_only": own_only, "reported": reported}


def _snapshot_keys(count: int) -> set[str]:
    return {f"s{i}" for i in range(count)}


def _log_keys(count: int) -> set[str]:
    return {f"log{i}" for i in range(count)}


def _record_key(body: memoryview) -> str:
    return msgpack.unpackb(body, raw=False)[2]


def _filled(path: str, snapshot_keys: int, log_keys: int) -> None:
    cache = FileCache(path)
    cache.put_many((CATEGORY, key, entries_of(key)) for key in sorted(_snapshot_keys(
        snapshot_keys)))
    for key in sorted(_log_keys(log_keys)):
        cache.put(CATEGORY, key, entries_of(key))


# -- 5. damaged files ----------------------------------------------------------------------

def _valid(directory: str) -> bytes:
    path = os.path.join(directory, "valid.bin")
    _filled(path, snapshot_keys=40, log_keys=10)
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
                         ("flip in generation", 14), ("flip in header checksum", 29),
                         ("flip in snapshot length", cachefile.HEADER_SIZE + 5),
                         ("flip in snapshot checksum", cachefile.HEADER_SIZE + 9),
                         ("flip in snapshot body", snapshot_end // 2),
                         ("flip in log record", snapshot_end + 20),
                         ("flip in last record", len(valid) - 3)]:
        kinds.append((name, valid[:offset] + bytes([valid[offset] ^ 0x5A]) + valid[offset + 1:]))
    format1 = msgpack.packb({"format": "fastrun-cache", "version": 1, "categories": {
        CATEGORY: {"k": [cache_module.entry_to_raw(e) for e in entries_of("k")]}}})
    kinds += [
        ("zeros inside the log", valid[:snapshot_end + 40] + bytes(8) + valid[snapshot_end + 40:]),
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


# -- 6. put cost ---------------------------------------------------------------------------

def _format1_put(path: str, lock: filelock.FileLock, category: str, key: str,
                 entries: list[Entry]) -> None:
    """A put as fastrun 0.1 made it: read, merge, re-encode and replace under the lock."""
    from fastrun.base.files import atomic_write

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
    new = os.path.join(directory, f"v3-{size}.bin")
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
    return {"problems": size, "format3_ms": statistics.median(times_new) * 1e3,
            "format1_ms": statistics.median(times_old) * 1e3,
            "file_mb": os.path.getsize(new) / 1e6}


# -- file systems --------------------------------------------------------------------------

def _on_file_system(kind: str, argv: list[str]) -> int:
    """Run this benchmark's file phases (``argv``) on a fresh ``kind`` mount, in a mount
    namespace of its own; 77 when no mount is allowed here."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        print(f"{kind}: skipped: mounting needs root and unshare", flush=True)
        return 77
    with tempfile.TemporaryDirectory() as scratch:
        mount_point = os.path.join(scratch, kind)
        os.mkdir(mount_point)
        if kind == "tmpfs":
            mount = f"mount -t tmpfs -o size=512m tmpfs {shlex.quote(mount_point)}"
        else:
            image = os.path.join(scratch, "ext4.img")
            with open(image, "wb") as file:
                file.truncate(512 << 20)
            subprocess.run(["mkfs.ext4", "-q", "-F", image], check=True)
            mount = f"mount -o loop {shlex.quote(image)} {shlex.quote(mount_point)}"
        command = [sys.executable, "-m", "benchmarks.bench_cache_stress", *argv,
                   "--in", mount_point, "--fs-name", kind]
        script = f"{mount} || exit 77; exec {shlex.join(command)}"
        code = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                               script]).returncode
        if code == 77:
            print(f"{kind}: skipped: no mount allowed here", flush=True)
        return code


def file_phases(args: argparse.Namespace, directory: str, name: str) -> None:
    rng = random.Random(args.seed)
    result = writers_and_puts(args.writers, args.puts, args.compactors, args.readers, directory)
    seen = result["readers_saw"]
    print(f"[{name}] writers: {result['writers']} x {result['puts']} in "
          f"{result['seconds']:.1f} s with {args.compactors} compactors "
          f"({result['compactions']} compactions): {result['lost']} problems lost, "
          f"{result['lost_shared']} of the shared key's {SHARED_ALGORITHMS} winning "
          f"re-measurements lost, {result['failed_processes']} writers failed; "
          f"{len(seen)} long-lived readers saw "
          + ", ".join(f"{share:.1%}" for share in seen)
          + " of the keys (target 64 x 100, 0 lost, 100%)", flush=True)
    result = throughput(args.writers, args.puts, directory)
    print(f"[{name}] throughput: {args.writers} writers x {args.puts} puts of 40-entry records "
          f"in {result['seconds']:.1f} s: {result['puts_per_s']:.0f} puts/s, "
          f"{result['lost']} lost, longest wait for the lock {result['max_wait']:.2f} s, "
          f"put p99 {result['p99_put'] * 1e3:.0f} ms, longest put {result['max_put']:.2f} s, "
          f"file {result['megabytes']:.1f} MB (target >= 200 puts/s, no wait near the "
          f"{store.config.CACHE_LOCK_TIMEOUT.get():g} s timeout)", flush=True)
    result = kills(args.kills, directory, rng)
    print(f"[{name}] kills: {result['kills']} SIGKILLs of a writer and of a compactor in turn "
          f"({result['generations']} file generations seen, each a compaction): "
          f"{result['kills_in_compaction']} left a compaction's temporary file, "
          f"{result['unreadable']} unreadable files, {result['lost_puts']} of "
          f"{result['reported_puts']} reported puts lost, {result['torn_tails_seen']} torn "
          f"tails seen, stale tmp files {result['stale_tmp_before_compaction']} before the "
          f"next compaction and {result['stale_tmp_after']} after (target 200 kills, 0 "
          "unreadable, 0 lost, 0 stale)", flush=True)
    result = flips(args.flips, directory, rng)
    print(f"[{name}] flips: {result['flips']} single flipped bytes, one per record: "
          f"{result['own_record_only']} cost only their own record, {result['reported']} "
          "were reported (target: all of them)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writers", type=int, default=64)
    parser.add_argument("--puts", type=int, default=100)
    parser.add_argument("--compactors", type=int, default=2)
    parser.add_argument("--readers", type=int, default=4)
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--flips", type=int, default=5)
    parser.add_argument("--fs", default="here,tmpfs,ext4",
                        help="file systems for the file phases: here, tmpfs, ext4")
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--cost-puts", type=int, default=50, help="timed puts per size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--in", dest="directory", help=argparse.SUPPRESS)
    parser.add_argument("--fs-name", help=argparse.SUPPRESS)
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, *rest = args.worker
        workers = {"writer": lambda: worker_writer(rest[0], int(rest[1]), int(rest[2]), rest[3]),
                   "big": lambda: worker_big_writer(rest[0], int(rest[1]), int(rest[2]),
                                                    rest[3]),
                   "compactor": lambda: worker_compactor(rest[0], rest[1], rest[2]),
                   "reader": lambda: worker_reader(rest[0], int(rest[1]), int(rest[2]),
                                                   rest[3]),
                   "loop": lambda: worker_loop(rest[0]),
                   "compact-loop": lambda: worker_compact_loop(rest[0])}
        workers[kind]()
        return

    logging.getLogger("fastrun").setLevel(logging.ERROR)  # the damage is expected here
    if args.directory:  # the file phases on a mount made for them (see _on_file_system)
        file_phases(args, args.directory, args.fs_name)
        return
    print(header("cache stress: writers, compactors, readers, kills, flips, damage, put cost"))
    file_args = [f"--{name}={getattr(args, name)}" for name in
                 ("writers", "puts", "compactors", "readers", "kills", "flips", "seed")]
    for kind in args.fs.split(","):
        if kind == "here":
            with tempfile.TemporaryDirectory() as directory:
                file_phases(args, directory, f"here: {_file_system(directory)}")
        else:
            _on_file_system(kind, file_args)
    with tempfile.TemporaryDirectory() as directory:
        result = damaged(directory)
        print(f"damaged files: {result['handled']} of {result['tried']} kinds handled"
              + "".join(f"\n  NOT HANDLED {name}: {why}" for name, why in result["failures"]),
              flush=True)
        print("| problems | file MB | format-3 put ms (median) | format-1 put ms (median) "
              "| format-1 / format-3 |")
        print("| --- | --- | --- | --- | --- |")
        for size in (int(s) for s in args.sizes.split(",")):
            cost = put_cost(size, directory, args.cost_puts)
            print(f"| {cost['problems']} | {cost['file_mb']:.1f} | {cost['format3_ms']:.3f} | "
                  f"{cost['format1_ms']:.1f} | {cost['format1_ms'] / cost['format3_ms']:.0f}x |",
                  flush=True)


def _file_system(directory: str) -> str:
    """The type of the file system ``directory`` is on, from /proc/mounts."""
    best, kind = "", "unknown"
    with contextlib.suppress(OSError), open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2 and directory.startswith(fields[1]) and len(fields[1]) > len(best):
                best, kind = fields[1], fields[2]
    return kind


if __name__ == "__main__":
    main()
