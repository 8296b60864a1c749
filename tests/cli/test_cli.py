"""The fastrun command, as a user runs it."""

import json
import subprocess
import sys

import pytest

from fastrun.cli.main import main


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_profile_then_second_run_reads_the_cache_and_times_nothing(tmp_path, capsys):
    cache = str(tmp_path / "cache.bin")
    args = ["profile", "matmul", "--inputs", "48x64,64x32", "--fast-run", "--budget", "0.01",
            "--algo-policy", cache]
    first = run_json(capsys, *args)
    assert first["source"] == "profiled"
    assert first["problem"]["key"] == "float32[48x64],float32[64x32]"
    assert first["category"].startswith("cpu;") and "|matmul@" in first["category"]
    names = [e["algorithm"] for e in first["entries"]]
    assert "naive" not in names and "blas" in names and first["chosen"] in names
    assert first["excluded"]["naive"].startswith("NAIVE excluded")
    for entry in first["entries"]:
        assert set(entry) >= {"algorithm", "time_s", "spread_s", "workspace_bytes", "attributes",
                              "error"}
        assert entry["time_s"] > 0 and entry["error"] < 1e-3

    second = run_json(capsys, *args)
    assert second["source"] == "cache"
    assert second["search_seconds"] == 0.0
    assert second["chosen"] == first["chosen"]
    # nothing was re-measured: the stored timings are the first run's
    assert {e["algorithm"]: e["measured_at"] for e in second["entries"]} == {
        e["algorithm"]: e["measured_at"] for e in first["entries"]
        if e["algorithm"] in {s["algorithm"] for s in second["entries"]}}


def test_cache_alone_falls_back_to_heuristic_without_timing(tmp_path, capsys):
    report = run_json(capsys, "profile", "matmul", "--inputs", "8x8,8x8",
                      "--algo-policy", str(tmp_path / "empty.bin"))
    assert report["source"] == "heuristic" and report["entries"] == []
    assert not (tmp_path / "empty.bin").exists()


def test_reproducible_and_workspace_limit(capsys):
    report = run_json(capsys, "profile", "matmul", "--inputs", "64x64,64x64", "--full-run",
                      "--reproducible", "--workspace-limit", "1KiB", "--budget", "0.005")
    assert report["workspace_limit"] == 1024
    for name, reason in report["excluded"].items():
        if reason == "runs on opencl devices" or reason.startswith("not usable"):
            continue  # gemv: the product has more than one row
        assert name.startswith(("blocked", "strassen")) and "over the limit" in reason
    assert "gemv" in report["excluded"]
    assert report["policy"]["workspace_bytes"] <= 1024


def test_text_output_marks_the_choice_and_shows_the_policy(capsys):
    assert main(["profile", "matmul", "--inputs", "32x32,32x32", "--fast-run",
                 "--budget", "0.005"]) == 0
    out = capsys.readouterr().out
    assert "source    profiled" in out
    assert "(* chosen)" in out and "\n  *1 " in out
    assert "execution policy:" in out and "matmul(float32[32x32],float32[32x32]) ->" in out


@pytest.mark.parametrize("argv, message", [
    (["--inputs", "3x4,5x6"], "inner dimensions"),
    (["--inputs", "3x4,4x5", "--dtype", "int8"], "matmul supports dtypes"),
])
def test_bad_problem_is_a_clear_error(argv, message, capsys):
    assert main(["profile", "matmul", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--inputs", "3x4,4x5", "--workspace-limit", "lots"], "cannot read size 'lots'"),
    (["--inputs", "3xfour"], "bad shape '3xfour'"),
])
def test_bad_argument_is_a_clear_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(["profile", "matmul", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_unknown_operator(capsys):
    assert main(["profile", "conv2d", "--inputs", "1x2"]) == 2
    assert "unknown operator 'conv2d'" in capsys.readouterr().err


def test_fast_run_and_full_run_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        main(["profile", "matmul", "--inputs", "2x2,2x2", "--fast-run", "--full-run"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_console_script_runs(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "fastrun.cli.main", "algorithms", "matmul"],
        capture_output=True, text=True, check=True)
    assert "blas" in result.stdout and "naive" in result.stdout
    assert "NAIVE|REPRODUCIBLE" not in result.stdout  # flags print in declaration order
    assert "REPRODUCIBLE|NAIVE" in result.stdout


def test_profile_conv_with_bias_epilogue_and_weight_preprocessing(capsys):
    report = run_json(capsys, "profile", "conv", "--inputs", "1x16x12x12,16x16x3x3",
                      "--attrs", "strides=1,1", "pads=1,1,1,1", "group=1", "--bias",
                      "--epilogue", "relu", "--weight-preprocess", "--fast-run",
                      "--budget", "0.005")
    assert report["problem"]["shapes"][2] == [16]
    assert report["problem"]["key"] == (
        "float32[1x16x12x12],float32[16x16x3x3],float32[16];activation=relu,dilations=(1,1),"
        "group=1,pads=(1,1,1,1),strides=(1,1),weight_preprocess=true")
    names = {e["algorithm"].split("(")[0] for e in report["entries"]}
    assert {"winograd_f2x3", "im2col", "direct"} <= names and "naive" not in names
    assert report["excluded"]["conv1x1"].startswith("not usable: conv1x1 needs a 1x1 kernel")


def test_other_device_candidates_collapse_and_algorithms_filter_by_device(capsys):
    assert main(["profile", "matmul", "--inputs", "8x8,8x8"]) == 0
    text = capsys.readouterr().out
    assert "runs on opencl devices" not in text
    assert "opencl candidates: another kind of device" in text
    assert main(["algorithms", "--device", "cpu"]) == 0
    listed = capsys.readouterr().out
    assert "blas" in listed and "[opencl]" not in listed
    assert main(["algorithms", "matmul", "--device", "opencl"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].startswith("matmul") and all("[opencl]" in line for line in listed[1:])


def test_python_dash_m_fastrun_runs_the_command():
    done = subprocess.run([sys.executable, "-m", "fastrun", "--version"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("fastrun ")


def test_a_ctrl_c_that_lands_in_a_finalizer_is_delivered_again_not_printed():
    """Python drops a KeyboardInterrupt raised inside ``__del__`` after printing "Exception
    ignored in" with a traceback (numba compiling a kernel runs llvmlite's finalizers); the
    command line's hook sends the signal again, so the program stops cleanly instead of
    sleeping on."""
    code = ("from fastrun.cli import unsaved\n"
            "unsaved.quiet_interrupted_finalizers()\n"
            "class Finalized:\n"
            "    def __del__(self):\n"
            "        raise KeyboardInterrupt\n"
            "try:\n"
            "    Finalized()\n"
            "    import time\n"
            "    time.sleep(30)\n"
            "    print('went on')\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "interrupted"
    assert done.stderr == ""
