"""``fastrun cache show/merge/diff/prune/export`` on caches produced by real searches."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest

import fastrun
from fastrun.attribute import AlgoAttribute
from fastrun.cache import CacheFormatError, Categories, FileCache, read_cache_file
from fastrun.cache import file as cachefile
from fastrun.cache import tools as cachetools
from fastrun.cli.main import main

BUDGET = 0.003


def ones(*shape: int) -> np.ndarray:
    return np.ones(shape, np.float32)


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real cache: a matmul and a small conv searched with fast-run (sub-problems too)."""
    path = tmp_path_factory.mktemp("searched") / "cache.bin"
    with fastrun.session(strategy="fast-run", cache=str(path), budget_s=BUDGET):
        fastrun.call("matmul", ones(16, 16), ones(16, 8))
        fastrun.call("conv", ones(1, 4, 8, 8), ones(4, 4, 3, 3))
    return path


@pytest.fixture
def cache_file(searched: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "cache.bin"
    shutil.copy(searched, copy)
    return copy


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["cache", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str, expect: int = 0) -> dict:
    code, out, err = cli(capsys, *argv, "--json")
    assert code == expect, err
    return json.loads(out)


def write(path: Path, data: Categories) -> None:
    FileCache(path).rewrite(lambda _: data)


def key_set(data: Categories) -> set[tuple[str, str]]:
    return {(category, key) for category, keys in data.items() for key in keys}


def matmul_key(data: Categories, key: str = "float32[16x16],float32[16x8]") -> tuple[str, str]:
    category = next(c for c in data if cachetools.operator_of(c) == "matmul" and key in data[c])
    return category, key


# --------------------------------------------------------------------------------------------
# show


def test_show_ranks_every_key_and_names_the_lookup_choice(cache_file: Path, capsys) -> None:
    data = read_cache_file(cache_file)
    category, key = matmul_key(data)
    # Every shipped algorithm is REPRODUCIBLE: add a faster non-reproducible measurement so that
    # the two lookups differ.
    fast = dataclasses.replace(data[category][key][0], algorithm="racy",
                               attributes=AlgoAttribute.NONE, time_s=1e-9)
    FileCache(cache_file).put(category, key, [fast])

    report = cli_json(capsys, "show", str(cache_file))
    stored = read_cache_file(cache_file)
    assert report["summary"]["keys"] == len(key_set(stored))
    assert {c["operator"] for c in report["categories"]} == {"matmul", "conv"}
    for cat in report["categories"]:
        assert cat["category"].startswith(cat["device"] + "|")
        assert cat["category"].endswith(f"|{cat['operator']}@{cat['operator_version']}")
        for item in cat["keys"]:
            times = [e["time_s"] for e in item["entries"]]
            assert times == sorted(times) and item["lookup"] == item["entries"][0]["algorithm"]
            for entry in item["entries"]:
                assert entry["version"] == fastrun.__version__
                assert entry["measured"].endswith("Z") and entry["repeats"] >= 1
    item = next(i for c in report["categories"] if c["category"] == category
                for i in c["keys"] if i["key"] == key)
    assert item["lookup"] == "racy" and item["lookup_reproducible"] == "blas"

    code, out, _ = cli(capsys, "show", str(cache_file), "--operator", "matmul")
    assert code == 0
    assert f"  {key}\n    lookup -> racy; reproducible -> blas" in out
    assert "|conv@" not in out and "matmul@" in out
    assert time.strftime("%Y-%m-%d", time.gmtime()) in out


def test_show_marks_a_pick_timed_unstably_as_low_confidence(cache_file: Path, capsys) -> None:
    data = read_cache_file(cache_file)
    category, key = matmul_key(data)
    best = min(data[category][key], key=lambda e: e.time_s)
    shaky = dataclasses.replace(best, algorithm="shaky", time_s=best.time_s / 2,
                                spread_s=1e-3)  # a millisecond of spread on a microsecond
    FileCache(cache_file).put(category, key, [shaky])
    report = cli_json(capsys, "show", str(cache_file), "--operator", "matmul")
    marked = {i["key"] for c in report["categories"] for i in c["keys"] if i["low_confidence"]}
    assert marked == {key}
    code, out, _ = cli(capsys, "show", str(cache_file), "--operator", "matmul")
    assert code == 0 and f"  {key}\n    lookup -> shaky  [low confidence: unstable timing" in out


def test_show_filters_by_category_substring_and_operator(cache_file: Path, capsys) -> None:
    only_conv = cli_json(capsys, "show", str(cache_file), "--category", "|conv@")
    assert [c["operator"] for c in only_conv["categories"]] == ["conv"]
    both = cli_json(capsys, "show", str(cache_file), "--category", "|conv@", "--category",
                    "|matmul@")
    assert len(both["categories"]) == 2
    assert cli_json(capsys, "show", str(cache_file), "--operator", "relu")["categories"] == []


# --------------------------------------------------------------------------------------------
# merge

WRITER = """
import sys
import numpy as np
import fastrun
path, n, budget = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
a, b = np.ones((n, n), np.float32), np.ones((n, n // 2), np.float32)
with fastrun.session(strategy="fast-run", cache=path, budget_s=budget):
    fastrun.call("matmul", a, b)
"""


def test_merge_outputs_of_two_concurrent_writer_processes(tmp_path: Path, capsys) -> None:
    # Two processes search different problems at the same time; strassen's sub-problems of the
    # larger one include the smaller one, so the files share keys measured independently.
    files = [tmp_path / "a.bin", tmp_path / "b.bin"]
    processes = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(n), str(BUDGET)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for path, n in zip(files, (16, 32), strict=True)
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
    a, b = (read_cache_file(path) for path in files)
    assert key_set(a) != key_set(b)

    # the output is one of the inputs
    report = cli_json(capsys, "merge", str(files[0]), str(files[1]), "-o", str(files[0]))
    merged = read_cache_file(files[0])
    assert key_set(merged) == key_set(a) | key_set(b)
    assert report["written"] and report["result"]["keys"] == len(key_set(merged))
    assert [s["keys"] for s in report["sources"]] == [len(key_set(a)), len(key_set(b))]
    assert report["sources"][1]["keys_only_here"] == len(key_set(b) - key_set(a))
    assert report["shared_keys"] == len(key_set(a) & key_set(b))
    kept = sum(s["entries_kept"] for s in report["sources"])
    assert kept == report["result"]["entries"]

    conflicts = 0
    for category, key in key_set(merged):
        for entry in merged[category][key]:
            versions = [data[category][key] for data in (a, b) if key in data.get(category, {})]
            measured = [e for entries in versions for e in entries
                        if e.algorithm == entry.algorithm]
            assert entry in measured
            # the merge rule: the steady one (a busy machine marks some unstable), then
            # more repeats, then the newer
            best = max((not e.unstable, e.repeats, e.measured_at) for e in measured)
            assert (not entry.unstable, entry.repeats, entry.measured_at) == best
        if all(key in data.get(category, {}) for data in (a, b)):
            conflicts += sum(
                1 for ea in a[category][key] for eb in b[category][key]
                if ea.algorithm == eb.algorithm and ea != eb)
    assert report["conflicts"] == conflicts
    assert report["shared_keys"] > 0 and conflicts > 0

    # merging B in again changes nothing: B's measurements are there or lost to better ones
    again = cli_json(capsys, "merge", str(files[1]), "-o", str(files[0]))
    assert not again["written"] and read_cache_file(files[0]) == merged
    b_entries = [(e, merged[c][k]) for c, k in key_set(b) for e in b[c][k]]
    assert again["identical_duplicates"] == sum(1 for e, m in b_entries if e in m)
    assert again["conflicts"] == sum(1 for e, m in b_entries if e not in m
                                     and e.algorithm in {x.algorithm for x in m})


def test_merge_rule_more_repeats_then_newer_then_later_input(cache_file: Path, tmp_path: Path,
                                                            capsys) -> None:
    data = read_cache_file(cache_file)
    category, key = matmul_key(data)
    # every entry steady, whatever the machine's load was when the fixture searched: the
    # steady-first rule is another test's, and an unstable entry here would decide by it
    data[category][key] = [dataclasses.replace(e, spread_s=e.time_s * 0.01)
                           for e in data[category][key]]
    first = tmp_path / "a.bin"
    write(first, data)
    base = {e.algorithm: e for e in data[category][key]}
    blas, strassen = base["blas"], base["strassen"]
    # B: blas re-measured with more repeats but older and slower; strassen newer, same repeats
    b_blas = dataclasses.replace(blas, repeats=blas.repeats + 5, time_s=blas.time_s * 2,
                                 measured_at=blas.measured_at - 1000)
    b_strassen = dataclasses.replace(strassen, time_s=strassen.time_s / 2,
                                     measured_at=strassen.measured_at + 10)
    write(tmp_path / "b.bin", {category: {key: [b_blas, b_strassen], "new-key": [blas]}})
    # C: strassen with identical repeats and time stamp as B but another time: the later wins
    c_strassen = dataclasses.replace(b_strassen, time_s=strassen.time_s / 3)
    write(tmp_path / "c.bin", {category: {key: [c_strassen]}})

    out = tmp_path / "out.bin"
    code, text, _ = cli(capsys, "merge", str(first), str(tmp_path / "b.bin"),
                        str(tmp_path / "c.bin"), "-o", str(out))
    assert code == 0
    assert "the steady one wins" in text and "more repeats, then the newer one" in text
    assert "conflicts resolved: 2 (steady 0, more repeats 1, newer 0, later input 1)" in text
    merged = {e.algorithm: e for e in read_cache_file(out)[category][key]}
    assert merged["blas"] == b_blas and merged["strassen"] == c_strassen
    assert read_cache_file(out)[category]["new-key"] == [blas]


def test_merge_rule_a_steady_measurement_beats_an_unstable_one(cache_file: Path,
                                                               tmp_path: Path, capsys) -> None:
    """A measurement timed on a busy machine (spread too wide to rank by) loses to a steady
    one of the same algorithm, though it has more repeats and is newer."""
    data = read_cache_file(cache_file)
    category, key = matmul_key(data)
    blas = {e.algorithm: e for e in data[category][key]}["blas"]
    shaky = dataclasses.replace(blas, repeats=blas.repeats + 5, measured_at=blas.measured_at + 10,
                                time_s=blas.time_s / 2, spread_s=blas.time_s * 3 + 0.01)
    assert shaky.unstable and not blas.unstable
    write(tmp_path / "b.bin", {category: {key: [shaky]}})
    report = cli_json(capsys, "merge", str(cache_file), str(tmp_path / "b.bin"),
                      "-o", str(tmp_path / "out.bin"))
    assert report["resolved_by"]["steady"] == 1
    merged = {e.algorithm: e for e in read_cache_file(tmp_path / "out.bin")[category][key]}
    assert merged["blas"] == blas


def test_merge_into_an_existing_output_keeps_its_contents(cache_file: Path, tmp_path: Path,
                                                         capsys) -> None:
    data = read_cache_file(cache_file)
    category, key = matmul_key(data)
    out = tmp_path / "out.bin"
    write(out, {"other-device|matmul@1|format=1": {"k": data[category][key]}})
    report = cli_json(capsys, "merge", str(cache_file), "-o", str(out))
    assert report["sources"][0]["path"].endswith("(existing contents)")
    assert key_set(read_cache_file(out)) == key_set(read_cache_file(cache_file)) | {
        ("other-device|matmul@1|format=1", "k")}
    # merging again changes nothing and does not rewrite the file
    before = os.stat(out).st_ino
    again = cli_json(capsys, "merge", str(cache_file), "-o", str(out))
    assert not again["written"] and again["conflicts"] == 0 and os.stat(out).st_ino == before


# --------------------------------------------------------------------------------------------
# diff


def test_diff_same_device_flags_time_changes_and_winner_changes(cache_file: Path,
                                                                tmp_path: Path, capsys) -> None:
    a = read_cache_file(cache_file)
    category, key = matmul_key(a)
    b = {c: dict(keys) for c, keys in a.items()}
    blas = next(e for e in b[category][key] if e.algorithm == "blas")
    # strassen becomes the winner in B; blas twice as slow; one key removed, one added
    b[category][key] = [dataclasses.replace(e, time_s=e.time_s * (2 if e is blas else 1e-3))
                        for e in b[category][key]]
    gone = next(k for k in b[category] if k != key)
    del b[category][gone]
    b[category]["float32[1x1],float32[1x1]"] = [blas]
    write(tmp_path / "b.bin", b)

    report = cli_json(capsys, "diff", str(cache_file), str(tmp_path / "b.bin"), expect=1)
    assert not report["cross_device"] and "absolute times" in report["note"]
    assert report["keys_only_in_a"] == [{"category": category, "key": gone}]
    assert report["keys_only_in_b"] == [{"category": category,
                                         "key": "float32[1x1],float32[1x1]"}]
    assert report["categories_only_in_a"] == report["categories_only_in_b"] == []
    item = next(i for i in report["common"] if i["key"] == key)
    assert item["winner_a"] == "blas" and item["winner_b"] == "strassen"
    assert item["winner_changed"]
    ratios = {alg["algorithm"]: alg for alg in item["algorithms"]}
    assert ratios["blas"]["ratio"] == pytest.approx(2) and ratios["blas"]["flagged"]
    assert ratios["strassen"]["ratio"] == pytest.approx(1e-3) and ratios["strassen"]["flagged"]
    assert report["summary"]["winner_changes"] == 1 and report["summary"]["flagged"] == 2
    unchanged = [i for i in report["common"] if i["key"] != key]
    assert unchanged and not any(alg["flagged"] for i in unchanged for alg in i["algorithms"])

    code, text, _ = cli(capsys, "diff", str(cache_file), str(tmp_path / "b.bin"),
                        "--threshold", "3")
    assert code == 1, "a winner changed: exit status 1, as diff(1) for files that differ"
    assert "winner: blas -> strassen (CHANGED)" in text and "flagged ratios: 1" in text
    lines = text.splitlines()
    only_a = lines.index("keys only in A (1):")
    assert lines[only_a + 1] == f"  [{category}]" and lines[only_a + 2] == f"    {gone}"
    assert sum(category in line for line in lines) <= 6, "the category is not on every line"


def test_diff_across_device_categories_compares_relative_times(cache_file: Path,
                                                               tmp_path: Path, capsys) -> None:
    a = read_cache_file(cache_file)
    category, key = matmul_key(a)
    # the same measurements on a machine three times slower, strassen relatively worse there
    b: Categories = {}
    for cat, keys in a.items():
        moved = "cpu;processor=Other CPU;isa=x86-64-v2;threads=1" + cat[cat.index("|"):]
        b[moved] = {k: [dataclasses.replace(e, time_s=e.time_s * 3 * (
            2 if (cat, k, e.algorithm) == (category, key, "strassen") else 1)) for e in entries]
            for k, entries in keys.items()}
    write(tmp_path / "b.bin", b)

    report = cli_json(capsys, "diff", str(cache_file), str(tmp_path / "b.bin"))
    assert report["cross_device"] and "not absolute times" in report["note"]
    assert report["devices_b"] == ["cpu;processor=Other CPU;isa=x86-64-v2;threads=1"]
    assert report["keys_only_in_a"] == report["keys_only_in_b"] == []
    assert report["summary"]["common_keys"] == len(key_set(a))
    flagged = [(i["key"], alg["algorithm"]) for i in report["common"] for alg in i["algorithms"]
               if alg["flagged"]]
    assert flagged == [(key, "strassen")]
    item = next(i for i in report["common"] if i["key"] == key and "matmul@" in i["category_b"])
    assert item["reference"] == "blas"
    strassen = next(alg for alg in item["algorithms"] if alg["algorithm"] == "strassen")
    assert strassen["time_ratio"] == pytest.approx(6) and strassen["ratio"] == pytest.approx(2)

    code, text, _ = cli(capsys, "diff", str(cache_file), str(tmp_path / "b.bin"))
    assert code == 0 and "different device categories" in text
    assert "times relative to blas within each file" in text


def test_diff_of_a_real_search_with_another_thread_count(cache_file: Path, tmp_path: Path,
                                                         capsys) -> None:
    other = tmp_path / "one-thread.bin"
    with fastrun.session(device="cpu:1", strategy="fast-run", cache=str(other), budget_s=BUDGET):
        fastrun.call("matmul", ones(16, 16), ones(16, 8))
    report = cli_json(capsys, "diff", str(cache_file), str(other))
    same = report["devices_a"] == report["devices_b"]
    assert report["cross_device"] is not same
    assert {i["key"] for i in report["common"]} == set(read_cache_file(other)[
        next(iter(read_cache_file(other)))])
    assert ["conv@" in c["category"] for c in report["categories_only_in_a"]] == [True]


# --------------------------------------------------------------------------------------------
# prune


def test_prune_by_category_and_operator(cache_file: Path, capsys) -> None:
    original = read_cache_file(cache_file)
    report = cli_json(capsys, "prune", str(cache_file), "--operator", "conv", "--dry-run")
    assert report["dry_run"] and report["removed"]["categories"] == 1
    assert read_cache_file(cache_file) == original

    code, text, _ = cli(capsys, "prune", str(cache_file), "--category", "|conv@")
    assert code == 0 and text.startswith("removed 1 category, 1 key")
    left = read_cache_file(cache_file)
    assert {cachetools.operator_of(c) for c in left} == {"matmul"}
    assert left == {c: keys for c, keys in original.items() if "|conv@" not in c}


def test_prune_by_age_and_version_removes_emptied_keys(cache_file: Path, capsys) -> None:
    data = read_cache_file(cache_file)
    category, key = matmul_key(data)
    day = 86400
    # every entry of `key` is 40 days old; one other key keeps a 40-day-old entry and a new one
    other = next(k for k, entries in data[category].items() if k != key and len(entries) > 1)
    data[category][key] = [dataclasses.replace(e, measured_at=e.measured_at - 40 * day)
                           for e in data[category][key]]
    first, *rest = data[category][other]
    data[category][other] = [dataclasses.replace(first, measured_at=first.measured_at - 40 * day,
                                                 version="0.0.9"), *rest]
    write(cache_file, data)

    report = cli_json(capsys, "prune", str(cache_file), "--older-than", "30d")
    assert report["removed"] == {"categories": 0, "keys": 1, "entries": len(data[category][key])
                                 + 1}
    assert report["removed_keys"] == [{"category": category, "key": key,
                                       "entries": len(data[category][key])}]
    left = read_cache_file(cache_file)
    assert key not in left[category] and left[category][other] == rest

    write(cache_file, data)
    report = cli_json(capsys, "prune", str(cache_file), "--version-below", "0.1.0")
    assert report["removed"]["entries"] == 1 and report["removed"]["keys"] == 0
    assert read_cache_file(cache_file)[category][other] == rest
    # an age that nothing is older than removes nothing and leaves the file alone
    before = os.stat(cache_file).st_ino
    code, text, _ = cli(capsys, "prune", str(cache_file), "--older-than", "90m",
                        "--category", "|conv@")
    assert code == 0 and text.startswith("nothing to remove")
    assert os.stat(cache_file).st_ino == before


def test_prune_needs_a_criterion(cache_file: Path, capsys) -> None:
    code, _, err = cli(capsys, "prune", str(cache_file))
    assert code == 2 and "nothing to prune" in err


# --------------------------------------------------------------------------------------------
# export


def test_export_json_round_trip(cache_file: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "cache.json"
    code, _, err = cli(capsys, "export", str(cache_file), "--json", "-o", str(out))
    assert code == 0 and str(out) in err
    document = json.loads(out.read_text())
    assert document["format"] == "fastrun-cache-json" and document["version"] == 1
    assert cachetools.import_json(document) == read_cache_file(cache_file)
    entry = next(iter(next(iter(document["categories"].values())).values()))[0]
    assert set(entry) == {"algorithm", "attributes", "time_s", "spread_s", "workspace_bytes",
                          "error", "repeats", "measured_at", "version"}

    code, stdout, _ = cli(capsys, "export", str(cache_file), "--json")
    assert code == 0 and json.loads(stdout) == document
    with pytest.raises(SystemExit) as exit_info:
        main(["cache", "export", str(cache_file)])
    assert exit_info.value.code == 2


# --------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("argv", [
    ["show", "{bad}"],
    ["show", "{bad}", "--json"],
    ["diff", "{bad}", "{good}"],
    ["diff", "{good}", "{bad}"],
    ["export", "{bad}", "--json"],
    ["merge", "{good}", "{bad}", "-o", "{out}"],
    ["merge", "{good}", "-o", "{bad}"],
    ["prune", "{bad}", "--older-than", "1d"],
    ["prune", "{bad}", "--older-than", "1d", "--dry-run"],
])
@pytest.mark.parametrize("content", [b"\xc1 not msgpack",
                                     msgpack.packb({"format": "something-else", "version": 1}),
                                     cachefile.header() + b"damaged",
                                     cachefile.MAGIC + b"\x07\x00\x00\x00 a newer format"],
                         ids=["not-msgpack", "foreign", "damaged", "newer"])
