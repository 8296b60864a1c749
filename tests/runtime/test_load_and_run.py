"""``load_and_run`` as users run it: flags, summaries, warnings, errors, and a search that is
killed half-way and resumed by a second process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest

import fastrun
from fastrun.cache import FileCache
from fastrun.cli.load_and_run import main
from tests.runtime import _models

FAST = ["--budget", "0.005", "--iter", "2", "--no-progress"]


@pytest.fixture
def cnn(tmp_path):
    path = tmp_path / "cnn.onnx"
    onnx.save(_models.small_cnn(), path)
    return str(path)


def summary(tmp_path, *args: str) -> dict:
    out = tmp_path / "summary.json"
    assert main([*args, "--summary-json", str(out)]) == 0
    return json.loads(out.read_text())


def test_search_then_cached_run(tmp_path, cnn, capsys):
    cache = str(tmp_path / "cache.bin")
    first = summary(tmp_path, cnn, "--fast-run", "--algo-policy", cache, *FAST)
    assert first["profiled"] > 0 and first["cache_hits"] == 0
    assert first["iter_ms_median"] > 0 and first["iterations"] == 2
    second = summary(tmp_path, cnn, "--fast-run", "--algo-policy", cache, *FAST)
    # only a pick a loaded machine timed unstably (low-confidence) is measured again
    assert second["profiled"] == second["remeasured"] and second["cache_hits"] > 0
    cache_only = summary(tmp_path, cnn, "--algo-policy", cache, *FAST)
    assert cache_only["profiled"] == 0 and cache_only["heuristic"] == 0
    text = capsys.readouterr().out
    assert "problem(s) profiled" in text and "median" in text


def test_blocked_layout_flag(tmp_path, capsys):
    """--blocked-layout (the default): the search weighs both layouts, and the summary says
    what it chose (which depends on this machine's timings); a cached run makes the same
    choice; --no-blocked-layout keeps every step NCHW."""
    path = tmp_path / "mix.onnx"
    onnx.save(_models.layout_mix(size=12), path)
    cache = str(tmp_path / "cache.bin")
    first = summary(tmp_path, str(path), "--fast-run", "--algo-policy", cache,
                    "--blocked-layout", "--check", *FAST)
    assert first["check"] == "ok" and first["blocked_steps"] >= 0
    again = summary(tmp_path, str(path), "--algo-policy", cache, "--blocked-layout", *FAST)
    assert again["profiled"] == 0
    assert (again["blocked_steps"], again["layout_conversions"]) == \
        (first["blocked_steps"], first["layout_conversions"])
    default = summary(tmp_path, str(path), "--algo-policy", cache, *FAST)
    assert default["blocked_steps"] == first["blocked_steps"]
    off = summary(tmp_path, str(path), "--algo-policy", cache, "--no-blocked-layout", *FAST)
    assert (off["blocked_steps"], off["layout_conversions"]) == (0, 0)


def test_cache_made_for_another_model_is_reported(tmp_path, cnn, capsys):
    cache = str(tmp_path / "cache.bin")
    other = tmp_path / "other.onnx"
    onnx.save(_models.conv_bn_relu(channels=16, size=20), other)
    summary(tmp_path, str(other), "--fast-run", "--algo-policy", cache, *FAST)
    capsys.readouterr()
    result = summary(tmp_path, cnn, "--algo-policy", cache, *FAST)
    assert result["profiled"] == 0 and result["heuristic"] > 0
    assert "were not in" in capsys.readouterr().err


def test_missing_cache_file_in_cache_only_mode_warns(tmp_path, cnn, capsys):
    result = summary(tmp_path, cnn, "--algo-policy", str(tmp_path / "none.bin"), *FAST)
    assert result["profiled"] == 0
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "none.bin").exists()


def test_verbose_check_dump_and_input_file(tmp_path, cnn, capsys):
    x = np.random.default_rng(1).uniform(-1, 1, (2, 3, 12, 12)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    dump = tmp_path / "out.npz"
    result = summary(tmp_path, cnn, "--input", f"x={tmp_path / 'x.npy'}", "--verbose",
                     "--check", "--dump-output", str(dump), *FAST)
    assert result["inputs"] == {"x": [2, 3, 12, 12]} and result["check"] == "ok"
    text = capsys.readouterr().out
    assert "conv0" in text and "Conv+Relu" in text and "heuristic" in text
    assert "profiled: the search's time for the step alone" in text  # the columns explained
    assert "ok (tolerance" in text
    assert np.load(dump)["y"].shape == (2, 5)


def test_batch_flag_sets_the_symbolic_batch(tmp_path, cnn):
    assert summary(tmp_path, cnn, "--batch", "4", *FAST)["inputs"] == {"x": [4, 3, 12, 12]}


def test_fast_run_and_full_run_exclude_each_other(cnn, capsys):
    with pytest.raises(SystemExit) as caught:
        main([cnn, "--fast-run", "--full-run"])
    assert caught.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


def test_zero_iterations_are_refused(cnn, capsys):
    assert main([cnn, "--iter", "0"]) == 2
    assert "--iter" in capsys.readouterr().err


def test_unsupported_model_fails_with_op_and_node(tmp_path, capsys):
    w = _models.GraphWriter()
    w.node("Hardmax", ["x"], "y", name="strange_node")
    path = tmp_path / "unsupported.onnx"
    onnx.save(w.model((1, 4), "y", output_rank=2), path)
    assert main([str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Hardmax (node 'strange_node')" in err


def test_missing_and_corrupt_model_files(tmp_path, capsys):
    assert main([str(tmp_path / "nope.onnx")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00garbage")
    assert main([str(bad)]) == 2
    assert "bad.onnx" in capsys.readouterr().err


def _run_cli(*args: str, **kwargs) -> subprocess.Popen:
    """load_and_run as a user starts it from a terminal: SIGINT at its default disposition
    even when this test run inherited it ignored (started in the background of a shell)."""
    env = {**os.environ, "FASTRUN_PROGRESS": "0"}
    return subprocess.Popen([sys.executable, "-m", "fastrun.cli.load_and_run", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            **kwargs)


def test_a_killed_search_resumes_with_only_the_missing_problems(tmp_path):
    """Kill a searching process once some results are in the file; a second run profiles
    exactly the problems that were not written, and nothing is lost or corrupt."""
    model = tmp_path / "cnn.onnx"
    onnx.save(_models.small_cnn(widths=(4, 8, 12, 16, 20, 24), size=16), model)
    args = [str(model), "--fast-run", "--budget", "0.05", "--iter", "1"]

    full = tmp_path / "full.json"
    complete = _run_cli(*args, "--algo-policy", str(tmp_path / "complete.bin"),
                        "--summary-json", str(full))
    assert complete.wait(timeout=600) == 0, complete.stderr.read().decode()
    total = json.loads(full.read_text())["profiled"]

    cache = tmp_path / "cache.bin"
    searching = _run_cli(*args, "--algo-policy", str(cache))
    deadline = time.monotonic() + 300
    written = 0
    while time.monotonic() < deadline and searching.poll() is None:
        if cache.exists():
            written = len(FileCache(cache))
            if written >= 2:
                searching.send_signal(signal.SIGKILL)
                break
        time.sleep(0.01)
    searching.wait(timeout=60)
    assert searching.returncode == -signal.SIGKILL, "the search finished before it was killed"
    written = len(FileCache(cache))
    assert 0 < written < total

    resumed_summary = tmp_path / "resumed.json"
    resumed = _run_cli(*args, "--algo-policy", str(cache), "--summary-json",
                       str(resumed_summary))
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read().decode()
    result = json.loads(resumed_summary.read_text())
    assert result["profiled"] == total - written
    assert 0 < result["cache_hits"] <= written
    assert len(FileCache(cache)) == total


def test_ctrl_c_during_a_search_exits_cleanly_with_the_measurements_saved(tmp_path):
    """SIGINT (what Ctrl-C sends) while candidates are timed: one line, exit status 130, no
    traceback, and every problem measured so far is in the cache for the next run."""
    model = tmp_path / "cnn.onnx"
    onnx.save(_models.small_cnn(widths=(4, 8, 12, 16, 20, 24), size=16), model)
    cache = tmp_path / "cache.bin"
    searching = _run_cli(str(model), "--fast-run", "--budget", "0.05", "--iter", "1",
                         "--algo-policy", str(cache))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and searching.poll() is None:
        if cache.exists() and len(FileCache(cache)) >= 2:
            searching.send_signal(signal.SIGINT)
            break
        time.sleep(0.01)
    _, stderr = searching.communicate(timeout=120)
    text = stderr.decode()
    assert searching.returncode == 130, text
    assert "interrupted: " in text and f"problem(s) measured, saved to {cache}; run again to " \
        "resume" in text
    assert text.count("\n") == 1, "one line"
    assert "Traceback" not in text
    assert len(FileCache(cache)) >= 2


def test_perf_tool_figures_shapes_duration_and_profile(tmp_path, cnn, capsys):
    """What onnxruntime_perf_test and trtexec give: percentiles, throughput, a timed
    duration, chosen input shapes, and a per-step profile with both times."""
    profile = tmp_path / "profile.json"
    started = time.monotonic()
    result = summary(tmp_path, cnn, "--fast-run", "--budget", "0.005", "--no-progress",
                     "--duration", "0.5", "--shapes", "x:2x3x12x12",
                     "--profile-json", str(profile))
    assert time.monotonic() - started < 120
    out = capsys.readouterr().out
    assert "p90" in out and "p99" in out and "inferences/s" in out and "samples/s" in out
    assert result["inputs"] == {"x": [2, 3, 12, 12]}
    assert result["iterations"] == len(result["iter_ms"]) >= 2
    assert result["iter_ms_p50"] <= result["iter_ms_p90"] <= result["iter_ms_p99"]
    assert result["samples_per_second"] == pytest.approx(2 * result["inferences_per_second"])
    assert sum(result["iter_ms"]) >= 400  # about --duration of timed inferences
    assert result["fastrun_version"] and result["measured_at"].endswith("Z")
    gain = result["gain_over_heuristic"]  # the search's picks against the rules', both timed
    assert gain["steps"] >= 1 and gain["speedup"] >= 0.999
    assert gain["speedup"] == pytest.approx(gain["heuristic_ms"] / gain["chosen_ms"])
    steps = json.loads(profile.read_text())["steps"]
    convs = [s for s in steps if s["operator"] == "conv"]
    assert convs and all(s["profiled_ms"] > 0 and s["in_run_ms"] > 0 for s in convs)
    assert all(s["source"] in ("profiled", "only", "-", "cache", "heuristic") for s in steps)

    assert main([cnn, "--shapes", "x:2x3x99x12"]) == 2
    assert "the model fixes" in capsys.readouterr().err
    assert main([cnn, "--duration", "-1"]) == 2


def test_progress_on_a_narrow_terminal_fits_and_never_overshoots(tmp_path):
    """load_and_run on a real pseudo-terminal 80 columns wide: every redraw of the bar fits
    the line (no wrapped debris), a warning is never glued to the bar, the problem count
    never passes its total, and the bar is gone at the end."""
    import fcntl
    import pty
    import re
    import struct
    import termios

    model = tmp_path / "cnn.onnx"
    onnx.save(_models.small_cnn(widths=(4, 8, 12, 16), size=12), model)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "FASTRUN_PROGRESS"}
    process = subprocess.Popen(
        [sys.executable, "-m", "fastrun.cli.load_and_run", str(model), "--fast-run",
         "--budget", "0.01", "--iter", "1"], stdin=follower, stdout=subprocess.DEVNULL,
        stderr=follower, env=env, cwd=os.path.dirname(os.path.dirname(_models.__file__)))
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert process.wait(timeout=300) == 0
    os.close(leader)
    text = b"".join(chunks).decode("utf-8", "replace")
    plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    redraws = [part for line in plain.split("\n") for part in line.split("\r")]
    assert any("problem" in part or "/" in part for part in redraws), text[:500]
    # A log record (a busy machine's timing warning) starts a line of its own and may wrap
    # like any log line; every redraw of the bar fits.
    records = [part for part in redraws if "fastrun" in part and ": " in part]
    assert all(re.match(r"(WARNING|ERROR|INFO) fastrun", part) for part in records), records
    assert max(len(part.rstrip()) for part in redraws if part not in records) <= 80
    counts = [tuple(map(int, m.groups())) for part in redraws
              if (m := re.match(r"\s*(\d+)/(\d+) +\d+%", part))]
    assert counts and all(done <= total for done, total in counts)
    assert re.search(r"\d\d:\d\d<(\d\d:\d\d|\?)", plain)  # elapsed<remaining


def test_ctrl_c_during_the_timing_reports_what_was_timed(tmp_path, cnn):
    """SIGINT in the middle of a --duration loop: the figures of the iterations timed before
    it are printed, then one line on stderr and exit status 130.  The signal is sent by the
    process itself on its fourth model run (a warm-up and two timed ones before it), so the
    test does not depend on how long loading takes."""
    code = (
        "import os, signal, sys\n"
        "import fastrun.runtime.model as m\n"
        "from fastrun.cli.load_and_run import main\n"
        "runs = [0]\n"
        "original = m.Model.run\n"
        "def run(self, feeds=None):\n"
        "    runs[0] += 1\n"
        "    if runs[0] == 4:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return original(self, feeds)\n"
        "m.Model.run = run\n"
        f"sys.exit(main([{cnn!r}, '--duration', '600', '--no-progress']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr
    run_line = next(line for line in done.stdout.splitlines() if line.startswith("run "))
    assert "iteration(s) (interrupted): median" in run_line
    assert done.stderr.strip().count("\n") == 0
    assert "interrupted during the timing" in done.stderr


def test_perf_tool_parity_threads_mean_sorted_table_and_peer(tmp_path, cnn):
    """--threads N as --device cpu:N, mean and standard deviation, the per-layer table sorted
    by time with a share column within 100 columns (--wide: uncut), and --time-peer."""
    out = tmp_path / "summary.json"
    done = subprocess.run(
        [sys.executable, "-m", "fastrun.cli.load_and_run", cnn, "--threads", "1", "--iter", "3",
         "--sort", "time", "--check", "--time-peer", "--no-progress", "--summary-json",
         str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert "threads=1" in result["device"]
    assert result["iter_ms_mean"] > 0 and result["iter_ms_std"] >= 0
    assert "mean" in done.stdout and "std" in done.stdout
    lines = done.stdout.splitlines()
    assert lines[0].split()[:2] == ["node", "op"] and lines[0].rstrip().endswith("share")
    table = lines[1:lines.index("")]
    assert all(len(line) <= 100 for line in lines[:lines.index("")])
    rows = [line for line in table if line.rstrip().endswith("%")]
    assert len(rows) >= 3

    def in_run_us(line: str) -> float:
        value, unit = line.split()[-3:-1]
        return float(value) * {"µs": 1, "ms": 1e3, "s": 1e6}[unit]

    times = [in_run_us(line) for line in rows]
    assert times == sorted(times, reverse=True)
    peer = next(line for line in lines if line.startswith("peer "))
    assert "onnxruntime" in peer and "1 thread(s)" in peer and "fastrun/onnxruntime" in peer
    assert result["ratio_vs_peer"] == pytest.approx(
        result["iter_ms_median"] / result["peer_ms_median"])
    wide = subprocess.run([sys.executable, "-m", "fastrun.cli.load_and_run", cnn, "--iter", "1",
                           "--wide", "--no-progress"], capture_output=True, text=True,
                          timeout=300)
    assert wide.returncode == 0 and "inputs -> output" in wide.stdout.splitlines()[0]


@pytest.mark.parametrize("flag", [[], ["--no-progress"]], ids=["log", "no-progress"])
def test_a_search_into_a_log_file_says_how_far_it_is(tmp_path, cnn, flag):
    """stderr not a terminal (a log file): lines with the count and an ETA while the search
    runs (every line here: the interval is set to 0 so that the small model shows them), and
    none with --no-progress."""
    log_file = tmp_path / "search.log"
    code = ("import sys\n"
            "import fastrun.core.progress\n"
            "fastrun.core.progress.LINE_INTERVAL_S = 0.0\n"
            "from fastrun.cli.load_and_run import main\n"
            f"sys.exit(main([{cnn!r}, '--fast-run', '--budget', '0.005', '--iter', '1', "
            f"*{flag!r}]))\n")
    env = {key: value for key, value in os.environ.items() if key != "FASTRUN_PROGRESS"}
    with open(log_file, "w") as stderr:
        done = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=stderr, text=True, timeout=300, env=env)
    assert done.returncode == 0
    lines = log_file.read_text().splitlines()
    if flag:  # no progress line (a warning, such as a busy machine's unstable timing, may be)
        assert not [line for line in lines if not line.startswith("WARNING")]
    else:
        assert any("problem(s) decided" in line and "left; now" in line for line in lines)
        assert lines[-1].split(": ")[1].startswith("done in")


def test_no_save_reads_the_cache_and_never_writes_it(tmp_path, cnn, capsys):
    """--no-save: the cache file is read (its problems are hits) and left byte for byte as it
    was, with no lock file beside it; a file that is no cache is refused by name, and
    --save-cache-to excludes it."""
    cache = tmp_path / "c.bin"
    assert main([cnn, "--fast-run", "--algo-policy", str(cache), *FAST]) == 0
    before = cache.read_bytes()
    if os.path.exists(f"{cache}.lock"):  # the search's own lock file
        os.remove(f"{cache}.lock")
    result = summary(tmp_path, cnn, "--fast-run", "--algo-policy", str(cache), "--no-save",
                     "--batch", "2", *FAST)
    assert result["profiled"] > 0 and cache.read_bytes() == before  # batch 2: new problems
    again = summary(tmp_path, cnn, "--fast-run", "--algo-policy", str(cache), "--no-save",
                    *FAST)
    assert again["profiled"] == again["remeasured"] and again["cache_hits"] > 0
    assert not os.path.exists(f"{cache}.lock") and cache.read_bytes() == before
    missing = tmp_path / "none.bin"
    assert main([cnn, "--fast-run", "--algo-policy", str(missing), "--no-save", *FAST]) == 0
    assert not missing.exists() and not os.path.exists(f"{missing}.lock")
    foreign = tmp_path / "notes.txt"
    foreign.write_text("not a cache\n")
    capsys.readouterr()
    assert main([cnn, "--fast-run", "--algo-policy", str(foreign), "--no-save", *FAST]) == 2
    assert str(foreign) in capsys.readouterr().err
    assert foreign.read_text() == "not a cache\n" and not os.path.exists(f"{foreign}.lock")
    with pytest.raises(SystemExit):
        main([cnn, "--algo-policy", str(cache), "--no-save", "--save-cache-to", "x.bin"])


def test_the_gain_line_accounts_for_every_measured_step(tmp_path, cnn, capsys):
    """After a search and from its cache, the gain compares the steps whose heuristic pick
    was measured; the others are counted and the line says why they are left out (a cache
    keeps each problem's Pareto front), so the two runs' counts add up the same."""
    cache = str(tmp_path / "c.bin")
    searched = summary(tmp_path, cnn, "--fast-run", "--algo-policy", cache, *FAST)
    capsys.readouterr()
    cached = summary(tmp_path, cnn, "--algo-policy", cache, *FAST)
    out = capsys.readouterr().out
    first, again = searched["gain_over_heuristic"], cached["gain_over_heuristic"]
    assert first["steps"] + first["unmatched"] == again["steps"] + again["unmatched"]
    line = next(text for text in out.splitlines() if text.startswith("gain "))
    assert ("left out" in line) == (again["unmatched"] > 0)


def _float16_model() -> onnx.ModelProto:
    """x (float16) -> Conv (float16 weights) -> Relu -> + a float16 Constant -> y (float16),
    and y cast to float32 -> z."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((6, 3, 3, 3)).astype(np.float16), "w")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(
            np.array(0.5, dtype=np.float16))),
        helper.make_node("Add", ["r", "k"], ["y"]),
        helper.make_node("Cast", ["y"], ["z"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes, "half", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 6, 8, 8]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 6, 8, 8])], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_float16_model_runs_in_float32_and_says_so(tmp_path, capsys):
    """A model written in float16 (inputs, weights, a constant, an output) is computed in
    float32: the float16 output comes back as float16, the float32 one as float32, both
    within float16's precision of onnxruntime's float16 run, and load_and_run says so."""
    import onnxruntime

    from fastrun.runtime import load

    path = tmp_path / "half.onnx"
    onnx.save(_float16_model(), path)
    model = load(str(path), fastrun.session(device="cpu:1", progress=False))
    feeds = model.random_inputs(seed=2)
    assert feeds["x"].dtype == np.float16
    outputs = model.run(feeds)
    assert outputs["y"].dtype == np.float16 and outputs["z"].dtype == np.float32
    expected = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]) \
        .run(None, feeds)
    for got, reference in zip((outputs["y"], outputs["z"]), expected, strict=True):
        scale = float(np.abs(reference.astype(np.float32)).max())
        assert np.abs(got.astype(np.float32) - reference.astype(np.float32)).max() \
            <= 1e-2 * scale
    result = summary(tmp_path, str(path), "--check", "--iter", "1", "--no-progress")
    out = capsys.readouterr().out
    assert result["computed_in_float32"] and result["check"] == "ok"
    assert "inputs x float16[1, 3, 8, 8]" in out and "computed in float32" in out
