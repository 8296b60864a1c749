"""Tests of fastrun.cache: pruning and merging, the file format, and safe sharing of one file."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastrun import cache as cache_module
from fastrun.attribute import AlgoAttribute
from fastrun.cache import (
    CACHE_FORMAT_VERSION,
    CacheCorruptWarning,
    Entry,
    FileCache,
    InMemoryCache,
    PersistentCache,
    default_cache,
    merge_entries,
    prune,
    set_default_cache,
)
from fastrun.cache import file as cachefile

A = AlgoAttribute
HELPER = Path(__file__).with_name("_cache_writer.py")

# The helper is run as a script by the subprocesses; load it by path so that the tests can use
# the same make_entries without depending on how pytest sets up sys.path.
_spec = importlib.util.spec_from_file_location("_cache_writer", HELPER)
assert _spec is not None and _spec.loader is not None
writer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(writer)


def entry(
    algorithm: str = "algo",
    time_s: float = 1.0,
    workspace: int = 0,
    attributes: AlgoAttribute = A.NONE,
    repeats: int = 10,
    measured_at: float = 1000.0,
    error: float | None = None,
) -> Entry:
    return Entry(
        algorithm=algorithm,
        attributes=attributes,
        time_s=time_s,
        spread_s=0.01,
        workspace_bytes=workspace,
        error=error,
        repeats=repeats,
        measured_at=measured_at,
        version="0.1.0",
    )


def run_helper(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(HELPER), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def corrupt_files(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ".corrupt-*"))


def load_without_warnings(path: Path) -> FileCache:
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheCorruptWarning)
        return FileCache(path)


# ---------------------------------------------------------------------------------------------
# prune


def dominates(a: Entry, b: Entry) -> bool:
    return (
        a.attributes == b.attributes
        and a.time_s <= b.time_s
        and (a.workspace_bytes <= b.workspace_bytes)
    )


entry_strategy = st.builds(
    entry,
    algorithm=st.sampled_from(list("abcdefgh")),
    time_s=st.sampled_from([1.0, 2.0, 3.0, 4.0]),
    workspace=st.sampled_from([0, 10, 20, 30]),
    attributes=st.sampled_from([A.NONE, A.REPRODUCIBLE, A.REPRODUCIBLE | A.NAIVE]),
)


@given(st.lists(entry_strategy, max_size=25))
def test_prune_invariants(entries: list[Entry]) -> None:
    kept = prune(entries)

    assert [e.time_s for e in kept] == sorted(e.time_s for e in kept)
    assert all(any(k is e for e in entries) for k in kept), "prune returns input entries"
    for i, a in enumerate(kept):
        for j, b in enumerate(kept):
            assert i == j or not dominates(b, a), f"{a} is kept but dominated by {b}"
    for dropped in (e for e in entries if not any(k is e for k in kept)):
        assert any(dominates(k, dropped) for k in kept), f"{dropped} dropped without reason"
    for attributes in {e.attributes for e in entries}:
        fastest = min(e.time_s for e in entries if e.attributes == attributes)
        assert fastest == min(k.time_s for k in kept if k.attributes == attributes)
    assert prune(kept) == kept


def test_prune_keeps_slower_reproducible_and_orders_ties() -> None:
    fast = entry("fast", time_s=1.0, workspace=0)
    reproducible = entry("repro", time_s=5.0, workspace=100, attributes=A.REPRODUCIBLE)
    slower_bigger = entry("slow", time_s=2.0, workspace=10)
    slower_smaller = entry("lean", time_s=2.0, workspace=0, attributes=A.REPRODUCIBLE)
    twin_b = entry("b", time_s=3.0, workspace=0, attributes=A.NAIVE)
    twin_a = entry("a", time_s=3.0, workspace=0, attributes=A.NAIVE)

    result = prune([reproducible, slower_bigger, twin_b, fast, slower_smaller, twin_a])

    # "slow" is dominated by "fast"; "repro" by "lean"; of the twins the first by name is kept.
    assert [e.algorithm for e in result] == ["fast", "lean", "a"]


def test_prune_keeps_tradeoff_between_time_and_workspace() -> None:
    fast_big = entry("fast_big", time_s=1.0, workspace=1000)
    slow_small = entry("slow_small", time_s=2.0, workspace=10)
    assert prune([slow_small, fast_big]) == [fast_big, slow_small]


# ---------------------------------------------------------------------------------------------
# merge


def test_merge_more_repeats_wins_even_if_older_and_slower() -> None:
    old = entry("x", time_s=2.0, repeats=50, measured_at=100.0)
    new = entry("x", time_s=1.0, repeats=10, measured_at=200.0)
    assert merge_entries([old], [new]) == [old]
    assert merge_entries([new], [old]) == [old]


def test_merge_equal_repeats_newer_wins_then_new_wins() -> None:
    older = entry("x", time_s=1.0, measured_at=100.0)
    newer = entry("x", time_s=2.0, measured_at=200.0)
    assert merge_entries([newer], [older]) == [newer]
    assert merge_entries([older], [newer]) == [newer]

    first = entry("x", time_s=1.0)
    second = entry("x", time_s=3.0)
    assert merge_entries([first], [second]) == [second]


def test_merge_is_a_union_by_algorithm_then_pruned() -> None:
    only_old = entry("old", time_s=2.0, workspace=0)
    only_new = entry("new", time_s=1.0, workspace=100)
    dominated = entry("dominated", time_s=3.0, workspace=100)
    other_attributes = entry("repro", time_s=4.0, workspace=500, attributes=A.REPRODUCIBLE)

    result = merge_entries([only_old, dominated], [only_new, other_attributes])

    assert result == [only_new, only_old, other_attributes]


# ---------------------------------------------------------------------------------------------
# Behaviour common to every implementation


@pytest.fixture(params=["memory", "file"])
def any_cache(request: pytest.FixtureRequest, tmp_path: Path) -> PersistentCache:
    if request.param == "memory":
        return InMemoryCache()
    return FileCache(tmp_path / "cache.msgpack")


def test_protocol_get_put_iterate(any_cache: PersistentCache) -> None:
    assert isinstance(any_cache, PersistentCache)
    assert any_cache.get("cpu", "k") is None
    assert len(any_cache) == 0

    any_cache.put("cpu", "k", [entry("slow", time_s=2.0, workspace=0)])
    any_cache.put("cpu", "k", iter([entry("fast", time_s=1.0, workspace=10)]))
    any_cache.put("gpu", "k", [entry("gpu", time_s=9.0)])
    any_cache.put_many([("cpu", "k2", [entry("a")]), ("gpu", "k2", [entry("b")])])

    assert [e.algorithm for e in any_cache.get("cpu", "k") or []] == ["fast", "slow"]
    assert [e.algorithm for e in any_cache.get("gpu", "k") or []] == ["gpu"]
    assert len(any_cache) == 4
    assert sorted(any_cache.categories()) == ["cpu", "gpu"]
    listed = {(c, k): [e.algorithm for e in es] for c, k, es in any_cache}
    assert listed == {
        ("cpu", "k"): ["fast", "slow"],
        ("gpu", "k"): ["gpu"],
        ("cpu", "k2"): ["a"],
        ("gpu", "k2"): ["b"],
    }


def test_put_applies_merge_rule(any_cache: PersistentCache) -> None:
    any_cache.put("cpu", "k", [entry("x", time_s=2.0, repeats=50)])
    any_cache.put("cpu", "k", [entry("x", time_s=1.0, repeats=5), entry("y", time_s=0.5)])
    assert [(e.algorithm, e.time_s) for e in any_cache.get("cpu", "k") or []] == [
        ("y", 0.5)  # x (2.0 s, 50 repeats) kept over x (1.0 s), then pruned by the faster y
    ]


def test_threads_putting_concurrently(any_cache: PersistentCache) -> None:
    def work(thread: int) -> None:
        for j in range(10):
            any_cache.put("cpu", f"t{thread}-{j}", [entry(f"a{thread}")])
            n = thread * 10 + j  # time up, workspace down: no entry prunes another
            any_cache.put("cpu", "shared", [entry(f"s{n}", time_s=n, workspace=1000 - n)])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(any_cache) == 41
    assert len(any_cache.get("cpu", "shared") or []) == 40


# ---------------------------------------------------------------------------------------------
# FileCache: format and persistence


def test_file_round_trip_preserves_every_field(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "dir" / "cache.msgpack"
    entries = [
        Entry(
            "blocked(kb=256,mb=64,nb=64)",
            A.REPRODUCIBLE | A.USABLE_DEPEND_ON_SHAPE,
            0.0012345678901234,
            1.5e-5,
            1 << 40,
            None,
            37,
            1712345678.123456,
            "0.1.0",
        ),
        Entry(
            "naive",
            A.REPRODUCIBLE | A.NAIVE | A.ACCURACY_DEPEND_ON_BATCH,
            3.25,
            0.0,
            0,
            1.25e-7,
            3,
            1712345679.5,
            "0.2.0.dev1",
        ),
        Entry("winograd(f=2x3)", A.NONE, 0.0005, 2e-6, 4096, 0.0, 100, 1.0, "0.1.0"),
    ]
    cache = FileCache(path)
    assert not path.parent.exists(), "construction must not create anything"
    cache.put("cpu:x86|conv|v1|f1", "N1C3H8W8,float32;K=3", entries)

    reread = load_without_warnings(path)
    assert reread.get("cpu:x86|conv|v1|f1", "N1C3H8W8,float32;K=3") == prune(entries)
    assert len(prune(entries)) == 3

    data = path.read_bytes()
    assert data.startswith(cachefile.MAGIC) and CACHE_FORMAT_VERSION == 3
    raw = cachefile.read(data).snapshot["cpu:x86|conv|v1|f1"]["N1C3H8W8,float32;K=3"]
    assert raw[0] == ["winograd(f=2x3)", [], 0.0005, 2e-6, 4096, 0.0, 100, 1.0, "0.1.0"]
    assert raw[1][1] == ["REPRODUCIBLE", "USABLE_DEPEND_ON_SHAPE"]
    assert raw[1][5] is None


def test_put_keeps_other_categories_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cache.msgpack"
    FileCache(path).put("cat-a", "k", [entry("a")])
    FileCache(path).put("cat-b", "k", [entry("b")])  # a fresh instance that never saw cat-a

    reread = FileCache(path)
    assert sorted(reread.categories()) == ["cat-a", "cat-b"]
    assert reread.get("cat-a", "k") == [entry("a")]
    assert reread.get("cat-b", "k") == [entry("b")]


def test_put_merges_with_what_another_instance_wrote(tmp_path: Path) -> None:
    path = tmp_path / "cache.msgpack"
    first, second = FileCache(path), FileCache(path)
    first.put("cpu", "k", [entry("x", time_s=1.0, workspace=100)])
    second.put("cpu", "k", [entry("y", time_s=2.0, workspace=0)])

    expected = [entry("x", time_s=1.0, workspace=100), entry("y", time_s=2.0, workspace=0)]
    assert FileCache(path).get("cpu", "k") == expected
    assert second.get("cpu", "k") == expected  # the writer's memory was refreshed from disk


def test_empty_file_is_an_empty_cache_without_warning(tmp_path: Path) -> None:
    path = tmp_path / "cache.msgpack"
    path.touch()
    cache = load_without_warnings(path)
    assert len(cache) == 0
    cache.put("cpu", "k", [entry()])
    assert load_without_warnings(path).get("cpu", "k") == [entry()]
    assert corrupt_files(path) == []


def test_ten_thousand_keys_load(tmp_path: Path) -> None:
    path = tmp_path / "cache.msgpack"
    FileCache(path).put_many(
        (f"cat{i % 3}", f"key{i}", writer.make_entries(f"key{i}", 5)) for i in range(10_000)
    )
    cache = load_without_warnings(path)
    assert len(cache) == 10_000
    assert sorted(cache.categories()) == ["cat0", "cat1", "cat2"]
    for i in (0, 1, 4_999, 9_999):
        assert cache.get(f"cat{i % 3}", f"key{i}") == writer.make_entries(f"key{i}", 5)
    assert cache.get("cat0", "key1") is None


def test_get_miss_sees_another_process_write(tmp_path: Path) -> None:
    path = tmp_path / "cache.msgpack"
    cache = FileCache(path)
    cache.put("cpu", "mine", [entry()])
    assert cache.get("cpu", "theirs") is None

    process = run_helper("one", str(path), "cpu", "theirs")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr

    assert cache.get("cpu", "theirs") == writer.make_entries("theirs", 3)
    assert cache.get("cpu", "mine") == [entry()]
    assert len(cache) == 2


def test_reload_sees_changes_and_deletion(tmp_path: Path) -> None:
    path = tmp_path / "cache.msgpack"
    cache = FileCache(path)
    FileCache(path).put("cpu", "k", [entry()])
    assert len(cache) == 0  # no reload without a miss or an explicit call
    cache.reload()
    assert len(cache) == 1
    path.unlink()
    assert cache.get("cpu", "other") is None
    assert len(cache) == 0


# ---------------------------------------------------------------------------------------------
# FileCache: several processes


def test_concurrent_processes_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "cache.msgpack"
    go_file = tmp_path / "go"
    writers, puts = 4, 25
    processes = [
        run_helper("distinct", str(path), str(w), str(puts), str(go_file)) for w in range(writers)
    ]
    go_file.touch()
    for process in processes:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr

    cache = load_without_warnings(path)
    assert len(cache) == writers * puts + 1
    for w in range(writers):
        for j in range(puts):
            key = f"w{w}-k{j}"
            category = writer.DISTINCT_CATEGORIES[j % 2]
            assert cache.get(category, key) == writer.make_entries(key, 3)
    shared = cache.get(*writer.SHARED)
    assert shared == [writer.shared_entry(n) for n in range(writers * puts)]


def test_killed_writer_leaves_a_readable_file(tmp_path: Path) -> None:
    path = tmp_path / "cache.msgpack"
    seeded = {f"seed-{i}": writer.make_entries(f"seed-{i}", 200, pad=40) for i in range(20)}
    FileCache(path).put_many(("seed", key, entries) for key, entries in seeded.items())

    process = run_helper("loop", str(path))
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready", process.stderr
        time.sleep(0.7)
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL

    cache = load_without_warnings(path)
    for key, entries in seeded.items():
        assert cache.get("seed", key) == entries
    loop_keys = [key for category, key, _ in cache if category == "loop"]
    assert "loop-0" in loop_keys
    for category, key, entries in cache:
        if category == "loop":
            assert entries == writer.make_entries(key, 200, pad=40)

    # The dead writer's lock is gone: this process can write again.
    cache.put("after", "k", [entry()])
    assert load_without_warnings(path).get("after", "k") == [entry()]


# ---------------------------------------------------------------------------------------------
# FileCache: corrupt and foreign files


def _valid_file_bytes(tmp_path: Path) -> bytes:
    source = tmp_path / "source.msgpack"
    FileCache(source).put_many(("cpu", f"k{i}", writer.make_entries(f"k{i}", 4)) for i in range(20))
    return source.read_bytes()


def _document(**changes: object) -> bytes:
    """A format-1 file (one msgpack document), as fastrun 0.1 wrote them."""
    document = {"format": "fastrun-cache", "version": 1, "categories": {}}
    document.update(changes)
    return msgpack.packb(document, use_bin_type=True)


def _flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0xFF]) + data[offset + 1:]


#: Clearly fastrun caches that cannot be read: moved aside, as the evidence.
DAMAGED_CASES = {
    "snapshot cut short": (lambda tmp: _valid_file_bytes(tmp)[:-700], "cut short"),
    "snapshot checksum": (lambda tmp: _flip(_valid_file_bytes(tmp), 40), "checksum"),
    "header only": (lambda tmp: cachefile.header(), "cut short"),
    "header cut short": (lambda tmp: cachefile.MAGIC + b"\x02", "header"),
    "format 1 cut short": (lambda tmp: _document(categories={"cpu": {"k": []}})[:-3],
                           "msgpack"),
    "format 1 without categories": (lambda tmp: _document(categories=5), "not a map"),
}


@pytest.mark.parametrize("case", list(DAMAGED_CASES))
def test_damaged_cache_is_moved_aside(
    case: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_bytes, message = DAMAGED_CASES[case]
    data = make_bytes(tmp_path)
    path = tmp_path / "cache.msgpack"
    path.write_bytes(data)

    with pytest.warns(CacheCorruptWarning, match=message):
        cache = FileCache(path)

    [moved] = corrupt_files(path)
    assert moved.read_bytes() == data
    assert not path.exists()
    assert len(cache) == 0
    assert str(moved) in caplog.text, "the log says where the file went"

    cache.put("cpu", "k", [entry()])
    assert load_without_warnings(path).get("cpu", "k") == [entry()]
    assert corrupt_files(path) == [moved]


def test_damaged_file_appearing_before_put_is_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "cache.msgpack"
    cache = FileCache(path)
    cache.put("cpu", "old", [entry()])
    damaged = cachefile.header() + b"\x05\x00\x00\x00 torn"
    path.write_bytes(damaged)

    with pytest.warns(CacheCorruptWarning, match="moved to"):
        cache.put("cpu", "new", [entry("new")])

    [moved] = corrupt_files(path)
    assert moved.read_bytes() == damaged
    fresh = load_without_warnings(path)
    assert fresh.get("cpu", "new") == [entry("new")]
    assert fresh.get("cpu", "old") is None
    assert cache.get("cpu", "old") is None  # memory follows the file


def test_second_damaged_file_does_not_replace_the_first(tmp_path: Path) -> None:
    path = tmp_path / "cache.msgpack"
    damaged = [cachefile.header() + tail for tail in (b"first", b"second")]
    for data in damaged:
        path.write_bytes(data)
        with pytest.warns(CacheCorruptWarning):
            FileCache(path)
    assert sorted(p.read_bytes() for p in corrupt_files(path)) == sorted(damaged)


def test_damaged_file_that_cannot_be_moved_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cache.msgpack"
    damaged = cachefile.header() + b"garbage"
    path.write_bytes(damaged)

    def refuse(source: str, target: str) -> None:
        raise PermissionError(13, "Permission denied", source)

    monkeypatch.setattr(os, "rename", refuse)
    with pytest.warns(CacheCorruptWarning, match="could not be moved aside"):
        cache = FileCache(path)
    assert len(cache) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.get("cpu", "k") is None  # no new warning on every miss
        cache.put("cpu", "k", [entry()])  # kept in memory, without a second warning
    assert cache.get("cpu", "k") == [entry()]
    assert cache.unsaved == 1
    assert path.read_bytes() == damaged


def test_unreadable_entry_is_skipped_on_get(tmp_path: Path) -> None:
    path = tmp_path / "cache.msgpack"
    good = cache_module.entry_to_raw(entry("good"))
    bad = ["bad", ["NO_SUCH_ATTRIBUTE"], 1.0, 0.0, 0, None, 1, 0.0, "0.1.0"]
    path.write_bytes(_document(categories={"cpu": {"k": [good, bad]}}))
    assert load_without_warnings(path).get("cpu", "k") == [entry("good")]


# ---------------------------------------------------------------------------------------------
# default cache


@pytest.fixture
def fresh_default() -> Iterator[None]:
    set_default_cache(None)
    yield
    set_default_cache(None)


@pytest.mark.usefixtures("fresh_default")
def test_default_cache_honours_fastrun_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "default.msgpack"
    monkeypatch.setenv("FASTRUN_CACHE", str(path))
    cache = default_cache()
    assert isinstance(cache, FileCache)
    assert cache.path == str(path)
    assert default_cache() is cache

    monkeypatch.delenv("FASTRUN_CACHE")
    assert default_cache() is cache  # the singleton stays until it is reset
    set_default_cache(None)
    assert isinstance(default_cache(), InMemoryCache)

    replacement = InMemoryCache()
    set_default_cache(replacement)
    assert default_cache() is replacement


def test_repr_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "cache.msgpack"
    assert str(path) in repr(FileCache(path))
    assert os.fspath(path) == FileCache(path).path