def test_corrupt_or_foreign_file_is_reported_and_left_alone(argv, content, cache_file: Path,
                                                            tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.bin"
    bad.write_bytes(content)
    names = {"bad": str(bad), "good": str(cache_file), "out": str(tmp_path / "out.bin")}
    code, out, err = cli(capsys, *(arg.format(**names) for arg in argv))
    assert code == 2 and out == ""
    assert err.startswith(f"fastrun: error: cache file {bad} ") and "left unchanged" in err
    assert bad.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir() if "corrupt" in p.name) == []
    assert not (tmp_path / "out.bin").exists()


@pytest.mark.parametrize("argv, message", [
    (["show", "{missing}"], "cache file {missing} does not exist"),
    (["diff", "{good}", "{missing}"], "cache file {missing} does not exist"),
    (["merge", "{missing}", "-o", "{good}"], "cache file {missing} does not exist"),
    (["prune", "{missing}", "--operator", "conv"], "cache file {missing} does not exist"),
    (["export", "{dir}", "--json"], "cache file {dir} is a directory"),
    (["prune", "{good}", "--version-below", "latest"], "cannot read version 'latest'"),
])
def test_errors_name_the_file_and_exit_2(argv, message, cache_file: Path, tmp_path: Path,
                                         capsys) -> None:
    names = {"missing": str(tmp_path / "missing.bin"), "good": str(cache_file),
             "dir": str(tmp_path)}
    code, _, err = cli(capsys, *(arg.format(**names) for arg in argv))
    assert code == 2 and message.format(**names) in err
    assert not (tmp_path / "missing.bin").exists()


