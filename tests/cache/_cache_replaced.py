"""The replaced-file scenario of issue 32 (D1), run in a directory given on the command line,
so that a test can run it on whatever file system ``tmp_path`` is and on a real ext4 (where a
compaction's new file gets a freed inode number back at once).

A long-lived writer and a long-lived reader open the cache; another process writes 50 keys;
two compactions replace the file; then the writer puts once more and the reader looks up
every key.  Prints one JSON object: what the file holds afterwards, what the reader saw, and
the inode numbers the file had (the reuse that fooled the inode check).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

from fastrun.attribute import AlgoAttribute
from fastrun.cache import Entry, FileCache

CATEGORY = "cpu;processor=Test CPU;isa=x86-64-v3;threads=2|matmul@4"
KEYS = [f"k{i}" for i in range(50)]


def entries(key: str) -> list[Entry]:
    return [Entry(f"{key}-blas", AlgoAttribute.REPRODUCIBLE, 1e-3, 1e-5, 0, 1e-7, 10,
                  1_700_000_000.0, "0.1.0")]


def other_process(path: str, code: str) -> None:
    subprocess.run([sys.executable, "-c", code], check=True, env={
        **os.environ, "SCENARIO_PATH": path})


def main(directory: str) -> None:
    path = os.path.join(directory, "shared.bin")
    writer = FileCache(path)
    writer.put(CATEGORY, "first", entries("first"))
    reader = FileCache(path)
    inodes = [os.stat(path).st_ino]
    other_process(path, "import os, sys; sys.path.insert(0, os.getcwd());"
                  "from tests.cache._cache_replaced import CATEGORY, KEYS, entries;"
                  "from fastrun.cache import FileCache;"
                  "c = FileCache(os.environ['SCENARIO_PATH']);"
                  "[c.put(CATEGORY, k, entries(k)) for k in KEYS]")
    for _ in range(2):
        subprocess.run([sys.executable, "-m", "fastrun.cli.main", "cache", "compact", path],
                       check=True, capture_output=True)
        inodes.append(os.stat(path).st_ino)
    size_before = os.path.getsize(path)
    writer.put(CATEGORY, "after", entries("after"))
    seen = [key for key in ["first", *KEYS] if reader.get(CATEGORY, key) is not None]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        final = FileCache(path)
        stored = [key for key in ["first", *KEYS, "after"]
                  if final.get(CATEGORY, key) == entries(key)]
    print(json.dumps({"stored": stored, "reader_saw": seen, "inodes": inodes,
                      "size_before_put": size_before, "size_after_put": os.path.getsize(path),
                      "warnings": [str(w.message) for w in caught],
                      "moved_aside": [f for f in os.listdir(directory) if ".corrupt-" in f]}))


if __name__ == "__main__":
    main(sys.argv[1])
