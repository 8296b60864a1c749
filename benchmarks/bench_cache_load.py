"""Loading a cache file with 10,000 problems: FileCache versus the bare msgpack decode of the
same bytes (the floor any msgpack-based cache pays), in the same run.  Target: under 100 ms.

    python benchmarks/bench_cache_load.py
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time

import msgpack

from benchmarks._common import header
from fastrun.attribute import AlgoAttribute
from fastrun.cache import Entry, FileCache


def build(path: str, keys: int, per_key: int) -> None:
    cache = FileCache(path)
    attributes = [AlgoAttribute.REPRODUCIBLE, AlgoAttribute.NONE,
                  AlgoAttribute.REPRODUCIBLE | AlgoAttribute.USABLE_DEPEND_ON_SHAPE]
    items = []
    for index in range(keys):
        key = f"float32[{index}x512],float32[512x{128 + index % 7}]"
        entries = [Entry(f"algo{j}(mb={j})", attributes[j % 3], 1e-4 * (j + 1), 1e-6,
                         1024 * j, 1e-7, 20, 1.7e9, "bench") for j in range(per_key)]
        items.append((f"cpu;bench|matmul@1|format=1#{index % 3}", key, entries))
    cache.put_many(items)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--entries-per-key", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print(header(f"cache load, {args.keys} problems x {args.entries_per_key} entries"))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "cache.bin")
        build(path, args.keys, args.entries_per_key)
        size = os.path.getsize(path)
        load, decode = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            cache = FileCache(path)
            load.append(time.perf_counter() - start)
            # The floor: read and decode the same bytes, with the collector paused as the cache
            # does (with it running, the bare decode is slower than FileCache).
            gc.disable()
            start = time.perf_counter()
            with open(path, "rb") as handle:
                msgpack.unpackb(handle.read(), raw=False)
            decode.append(time.perf_counter() - start)
            gc.enable()
        assert len(cache) == args.keys
        first_key = next(iter(cache))
        assert len(first_key[2]) > 0
    load_ms, decode_ms = statistics.median(load) * 1e3, statistics.median(decode) * 1e3
    print(f"file size               {size / 1e6:.2f} MB")
    print(f"FileCache(path)         {load_ms:.1f} ms (median of {args.repeats})")
    print(f"bare msgpack decode     {decode_ms:.1f} ms (gc paused)")
    print(f"ratio FileCache/decode  {load_ms / decode_ms:.2f}")
    print(f"target < 100 ms: {'met' if load_ms < 100 else 'MISSED'}")


if __name__ == "__main__":
    main()
