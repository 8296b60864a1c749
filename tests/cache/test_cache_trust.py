"""A cache you can trust (issue 14): the append-only format-2 file, paths that hold no cache,
entries with bad values, and files that cannot be written.  Real files, real processes, real
permissions (root's permission bypass is dropped with ``setpriv``), a real full filesystem
(a small tmpfs in a mount namespace of its own) where the machine allows it."""

from __future__ import annotations

import contextlib
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import msgpack
import onnx
import pytest
from onnx import TensorProto, helper

from fastrun import cache as cache_module
from fastrun.attribute import AlgoAttribute
from fastrun.cache import (
    CacheCorruptWarning,
    CacheUnwritableWarning,
    Entry,
    FileCache,
    read_cache_file,
)
from fastrun.cache import file as cachefile
from fastrun.cache import store as cache_store
from fastrun.cli.main import main

CATEGORY = "cpu;processor=Test CPU;isa=x86-64-v3;threads=2|matmul@4"
REPO = Path(__file__).resolve().parents[2]


def entry(algorithm: str = "blas", time_s: float = 1e-3, repeats: int = 10,
          measured_at: float = 1_700_000_000.0) -> Entry:
    return Entry(algorithm, AlgoAttribute.REPRODUCIBLE, time_s, 1e-5, 0, 1e-7, repeats,
                 measured_at, "0.1.0")


def quiet(path: Path) -> FileCache:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return FileCache(path)