@pytest.mark.parametrize("argv", [
    ["prune", "x.bin", "--older-than", "soon"],
    ["diff", "a.bin", "b.bin", "--threshold", "-1"],
    ["merge", "a.bin"],
])
def test_bad_arguments_exit_2(argv) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["cache", *argv])
    assert exit_info.value.code == 2


def test_parse_duration_and_version() -> None:
    assert cachetools.parse_duration("30d") == 30 * 86400
    assert cachetools.parse_duration("12h") == 12 * 3600
    assert cachetools.parse_duration("90m") == 5400
    assert cachetools.parse_version("0.2.0rc1") == cachetools.parse_version("0.2") == (0, 2)
    assert cachetools.parse_version("0.1.9") < cachetools.parse_version("0.2.0")


# --------------------------------------------------------------------------------------------
# FileCache.rewrite


def test_rewrite_writes_only_changes_and_refuses_a_corrupt_file(cache_file: Path,
                                                                tmp_path: Path) -> None:
    cache = FileCache(cache_file)
    before = os.stat(cache_file).st_ino
    assert cache.rewrite(lambda current: None) is False
    assert os.stat(cache_file).st_ino == before
    assert cache.rewrite(lambda current: {}) is True
    assert read_cache_file(cache_file) == {} and len(cache) == 0

    # the file goes bad after it was loaded: a rewrite must neither use nor move it
    cache_file.write_bytes(b"\xc1")
    with pytest.raises(CacheFormatError, match=str(cache_file)):
        cache.rewrite(lambda current: {})
    assert cache_file.read_bytes() == b"\xc1"
    assert [p.name for p in tmp_path.iterdir() if "corrupt" in p.name] == []
