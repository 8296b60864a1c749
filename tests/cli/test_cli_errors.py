"""Every mistake a user can make on the command line gets one line naming the bad argument and
exit status 2, before anything large is allocated; never a traceback (issue 14, item 7)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[2]


def run(*argv: str, module: str = "fastrun.cli.main", timeout: float = 120,
        stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *argv], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO, input=stdin)


def one_line_error(done: subprocess.CompletedProcess, *fragments: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    error = next(line for line in lines if "error:" in line)
    for fragment in fragments:
        assert fragment in error, (fragment, error)


@pytest.mark.parametrize("argv, fragments", [
    (["--inputs", "200000x200000,200000x200000", "--fast-run"],
     ["input 0", "[200000, 200000]", "149.0 GiB", "FASTRUN_MEMORY_LIMIT"]),
    (["--inputs", "8x8,8x8", "--dtype", "notatype"], ["--dtype", "'notatype'"]),
    (["--inputs", "8x8,8x8", "--attrs", "bogus=1"], ["matmul has no parameter(s) bogus"]),
    (["--inputs", "8x8,8x8", "--device", "cpu:100000"], ["thread count 100000"]),
    (["--inputs", "8x8,8x8", "--device", "cpu:0"], ["thread count 0"]),
    (["--inputs", "8x8,8x8", "--fast-run", "--budget", "nan"], ["--budget", "'nan'"]),
    (["--inputs", "8x8,8x8", "--fast-run", "--budget", "-5"], ["--budget", "'-5'"]),
])
def test_profile_matmul_mistakes(argv: list[str], fragments: list[str]) -> None:
    started = time.monotonic()
    one_line_error(run("profile", "matmul", *argv), *fragments)
    assert time.monotonic() - started < 60, "refused only after allocating"


@pytest.mark.parametrize("attrs, fragments", [
    (["strides=1e400,1"], ["--attrs", "inf is not a finite number"]),
    (["group=0"], ["conv group must be positive, got 0"]),
    (["strides=0,1"], ["conv strides must be positive"]),
    (["dilations=a,b"], ["conv dilations must be positive integers"]),
])
def test_profile_conv_mistakes(attrs: list[str], fragments: list[str]) -> None:
    one_line_error(run("profile", "conv", "--inputs", "1x4x8x8,4x4x3x3", "--attrs", *attrs),
                   *fragments)


def test_memory_limit_setting_is_read_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from fastrun.core import limits

    monkeypatch.setenv("FASTRUN_MEMORY_LIMIT", "1MiB")
    with pytest.raises(limits.TensorTooLargeError, match=r"needs 4\.0 MiB"):
        limits.check_tensor((1024, 1024), np.float32, "x")
    limits.check_tensor((256, 1024), np.float32, "x")
    monkeypatch.setenv("FASTRUN_MEMORY_LIMIT", "lots")
    with pytest.raises(ValueError, match="FASTRUN_MEMORY_LIMIT"):
        limits.memory_limit()


def _model(path: Path, *, input_shape: list[int], constant_of_shape: list[int] | None = None
           ) -> Path:
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="relu")]
    initializers = []
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, input_shape)]
    if constant_of_shape is not None:
        initializers.append(numpy_helper.from_array(np.asarray(constant_of_shape, np.int64),
                                                    "shape"))
        nodes.append(helper.make_node("ConstantOfShape", ["shape"], ["big"], name="huge_fill"))
        nodes.append(helper.make_node("Add", ["y", "big"], ["z"], name="add"))
        outputs = [helper.make_tensor_value_info("z", TensorProto.FLOAT, constant_of_shape)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, input_shape)], outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_a_model_with_a_huge_input_is_refused_before_allocation(tmp_path: Path) -> None:
    model = _model(tmp_path / "huge_input.onnx", input_shape=[1, 3, 100000, 100000])
    started = time.monotonic()
    one_line_error(run(str(model), "--iter", "1", module="fastrun.cli.load_and_run"),
                   "input 'x'", "[1, 3, 100000, 100000]", "111.8 GiB")
    assert time.monotonic() - started < 60


def test_a_huge_constant_of_shape_is_refused_naming_the_node(tmp_path: Path) -> None:
    model = _model(tmp_path / "huge_fill.onnx", input_shape=[1, 900],
                   constant_of_shape=[1024, 1024, 1024, 900])
    one_line_error(run(str(model), "--iter", "1", module="fastrun.cli.load_and_run"),
                   "node 'huge_fill' (ConstantOfShape)", "3.5 TiB")


def test_a_closed_pipe_ends_the_output_quietly(tmp_path: Path) -> None:
    cache = tmp_path / "cache.bin"
    # 32 problems, searched in one process: the listing must be longer than one line
    fill = subprocess.run([sys.executable, "-c", (
        "from fastrun.cli.main import main\n"
        "for rows in range(8, 40):\n"
        f"    assert main(['profile', 'matmul', '--inputs', f'{{rows}}x16,16x8', '--fast-run',"
        f" '--budget', '0.001', '--algo-policy', {str(cache)!r}]) == 0\n")],
        capture_output=True, text=True, cwd=REPO, timeout=300)
    assert fill.returncode == 0, fill.stderr
    shown = subprocess.run(f"{sys.executable} -m fastrun.cli.main cache show {cache} | head -1",
                           shell=True, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert shown.stdout.startswith(f"cache file {cache}:") and shown.stderr == ""
    rows = subprocess.run(f"{sys.executable} -m fastrun.cli.load_and_run zoo:squeezenet "
                          "--iter 1 --verbose | head -1", shell=True, capture_output=True,
                          text=True, cwd=REPO, timeout=300)
    assert rows.stdout.startswith("node") and "Traceback" not in rows.stderr


def test_check_without_onnxruntime_stops_before_the_search() -> None:
    done = subprocess.run([sys.executable, "-c", (
        "import sys; sys.modules['onnxruntime'] = None; "
        "from fastrun.cli.load_and_run import main; "
        "sys.exit(main(['zoo:squeezenet', '--fast-run', '--check', '--iter', '1']))")],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    # from this checkout (an editable install), the extra is installed from the checkout: a
    # package named fastrun on the public index is another project
    one_line_error(done, "--check compares with onnxruntime", f"pip install -e '{REPO}[check]'")
    assert "search" not in done.stdout


@pytest.mark.parametrize("argv, fragments", [
    (["--batch", "0"], ["--batch must be >= 1, got 0"]),
    (["--threads", "0"], ["--threads must be >= 1, got 0"]),
    (["--threads", "2", "--device", "cpu:4"], ["--threads 2 and --device cpu:4 disagree"]),
    (["--threads", "2", "--device", "opencl"], ["--threads sets the CPU's threads",
                                                "--device is opencl"]),
    (["--time-peer"], ["--time-peer", "add --check"]),
    (["--summary-json", "{tmp}/missing/s.json"], ["--summary-json", "missing", "does not exist"]),
    (["--profile-json", "{tmp}"], ["--profile-json", "is a directory, not a file"]),
    (["--dump-output", "{tmp}/missing/out.npz"], ["--dump-output", "does not exist"]),
    (["--fast-run", "--algo-policy", "{tmp}"], ["--algo-policy", "is a directory",
                                                 "could not be saved"]),
    (["--fast-run", "--algo-policy", "{tmp}/notes.txt"], ["--algo-policy", "notes.txt",
                                                          "not a fastrun cache",
                                                          "could not be saved"]),
    (["--fast-run", "--algo-policy", "{tmp}/missing/c.bin"], ["--algo-policy", "does not exist"]),
])
def test_load_and_run_refuses_arguments_before_any_work(tmp_path, argv: list[str],
                                                        fragments: list[str]) -> None:
    """Issue 37, item 3: an argument that would fail only after the search and the timing (a
    summary into a missing folder, a cache path that is a directory or a text file) is refused
    first, in seconds, and no lock file is left beside a path that is not a cache."""
    (tmp_path / "notes.txt").write_text("my notes\n")
    started = time.monotonic()
    done = run("zoo:resnet18", *(a.format(tmp=tmp_path) for a in argv),
               module="fastrun.cli.load_and_run")
    one_line_error(done, *fragments)
    assert time.monotonic() - started < 30, "refused only after loading the model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "my notes\n"


def test_save_cache_to_lets_a_search_go_on_beside_a_file_it_cannot_save_to(tmp_path) -> None:
    """With ``--save-cache-to`` the search's results have somewhere to go: an --algo-policy it
    cannot write is read (or skipped) as before; the other file must itself be writable."""
    import os

    from fastrun.cli.load_and_run import argument_error, build_parser

    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    parse = build_parser().parse_args
    assert argument_error(parse(["m.onnx", "--fast-run", "--algo-policy", str(notes),
                                 "--save-cache-to", str(tmp_path / "out.bin")])) is None
    problem = argument_error(parse(["m.onnx", "--fast-run", "--algo-policy", str(notes),
                                    "--save-cache-to", str(tmp_path / "no" / "out.bin")]))
    assert problem.startswith("--save-cache-to") and "does not exist" in problem
    # without a search nothing is saved: the file is only read (and reported as foreign)
    assert argument_error(parse(["m.onnx", "--algo-policy", str(notes)])) is None
    if os.geteuid() != 0:  # root writes read-only files
        cache = tmp_path / "cache.bin"
        from fastrun.cache.file import header

        cache.write_bytes(header())
        cache.chmod(0o444)
        problem = argument_error(parse(["m.onnx", "--fast-run", "--algo-policy", str(cache)]))
        assert "is read-only" in problem and "--save-cache-to" in problem


@pytest.mark.parametrize("argv, fragments", [
    (["tune", "zoo:squeezenet", "--algo-policy", "{tmp}"],
     ["--algo-policy", "is a directory", "name another file"]),
    (["tune", "zoo:squeezenet", "--algo-policy", "{tmp}/notes.txt"],
     ["--algo-policy", "notes.txt", "could not be saved there"]),
    (["tune", "zoo:squeezenet", "--algo-policy", "{tmp}/c.bin", "--json", "{tmp}/no/s.json"],
     ["--json", "does not exist"]),
    (["tune", "zoo:squeezenet", "--algo-policy", "{tmp}/c.bin", "--times", "{tmp}"],
     ["--times", "is a directory"]),
    (["report", "{tmp}/c.bin", "--model", "zoo:squeezenet", "-o", "{tmp}/no/r.html"],
     ["--output", "does not exist"]),
    (["tune", "zoo:squeezenet", "--algo-policy", "{tmp}/c.bin", "--batch", "0"],
     ["--batch must be >= 1, got 0"]),
    (["tune", "zoo:squeezenet", "--algo-policy", "{tmp}/c.bin", "--timeout", "-1"],
     ["--timeout must be > 0, got -1"]),
    (["tune", "zoo:squeezenet", "--algo-policy", "{tmp}/c.bin", "--budget", "0"],
     ["--budget", "bad budget '0': expected a positive number of seconds"]),
    (["report", "{tmp}/c.bin", "--model", "zoo:squeezenet", "--batch", "0", "-o",
      "{tmp}/r.html"], ["--batch must be >= 1, got 0"]),
    (["report", "{tmp}/c.bin", "--max-problems", "-3", "-o", "{tmp}/r.html"],
     ["--max-problems must be >= 0, got -3"]),
], ids=["tune-cache-dir", "tune-cache-foreign", "tune-json", "tune-times", "report-output",
        "tune-batch", "tune-timeout", "tune-budget", "report-batch", "report-max-problems"])
def test_tune_and_report_check_their_arguments_before_any_work(tmp_path, argv,
                                                               fragments) -> None:
    """The numbers a tune or a report takes, and the paths it writes, are checked before it
    collects, searches or times anything, and a file that is no cache gets no lock file
    beside it."""
    (tmp_path / "notes.txt").write_text("not a cache\n")
    (tmp_path / "c.bin").write_bytes(b"")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    done = subprocess.run([sys.executable, "-m", "fastrun", *argv], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    one_line_error(done, *fragments)
    assert (tmp_path / "notes.txt").read_text() == "not a cache\n"
    assert not (tmp_path / "notes.txt.lock").exists()
