"""A cache that never loses a record (issue 32): file generations that no file system can
fake, no writer cutting what it did not check, damage that costs only itself and is reported,
one rule for names at put and at read.  Real files, real processes, a real ext4."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from fastrun.attribute import AlgoAttribute
from fastrun.cache import CacheCorruptWarning, Entry, FileCache, InMemoryCache
from fastrun.cache import file as cachefile
from fastrun.cli.main import main
from tests.cache._cache_replaced import CATEGORY, KEYS
from tests.cache._ext4 import REPO, run_on_ext4


def entry(algorithm: str = "blas", time_s: float = 1e-3) -> Entry:
    return Entry(algorithm, AlgoAttribute.REPRODUCIBLE, time_s, 1e-5, 0, 1e-7, 10,
                 1_700_000_000.0, "0.1.0")


def quietly(path: Path) -> FileCache:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return FileCache(path)


def filled(path: Path, count: int = 10) -> FileCache:
    """A cache of one snapshot key and ``count`` log records, one key each."""
    cache = FileCache(path)
    cache.put(CATEGORY, "snap", [entry()])
    cache.rewrite(lambda contents: None, force=True)  # "snap" into the snapshot
    for i in range(count):
        cache.put(CATEGORY, f"log{i}", [entry(f"algo{i}")])
    return cache


def record_offsets(path: Path) -> list[int]:
    data = path.read_bytes()
    return [offset for offset, _ in cachefile.scan(data, cachefile.HEADER_SIZE).bodies]


# -- D1: a replaced file is recognised by its generation, not its inode ----------------------

def _replaced_scenario(result: dict) -> None:
    expected = ["first", *KEYS, "after"]
    assert result["stored"] == expected, result
    assert result["reader_saw"] == ["first", *KEYS]
    assert result["size_after_put"] > result["size_before_put"]
    assert not result["moved_aside"] and not result["warnings"]


def test_a_writer_and_a_reader_survive_two_compactions_by_another_process(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tests.cache._cache_replaced",
                           str(tmp_path)], capture_output=True, text=True, cwd=REPO, check=True)
    _replaced_scenario(json.loads(done.stdout))


def test_on_ext4_a_reused_inode_never_lets_a_writer_cut_the_new_file(tmp_path):
    """The reproduction of issue 32's D1: ext4 gives the second compaction's file the first
    file's inode; the writer used to append at its old offset inside the new snapshot and cut
    the file (2,496 bytes to 273)."""
    done = run_on_ext4(tmp_path, [sys.executable, "-m", "tests.cache._cache_replaced"])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    _replaced_scenario(result)


def test_an_append_checks_the_generation_through_the_descriptor_it_writes(tmp_path):
    """A file replaced by one of the same size, inode and mtime (what a coarse clock and a
    reused inode can make) is still told apart: its generation differs."""
    path = tmp_path / "c.bin"
    writer = FileCache(path)
    writer.put(CATEGORY, "mine", [entry()])
    other = FileCache(path)
    other.put(CATEGORY, "theirs", [entry()])
    data = path.read_bytes()
    replaced = cachefile.snapshot_file({CATEGORY: {"x" * len("theirs"): [cache_raw(entry())]}},
                                       {})
    assert cachefile.generation(replaced) != cachefile.generation(data)
    with open(path, "r+b") as file:  # same inode; new generation, other records
        file.write(replaced)
        file.truncate()
    writer.put(CATEGORY, "later", [entry()])
    reread = FileCache(path)
    assert reread.get(CATEGORY, "later") == [entry()]
    assert reread.get(CATEGORY, "x" * len("theirs")) is not None


# -- D2: the size limit refuses a write, it never cuts -----------------------------------------

def test_a_writer_whose_size_limit_is_below_the_file_refuses_and_cuts_nothing(tmp_path):
    path = tmp_path / "c.bin"
    filled(path, 30)
    data = path.read_bytes()
    code = ("import warnings; warnings.simplefilter('ignore');"
            "from fastrun.cache import FileCache;"
            "from tests.cache.test_cache_integrity import entry, CATEGORY;"
            f"c = FileCache({str(path)!r}); c.put(CATEGORY, 'small', [entry()]);"
            "print(c.unwritable)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, check=True,
                          env={**os.environ, "FASTRUN_CACHE_MAX_BYTES": str(len(data) // 2)})
    assert "limit" in done.stdout and "FASTRUN_CACHE_MAX_BYTES" in done.stdout
    assert path.read_bytes() == data


def test_a_writer_that_reaches_its_limit_mid_run_refuses_and_cuts_nothing(tmp_path, monkeypatch):
    path = tmp_path / "c.bin"
    cache = filled(path, 5)
    other = FileCache(path)
    for i in range(20):
        other.put(CATEGORY, f"other{i}", [entry()])
    data = path.read_bytes()
    monkeypatch.setenv("FASTRUN_CACHE_MAX_BYTES", str(len(data) - 10))
    with pytest.warns(UserWarning, match="limit"):
        cache.put(CATEGORY, "over", [entry()])
    assert path.read_bytes() == data
    assert cache.unwritable is not None and cache.unsaved == 1


# -- D3 and D13: damage costs only itself and is reported ----------------------------------------

def _damaged(path: Path, how: str) -> tuple[bytes, int]:
    """Damage the fourth log record (``log3``) of a filled cache; returns the bytes before."""
    filled(path, 10)
    data = path.read_bytes()
    offsets = record_offsets(path)
    at = offsets[4]  # the snapshot is record 0: log0 .. log9 follow
    if how == "flip":
        damaged = data[:at + 20] + bytes([data[at + 20] ^ 0x01]) + data[at + 21:]
    elif how == "zeros":
        damaged = data[:at] + bytes(8) + data[at:]
    elif how == "undecodable":
        body = b"\xc1" * 7  # 0xc1 is never valid msgpack; the checksum holds
        frame = cachefile._RECORD.pack(cachefile.RECORD_MAGIC, len(body), cachefile._checksum(
            cachefile._LENGTH.pack(len(body)), body)) + body
        damaged = data[:at] + frame + data[at:]
    else:
        raise AssertionError(how)
    path.write_bytes(damaged)
    return damaged, at


@pytest.mark.parametrize("how", ["flip", "zeros", "undecodable"])
def test_a_damaged_record_costs_only_itself_and_is_reported(tmp_path, how, capsys):
    path = tmp_path / "c.bin"
    damaged, at = _damaged(path, how)
    lost = {"log3"} if how == "flip" else set()
    with pytest.warns(CacheCorruptWarning, match=f"offset {at}"):
        cache = FileCache(path)
    for key in ["snap", *(f"log{i}" for i in range(10))]:
        assert (cache.get(CATEGORY, key) is None) == (key in lost), key
    assert [d.offset for d in cache.damage] == [at]

    assert main(["cache", "check", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"offset {at}" in out
    assert main(["cache", "show", str(path)]) == 1
    assert f"offset {at}" in capsys.readouterr().out
    assert path.read_bytes() == damaged  # the tools only read

    cache.put(CATEGORY, "new", [entry()])  # a writer appends after the damage, cuts nothing
    assert path.read_bytes().startswith(damaged)
    assert main(["cache", "compact", str(path)]) == 0  # compaction keeps every whole record
    capsys.readouterr()
    compacted = quietly(path)
    for key in ["snap", "new", *(f"log{i}" for i in range(10))]:
        assert (compacted.get(CATEGORY, key) is None) == (key in lost), key
    assert main(["cache", "check", str(path)]) == 0
    assert "clean" in capsys.readouterr().out


def test_a_damaged_snapshot_costs_the_snapshot_only(tmp_path):
    path = tmp_path / "c.bin"
    filled(path, 3)
    data = bytearray(path.read_bytes())
    data[cachefile.HEADER_SIZE + cachefile.RECORD_HEADER_SIZE + 5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.warns(CacheCorruptWarning, match=f"offset {cachefile.HEADER_SIZE}"):
        cache = FileCache(path)
    assert cache.get(CATEGORY, "snap") is None
    assert [cache.get(CATEGORY, f"log{i}") for i in range(3)] == [[entry(f"algo{i}")]
                                                                  for i in range(3)]


def test_a_torn_tail_is_reported_by_check_and_cut_by_the_next_writer(tmp_path, capsys, caplog):
    path = tmp_path / "c.bin"
    filled(path, 3)
    whole = path.read_bytes()
    torn = cachefile.put_record(CATEGORY, "torn", [["x"]])[:-4]
    path.write_bytes(whole + torn)
    assert main(["cache", "check", str(path)]) == 1
    assert f"offset {len(whole)}: {len(torn)} bytes" in capsys.readouterr().out
    with pytest.warns(CacheCorruptWarning, match="dropped"):
        FileCache(path).put(CATEGORY, "next", [entry()])
    assert f"dropped {len(torn)} bytes at offset {len(whole)}" in caplog.text
    assert path.read_bytes().startswith(whole)
    assert quietly(path).get(CATEGORY, "next") == [entry()]


def test_a_reader_never_cuts_or_skips_a_record_still_being_written(tmp_path):
    """A tail that is a record in progress stays for later: the reader reads it once whole."""
    path = tmp_path / "c.bin"
    filled(path, 1)
    reader = FileCache(path)
    record = cachefile.put_record(CATEGORY, "slow", [cache_raw(entry())])
    with open(path, "ab") as file:
        file.write(record[:10])
        file.flush()
        assert reader.get(CATEGORY, "slow") is None
        assert not reader.damage
        file.write(record[10:])
    assert reader.get(CATEGORY, "slow") == [entry()]


def cache_raw(item: Entry) -> list:
    from fastrun.cache import entry_to_raw

    return entry_to_raw(item)


# -- D4 and D10: one rule for names and values, at every put and every read -------------------

@pytest.mark.parametrize("make", [FileCache, None], ids=["file", "memory"])
@pytest.mark.parametrize("category, key", [
    ("team|gemm@v2 ", "k"), (" team|gemm@v2", "k"), ("team|gemm@v2\t", "k"),
    ("team|gemm\n@v2", "k"), ("", "k"), (CATEGORY, "k\x1b[2J"), (CATEGORY, " k"),
    (CATEGORY, ""),
])
def test_a_name_no_reader_would_take_is_refused_at_put(tmp_path, make, category, key):
    cache = make(tmp_path / "c.bin") if make else InMemoryCache()
    with pytest.raises(ValueError, match="refusing the put"):
        cache.put(category, key, [entry()])
    assert len(cache) == 0


@pytest.mark.parametrize("category", ["team|gemm;v2@x", "team|gemm@v2;beta", "my namespace",
                                      "cpu;threads=2|conv@1|format=1"])
def test_every_name_a_put_takes_comes_back_from_the_file_and_a_compaction(tmp_path, category):
    path = tmp_path / "c.bin"
    FileCache(path).put(category, "k", [entry()])
    assert quietly(path).get(category, "k") == [entry()]
    assert main(["cache", "compact", str(path)]) == 0
    reread = quietly(path)
    assert reread.get(category, "k") == [entry()] and not reread.skipped


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_the_memory_cache_refuses_what_the_file_cache_refuses(bad):
    cache = InMemoryCache()
    cache.put(CATEGORY, "k", [entry("good", 1e-3)])
    with pytest.raises(ValueError, match="refusing entry"):
        cache.put(CATEGORY, "k", [entry("bad", bad)])
    assert cache.get(CATEGORY, "k") == [entry("good", 1e-3)]


# -- prune --category matches facts exactly --------------------------------------------------

def test_prune_category_matches_named_facts_exactly(tmp_path, capsys):
    path = tmp_path / "c.bin"
    cache = FileCache(path)
    one = "cpu;processor=X;threads=1;blas_threads=1|conv@1"
    two = "cpu;processor=X;threads=2;blas_threads=1|conv@1"
    for category in (one, two):
        cache.put(category, "k", [entry()])
    assert main(["cache", "prune", str(path), "--category", "threads=1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would remove 1 category" in out and "threads=2" not in out
    assert len(quietly(path)) == 2
    assert main(["cache", "prune", str(path), "--category", "threads=1"]) == 0
    assert quietly(path).categories() == [two]


# -- D8: the lock is held for an append, not for a merge or an encode -------------------------

def test_a_put_decodes_nothing_under_the_lock(tmp_path, monkeypatch):
    """With 64 writers of 40-entry records, each put used to decode and merge every record the
    others had appended, under the lock: 7 puts/s, and writers waited the whole timeout."""
    path = tmp_path / "c.bin"
    writer = FileCache(path)
    writer.put(CATEGORY, "mine", [entry()])
    other = FileCache(path)
    for i in range(20):
        other.put(CATEGORY, f"theirs{i}", [entry()])
    decoded_under_lock = []
    decode = cachefile.decode

    def watched(frames, contents):
        decoded_under_lock.append(writer._file_lock.held)
        return decode(frames, contents)

    monkeypatch.setattr(cachefile, "decode", watched)
    writer.put(CATEGORY, "mine2", [entry()])
    assert writer.get(CATEGORY, "theirs19") == [entry()]  # decoded now, at the lookup
    assert decoded_under_lock and not any(decoded_under_lock)


def test_a_compaction_encodes_its_snapshot_before_it_takes_the_lock(tmp_path, monkeypatch):
    from fastrun.cache import store

    monkeypatch.setattr(store, "COMPACT_AFTER_BYTES", 4096)
    path = tmp_path / "c.bin"
    cache = FileCache(path)
    encoded_under_lock = []
    snapshot_file = cachefile.snapshot_file

    def watched(*args, **kwargs):
        encoded_under_lock.append(cache._file_lock.held)
        return snapshot_file(*args, **kwargs)

    monkeypatch.setattr(cachefile, "snapshot_file", watched)
    for i in range(40):
        cache.put(CATEGORY, f"k{i}", [entry(f"a{j}", 1e-3 * (j + 1)) for j in range(5)])
    assert len(encoded_under_lock) >= 2  # the first write, then at least one compaction
    assert not any(encoded_under_lock[1:])
    assert len(quietly(path)) == 40


def test_a_compaction_keeps_the_records_appended_while_it_encoded(tmp_path, monkeypatch):
    """The records another process appends between a compaction's read and its rename are
    copied after the new snapshot, as they are."""
    path = tmp_path / "c.bin"
    compactor = FileCache(path)
    compactor.put(CATEGORY, "before", [entry()])
    snapshot_file = cachefile.snapshot_file

    def meanwhile(*args, **kwargs):
        data = snapshot_file(*args, **kwargs)
        other = FileCache(path)
        other.put(CATEGORY, "meanwhile", [entry()])
        return data

    monkeypatch.setattr(cachefile, "snapshot_file", meanwhile)
    assert compactor.rewrite(None, force=True)
    monkeypatch.setattr(cachefile, "snapshot_file", snapshot_file)
    reread = quietly(path)
    assert reread.get(CATEGORY, "before") == reread.get(CATEGORY, "meanwhile") == [entry()]
    assert compactor.get(CATEGORY, "meanwhile") == [entry()]


def test_a_live_compactors_temporary_file_is_kept_and_a_dead_ones_removed(tmp_path):
    """A compaction writes its temporary file before it takes the lock, so one may be in
    progress while another process compacts: only a dead writer's leftover is removed."""
    from fastrun.base.files import Replacement

    path = tmp_path / "c.bin"
    FileCache(path).put(CATEGORY, "k", [entry()])
    live = Replacement(path, b"in progress")  # this process: alive
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True).stdout.strip()
    host = Path(live.temporary).name.split(".")[3]
    dead = tmp_path / f".c.bin.{host}.{dead_pid}.abc123.tmp"
    dead.write_bytes(b"left over")
    assert main(["cache", "compact", str(path)]) == 0
    assert Path(live.temporary).exists() and not dead.exists()
    live.discard()
    assert not Path(live.temporary).exists()