def python(code: str, *, drop_root: bool = False, env: dict | None = None,
           wrap: list[str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter; ``drop_root``: without root's permission bypass
    (CAP_DAC_OVERRIDE and friends), so file modes apply as they do to any user."""
    command = [sys.executable, "-c", textwrap.dedent(code)]
    if drop_root and os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: permissions cannot be enforced")
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner",
                   *command]
    return subprocess.run([*(wrap or []), *command], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})})


# -- format 2: an append-only log ----------------------------------------------------------

def test_a_put_appends_one_record_and_never_rewrites_the_file(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    cache = FileCache(path)
    cache.put_many((CATEGORY, f"key{i}", [entry(f"a{i}")]) for i in range(2000))
    inode, size = path.stat().st_ino, path.stat().st_size
    for i in range(20):
        cache.put(CATEGORY, f"new{i}", [entry()])
        now = path.stat()
        assert now.st_ino == inode, "a put replaced the file"
        assert 0 < now.st_size - size < 400, "a put wrote more than its own record"
        size = now.st_size
    data = path.read_bytes()
    contents = cachefile.read(data)
    assert len(contents.snapshot[CATEGORY]) == 2000 and len(contents.puts) == 20
    assert contents.torn == 0 and contents.end == len(data)
    assert len(quiet(path)) == 2020


def test_more_repeats_wins_when_snapshot_and_log_disagree(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    FileCache(path).put(CATEGORY, "k", [entry("blas", 1e-3, repeats=50, measured_at=1.0)])
    FileCache(path).put(CATEGORY, "k", [entry("blas", 5e-4, repeats=5, measured_at=2.0)])
    FileCache(path).put(CATEGORY, "k", [entry("blas", 2e-3, repeats=50, measured_at=3.0)])
    assert quiet(path).get(CATEGORY, "k") == [entry("blas", 2e-3, repeats=50, measured_at=3.0)]
    assert read_cache_file(path)[CATEGORY]["k"] == [entry("blas", 2e-3, 50, 3.0)]


def test_a_torn_last_record_is_dropped_and_cut_off_by_the_next_writer(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    FileCache(path).put_many((CATEGORY, f"k{i}", [entry()]) for i in range(3))
    FileCache(path).put(CATEGORY, "whole", [entry()])
    torn = cachefile.put_record(CATEGORY, "torn", [cache_module.entry_to_raw(entry())])
    with open(path, "ab") as file:  # a writer killed in the middle of its write
        file.write(torn[: len(torn) // 2])
    reader = quiet(path)
    assert reader.get(CATEGORY, "whole") == [entry()] and reader.get(CATEGORY, "torn") is None
    assert len(reader) == 4

    writer = FileCache(path)
    writer.put(CATEGORY, "after", [entry()])
    contents = cachefile.read(path.read_bytes())
    assert contents.torn == 0, "the torn bytes are gone"
    assert [key for _, key, _ in contents.puts] == ["whole", "after"]
    assert reader.get(CATEGORY, "after") == [entry()]  # a reader catches up from its offset


def test_the_log_is_compacted_into_a_new_snapshot(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_store, "COMPACT_AFTER_BYTES", 2000)
    path = tmp_path / "cache.bin"
    cache = FileCache(path)
    cache.put(CATEGORY, "first", [entry()])
    inodes = set()
    for i in range(60):
        cache.put(CATEGORY, f"k{i}", [entry(f"a{i}")])
        inodes.add(path.stat().st_ino)
    assert len(inodes) > 1, "the file was never compacted"
    assert path.stat().st_size < 2 * 2000 + 4000
    everything = quiet(path)
    assert len(everything) == 61
    assert everything.get(CATEGORY, "k59") == [entry("a59")]
    assert not list(tmp_path.glob(".cache.bin.*.tmp"))


def test_format1_files_are_read_and_converted_on_their_first_write(tmp_path: Path) -> None:
    path = tmp_path / "old.bin"
    old_category = "cpu;Test CPU;x86-64-v3;threads=2|matmul@4|format=1"
    document = {"format": "fastrun-cache", "version": 1, "categories": {
        old_category: {"k": [cache_module.entry_to_raw(entry())]}}}
    path.write_bytes(msgpack.packb(document, use_bin_type=True))
    cache = quiet(path)
    assert cache.categories() == [CATEGORY]  # the same facts, named
    assert cache.get(CATEGORY, "k") == [entry()]
    assert path.read_bytes().startswith(b"\x83")  # reading changed nothing

    cache.put(CATEGORY, "new", [entry("gemv")])
    assert path.read_bytes().startswith(cachefile.MAGIC)
    fresh = quiet(path)
    assert fresh.get(CATEGORY, "k") == [entry()] and fresh.get(CATEGORY, "new") == [entry("gemv")]


def test_categories_are_stored_as_maps_of_facts(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    FileCache(path).put(CATEGORY, "k", [entry()])
    FileCache(path).put(CATEGORY, "k2", [entry()])
    data = path.read_bytes()
    _, length, _ = cachefile._RECORD.unpack_from(data, cachefile.HEADER_SIZE)
    start = cachefile.HEADER_SIZE + cachefile.RECORD_HEADER_SIZE
    snapshot = msgpack.unpackb(data[start:start + length])
    [[facts, keys]] = snapshot[2]
    assert facts == {"device": "cpu", "processor": "Test CPU", "isa": "x86-64-v3",
                     "threads": "2", "operator": "matmul", "algorithms": "4"}
    assert list(keys) == ["k"]


# -- paths that hold no usable cache are never renamed or overwritten -----------------------

def _onnx_model_bytes() -> bytes:
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 4])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]) \
        .SerializeToString()


FOREIGN = {
    "onnx model": (lambda tmp: _onnx_model_bytes(), "ONNX"),
    "json": (lambda tmp: b'{"format": "fastrun-cache-json", "version": 1}', "JSON"),
    "text": (lambda tmp: b"hello, this is a note\n", "not a fastrun cache"),
    "msgpack of another tool": (lambda tmp: msgpack.packb({"format": "x"}), "not a fastrun"),
    "newer format": (lambda tmp: cachefile.MAGIC + b"\x09\x00\x00\x00 future", "newer fastrun"),
}


@pytest.mark.parametrize("case", list(FOREIGN))
def test_a_file_that_is_not_a_cache_is_left_untouched(case: str, tmp_path: Path) -> None:
    make, message = FOREIGN[case]
    path = tmp_path / "cache.bin"
    data = make(tmp_path)
    path.write_bytes(data)
    with pytest.warns(CacheUnwritableWarning, match=message) as caught:
        cache = FileCache(path)
    assert str(path) in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning, not one per put
        cache.put(CATEGORY, "k", [entry()])
    assert cache.get(CATEGORY, "k") == [entry()]  # the run goes on in memory
    assert path.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.bin"]


def test_directories_fifos_devices_and_huge_files_are_never_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = tmp_path / "a-directory"
    directory.mkdir()
    fifo = tmp_path / "a-fifo"
    os.mkfifo(fifo)
    device = tmp_path / "zero.bin"
    device.symlink_to("/dev/zero")
    huge = tmp_path / "huge.bin"
    FileCache(huge).put_many((CATEGORY, f"k{i}", [entry()]) for i in range(100))
    monkeypatch.setenv("FASTRUN_CACHE_MAX_BYTES", "1KiB")
    for path, message in [(directory, "directory"), (fifo, "FIFO"), (device, "a device"),
                          (huge, "over the 1024-byte limit")]:
        before = sorted(os.listdir(tmp_path))
        with pytest.warns(CacheUnwritableWarning, match=message):
            cache = FileCache(path)
        cache.put(CATEGORY, "k", [entry()])
        assert cache.get(CATEGORY, "k") == [entry()]
        assert sorted(os.listdir(tmp_path)) == before
    assert huge.stat().st_size > 1024 and device.is_symlink() and fifo.is_fifo()


def test_a_model_given_as_its_own_cache_is_not_moved(tmp_path: Path) -> None:
    model = tmp_path / "model.onnx"
    model.write_bytes(_onnx_model_bytes())
    data = model.read_bytes()
    done = subprocess.run([sys.executable, "-m", "fastrun.cli.load_and_run", str(model),
                           "--algo-policy", str(model), "--iter", "1"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert f"fastrun cache file {model} is not used" in done.stderr and "ONNX" in done.stderr
    assert model.read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def test_a_damaged_cache_is_still_set_aside() -> None:
    # (the cases are in test_cache.py; here only that the two kinds stay apart)
    assert cachefile._classify(cachefile.header()).kind == cachefile.CURRENT
    with pytest.raises(cachefile.CacheFormatError, match="snapshot"):
        cachefile.read(cachefile.header() + b"x")
    assert cachefile._classify(cachefile.MAGIC + b"\x01\x00").kind == cachefile.DAMAGED
    assert cachefile._classify(b"\x83\xa6format\xadfastrun-cache").kind == cachefile.FORMAT1
    assert cachefile._classify(b"PK\x03\x04").kind == cachefile.FOREIGN


# -- every field of every entry is range-checked -------------------------------------------

BAD_ENTRIES = {
    "inf workspace": ["w", [], 1e-3, 0.0, math.inf, None, 10, 1.7e9, "0.1"],
    "inf repeats": ["r", [], 1e-3, 0.0, 0, None, math.inf, 1.7e9, "0.1"],
    "nan time": ["n", [], math.nan, 0.0, 0, None, 10, 1.7e9, "0.1"],
    "negative time": ["t", [], -1.0, 0.0, 0, None, 10, 1.7e9, "0.1"],
    "far future": ["f", [], 1e-3, 0.0, 0, None, 10, 1e300, "0.1"],
    "string time": ["s", [], "fast", 0.0, 0, None, 10, 1.7e9, "0.1"],
    "huge workspace": ["h", [], 1e-3, 0.0, 1 << 62, None, 10, 1.7e9, "0.1"],
    "unknown attribute": ["u", ["NO_SUCH"], 1e-3, 0.0, 0, None, 10, 1.7e9, "0.1"],
    "too few fields": ["x", [], 1e-3],
}


@pytest.fixture
def poisoned(tmp_path: Path) -> Path:
    """A cache whose one key holds a good entry and one entry of each bad kind."""
    path = tmp_path / "poisoned.bin"
    FileCache(path).put(CATEGORY, "k", [entry()])
    with open(path, "ab") as file:
        file.write(cachefile.put_record(CATEGORY, "k", list(BAD_ENTRIES.values())))
        file.write(cachefile.put_record(CATEGORY, "ctrl\x1b[2J\x07key", [
            cache_module.entry_to_raw(entry("evil\x1b[31malgo"))]))
    return path


def test_bad_entries_are_skipped_and_reported_by_key(poisoned: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    cache = FileCache(poisoned)
    assert cache.get(CATEGORY, "k") == [entry()]
    reasons = " ".join(why for _, key, why in cache.skipped if key == "k")
    for fragment in ("workspace_bytes is inf", "repeats is inf", "time_s is nan",
                     "time_s -1.0 is outside", "measured_at 1e+300 is outside", "time_s is str",
                     "workspace_bytes 4611686018427387904 is outside", "NO_SUCH", "9 fields"):
        assert fragment in reasons, fragment
    assert "'k'" in caplog.text
    cache.put(CATEGORY, "other", [entry()])  # still writable
    assert FileCache(poisoned).get(CATEGORY, "k") == [entry()]


@pytest.mark.parametrize("argv", [
    ["cache", "show", "{f}"], ["cache", "show", "{f}", "--json"],
    ["cache", "export", "{f}", "--json"], ["cache", "diff", "{f}", "{f}"],
    ["cache", "merge", "{f}", "-o", "{out}"], ["cache", "prune", "{f}", "--older-than", "1d"],
    ["cache", "compact", "{f}"], ["report", "{f}", "-o", "{html}"],
    ["profile", "matmul", "--inputs", "8x8,8x8", "--algo-policy", "{f}"],
])
def test_no_tool_crashes_on_bad_entries(argv: list[str], poisoned: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    names = {"f": str(poisoned), "out": str(tmp_path / "out.bin"),
             "html": str(tmp_path / "r.html")}
    # show reports what it skipped with status 1; every other tool goes on with status 0
    assert main([arg.format(**names) for arg in argv]) == (argv[:2] == ["cache", "show"])
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    if argv[:2] == ["cache", "show"] and "--json" not in argv:
        # the record under a key with control characters is refused whole, as a put would be
        assert "skipped 9 invalid entries" in out and "\\x1b[2J" in out
        assert "damaged: 1 span" in out and "no usable put" in out


def test_an_invalid_measurement_is_refused_before_it_is_stored(tmp_path: Path) -> None:
    cache = FileCache(tmp_path / "cache.bin")
    for bad in (entry(time_s=math.nan), entry(time_s=-1.0), entry(measured_at=math.inf)):
        with pytest.raises(ValueError, match="refusing entry 'blas'"):
            cache.put(CATEGORY, "k", [bad])
    assert len(cache) == 0 and not (tmp_path / "cache.bin").exists()


def test_export_onto_its_own_cache_is_refused(poisoned: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    data = poisoned.read_bytes()
    assert main(["cache", "export", str(poisoned), "--json", "-o", str(poisoned)]) == 2
    assert "being exported" in capsys.readouterr().err
    assert poisoned.read_bytes() == data


# -- files that cannot be written ----------------------------------------------------------

PROFILE = ["-m", "fastrun.cli.main", "profile", "matmul", "--inputs", "16x16,16x16",
           "--fast-run", "--budget", "0.002"]


def test_a_read_only_directory_keeps_the_search_and_offers_its_results(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    existing = shared / "cache.bin"
    FileCache(existing).put(CATEGORY, "kept", [entry()])
    (shared / "cache.bin.lock").unlink()  # the lock a writer needs cannot be created there
    data = existing.read_bytes()
    writable = tmp_path / "mine"
    writable.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(writable, 0o777)
    os.chmod(shared, 0o555)
    try:
        done = python(f"""
            import subprocess, sys
            sys.exit(subprocess.run([sys.executable, *{PROFILE!r}, "--algo-policy",
                                     {str(existing)!r}, "--save-cache-to",
                                     {str(writable / "saved.bin")!r}]).returncode)
            """, drop_root=True)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        assert f"fastrun cache file {existing} is not used" in done.stderr
        assert "Permission denied" in done.stderr
        assert done.stderr.count("is not used") == 1, done.stderr  # said once, not per try
        assert f"saved to {writable / 'saved.bin'}" in done.stderr
        saved = read_cache_file(writable / "saved.bin")
        assert any("matmul" in category for category in saved)
        assert existing.read_bytes() == data and os.listdir(shared) == ["cache.bin"]

        again = python(f"""
            import subprocess, sys
            sys.exit(subprocess.run([sys.executable, *{PROFILE!r}, "--algo-policy",
                                     {str(existing)!r}]).returncode)
            """, drop_root=True)
        assert again.returncode == 0, again.stderr
        assert "were not saved" in again.stderr and "--save-cache-to" in again.stderr
    finally:
        os.chmod(shared, 0o755)


def test_a_full_disk_keeps_the_search_in_memory(tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    if shutil.which("unshare") is None:
        pytest.skip("no unshare: a small full filesystem cannot be made here")
    code = f"""
        import os, subprocess, sys, warnings
        from fastrun.cache import FileCache, Entry
        from fastrun.attribute import AlgoAttribute
        small = {str(small)!r}
        filler = os.path.join(small, "filler")
        with open(filler, "wb", buffering=0) as stream:
            try:
                while True:
                    stream.write(b"x" * 4096)
            except OSError:
                pass
        cache = FileCache(os.path.join(small, "cache.bin"))
        entry = Entry("blas", AlgoAttribute.NONE, 1e-3, 0.0, 0, None, 10, 1.7e9, "0.1")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cache.put("c|matmul@1", "k" * 8000, [entry])
        print(caught[0].message)
        assert cache.get("c|matmul@1", "k" * 8000) == [entry]
        print("saved", cache.save_unsaved({str(tmp_path / "elsewhere.bin")!r}))
        """
    program = tmp_path / "fill_and_write.py"
    program.write_text(textwrap.dedent(code))
    script = (f"mount -t tmpfs -o size=256k,nr_inodes=100 tmpfs {shlex.quote(str(small))} "
              f"|| exit 77; exec {shlex.quote(sys.executable)} {shlex.quote(str(program))}")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    if done.returncode == 77 or "unshare failed" in done.stderr:
        pytest.skip(f"no tmpfs mount allowed here: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr
    assert "No space left on device" in done.stdout
    assert f"saved {tmp_path / 'elsewhere.bin'}" in done.stdout
    assert read_cache_file(tmp_path / "elsewhere.bin")["c|matmul@1"]["k" * 8000]


@contextlib.contextmanager
def _stopped_holder(path: Path, timeout_s: float):
    """A process that holds the cache's lock, taken with ``filelock`` as an older fastrun
    takes it, then stops itself (as Ctrl-Z would); the lock timeout is ``timeout_s``."""
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal, filelock
        lock = filelock.FileLock({str(path) + ".lock"!r})
        lock.acquire()
        print("held", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        os.environ["FASTRUN_CACHE_LOCK_TIMEOUT"] = str(timeout_s)
        yield holder
    finally:
        os.environ.pop("FASTRUN_CACHE_LOCK_TIMEOUT", None)
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_a_lock_held_by_a_stopped_process_times_out_naming_the_holder(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    FileCache(path).put(CATEGORY, "k", [entry()])
    with _stopped_holder(path, 0.5) as holder:
        cache = FileCache(path)
        started = time.monotonic()
        with pytest.warns(CacheUnwritableWarning) as caught:
            cache.put(CATEGORY, "new", [entry()])
        assert time.monotonic() - started < 10
        message = str(caught[0].message)
        assert f"{path}.lock" in message and f"held by pid {holder.pid}" in message
        assert cache.get(CATEGORY, "new") == [entry()] and cache.unsaved == 1
    assert cache.save_unsaved() == str(path)  # the lock is free again: written where it belongs
    assert quiet(path).get(CATEGORY, "new") == [entry()]


def test_a_stuck_lock_costs_one_timeout_and_one_warning_not_two(tmp_path: Path) -> None:
    """The last try to save a run's measurements into its own file used to wait the whole
    timeout again (125 s for a one-problem profile) and warn again."""
    path = tmp_path / "cache.bin"
    FileCache(path).put(CATEGORY, "k", [entry()])
    with _stopped_holder(path, 4):
        cache = FileCache(path)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cache.put(CATEGORY, "new", [entry()])
            started = time.monotonic()
            assert cache.save_unsaved() is None
            retried_s = time.monotonic() - started
        assert retried_s < 3, retried_s  # RETRY_LOCK_TIMEOUT (1 s), not the 4 s timeout again
        assert sum(issubclass(w.category, CacheUnwritableWarning) for w in caught) == 1
        assert cache.unsaved == 1 and "waited" in cache.unwritable


def test_a_compaction_that_fails_is_said_once_and_retried_when_the_log_doubled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "cache.bin"
    cache = FileCache(path)
    cache.put(CATEGORY, "first", [entry()])
    calls = []

    def full(target, data=b""):
        calls.append(len(data))
        raise OSError(28, "No space left on device", target)

    monkeypatch.setattr(cache_store, "COMPACT_AFTER_BYTES", 2048)
    monkeypatch.setattr(cache_store, "Replacement", full)
    for i in range(60):
        cache.put(CATEGORY, f"k{i}", [entry()])
    assert caplog.text.count("could not compact") == 1
    assert 1 < len(calls) < 10  # tried again as the log doubled, not on every put
    assert cache.unwritable is None and len(quiet(path)) == 61


def test_a_symlinked_cache_is_followed_not_forked(tmp_path: Path) -> None:
    target = tmp_path / "team" / "shared.bin"
    target.parent.mkdir()
    FileCache(target).put(CATEGORY, "theirs", [entry()])
    link = tmp_path / "mine.bin"
    link.symlink_to(target)
    FileCache(link).put(CATEGORY, "mine", [entry()])
    assert main(["cache", "compact", str(link)]) == 0
    assert link.is_symlink() and link.resolve() == target
    assert sorted(k for _, k, _ in quiet(target)) == ["mine", "theirs"]


def test_stale_temporary_files_of_dead_writers_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    FileCache(path).put(CATEGORY, "k", [entry()])
    stale = tmp_path / ".cache.bin.k2j3h4.tmp"
    stale.write_bytes(b"x" * 4_400_000)
    other = tmp_path / ".other.bin.abc.tmp"
    other.write_bytes(b"not ours")
    assert main(["cache", "compact", str(path)]) == 0
    assert not stale.exists() and other.exists()
    assert quiet(path).get(CATEGORY, "k") == [entry()]


def test_corrupt_warning_is_one_line_on_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    path.write_bytes(cachefile.header() + b"torn")
    done = subprocess.run([sys.executable, *PROFILE, "--algo-policy", str(path)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("moved to") == 1 and "warnings.warn" not in done.stderr
    assert list(tmp_path.glob("cache.bin.corrupt-*"))
    assert CacheCorruptWarning  # (the warning class a library user filters on)


def test_onnx_helper_model_is_valid() -> None:
    onnx.checker.check_model(onnx.load_from_string(_onnx_model_bytes()))


def test_an_unreadable_cache_file_is_named_and_the_search_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "cache.bin"
    FileCache(path).put(CATEGORY, "k", [entry()])
    os.chmod(path, 0)
    os.chmod(tmp_path, 0o755)
    try:
        done = python(f"""
            import subprocess, sys
            sys.exit(subprocess.run([sys.executable, *{PROFILE!r}, "--algo-policy",
                                     {str(path)!r}]).returncode)
            """, drop_root=True)
    finally:
        os.chmod(path, 0o644)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert f"fastrun cache file {path} is not used: it cannot be read (Permission denied" \
        in done.stderr
    assert quiet(path).get(CATEGORY, "k") == [entry()]


def test_cache_only_mode_never_moves_a_damaged_cache(tmp_path: Path) -> None:
    path = tmp_path / "bad.bin"
    damaged = cachefile.header() + b"torn"
    path.write_bytes(damaged)
    done = subprocess.run([sys.executable, "-m", "fastrun.cli.load_and_run", "zoo:squeezenet",
                           "--algo-policy", str(path), "--iter", "1"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert path.read_bytes() == damaged and sorted(os.listdir(tmp_path)) == ["bad.bin"]
    lines = [line for line in done.stderr.splitlines() if str(path) in line]
    assert len(lines) == 1 and "damaged fastrun cache" in lines[0] and "untouched" in lines[0]
    assert "measured again" not in done.stderr and "another model" not in done.stderr
    assert "warnings.warn" not in done.stderr
