"""``fastrun report``: the HTML page of a real searched cache, a rankings file and a model, and
that the page renders in a browser (headless Chromium) to something that is not blank."""

from __future__ import annotations

import html
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import msgpack
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import fastrun
from fastrun.analysis.report import ProblemData, pareto_front, problem_anchor, scatter_chart
from fastrun.attribute import AlgoAttribute
from fastrun.cache import Entry, FileCache
from fastrun.cli.main import main
from fastrun.runtime import load

CHROMIUM_INSTALL = "apt-get install -y chromium  (Debian/Ubuntu; provides /usr/bin/chromium)"


def tiny_model() -> onnx.ModelProto:
    """Conv -> Relu -> Conv -> Relu: two conv problems of different shapes."""
    rng = np.random.default_rng(0)

    def weight(name, shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32),
                                       name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["y"], name="relu2")]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 12, 12])],
        [weight("w1", (6, 3, 3, 3)), weight("w2", (8, 6, 3, 3))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """A cache filled by a real (short) fast-run search: matmuls, a conv and the tiny model."""
    root = tmp_path_factory.mktemp("report")
    cache = root / "c.bin"
    model_path = root / "tiny.onnx"
    onnx.save(tiny_model(), str(model_path))
    rng = np.random.default_rng(1)
    with fastrun.session(strategy="fast-run", cache=str(cache), budget_s=0.005,
                         progress=False) as session:
        for m, k, n in [(24, 40, 16), (96, 64, 48)]:
            fastrun.call("matmul", rng.random((m, k), dtype=np.float32),
                         rng.random((k, n), dtype=np.float32))
        fastrun.call("conv", rng.random((1, 4, 10, 10), dtype=np.float32),
                     rng.random((8, 4, 3, 3), dtype=np.float32), pads=(1, 1, 1, 1))
        load(str(model_path), session).search()
    return cache, model_path


def report(tmp_path, *argv) -> str:
    out = tmp_path / "report.html"
    assert main(["report", *map(str, argv), "-o", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def assert_self_contained(page: str) -> None:
    """No scripts, and nothing that would load: every src/href is a same-page anchor."""
    assert "<script" not in page.lower()
    assert "@import" not in page and "url(" not in page
    references = re.findall(r"""\b(?:src|href)\s*=\s*["']?([^"'\s>]*)""", page)
    assert references and all(ref.startswith("#") for ref in references), references
    assert "http:" not in page and "https:" not in page


def test_pareto_front_keeps_points_no_other_beats_in_both():
    points = [(1.0, 100.0), (2.0, 50.0), (3.0, 60.0), (4.0, 10.0), (2.0, 50.0), (5.0, 10.0)]
    # (3, 60) is beaten by (2, 50); (5, 10) by (4, 10); the duplicate (2, 50) stays.
    assert pareto_front(points) == [0, 1, 4, 3]
    assert pareto_front([]) == []
    assert pareto_front([(1.0, 0.0)]) == [0]


def test_cache_report_shows_every_problem_with_both_charts(searched, tmp_path):
    cache, _ = searched
    before, files = cache.read_bytes(), sorted(os.listdir(cache.parent))
    page = report(tmp_path, cache)
    assert cache.read_bytes() == before
    assert sorted(os.listdir(cache.parent)) == files  # nothing written or moved beside it
    assert_self_contained(page)

    problems = list(FileCache(cache))
    assert len(problems) >= 5
    for category, key, entries in problems:
        anchor = problem_anchor(category, key)
        assert f'id="{anchor}"' in page and f'href="#{anchor}"' in page  # section + index
        section = page.split(f'id="{anchor}"', 1)[1].split("</section>", 1)[0]
        assert html.escape(key) in section
        assert section.count("<svg") == 2  # bars + scatter
        assert section.count('<g class="bar') == len(entries)
        assert section.count('<g class="point') == len(entries)
        fastest = min(entries, key=lambda e: e.time_s)
        assert f"chosen: {html.escape(fastest.algorithm)}" in section
        for entry in entries:
            assert html.escape(entry.algorithm) in section
    for operator in ("matmul", "conv"):
        assert f'id="op-{operator}"' in page
    # the front is drawn where a problem has one of two or more points (whether the measured
    # cache has one depends on the timings: the rankings test below has one by construction)
    fronts = [pareto_front([(e.time_s, float(e.workspace_bytes)) for e in entries])
              for _, _, entries in problems]
    assert ('class="front"' in page) == any(len(front) > 1 for front in fronts)
    assert "fastrun versions" in page and fastrun.__version__ in page


def test_model_section_shows_each_layer_decided_from_the_cache(searched, tmp_path):
    cache, model_path = searched
    before = cache.read_bytes()
    page = report(tmp_path, cache, "--model", model_path)
    assert cache.read_bytes() == before
    assert_self_contained(page)
    section = page.split('<section id="model">', 1)[1].split("</section>", 1)[0]
    assert "tiny.onnx" in section
    rows = re.findall(r"<tr><td class=\"num\">\d+</td>.*?</tr>", section)
    assert len(rows) == 2  # conv1+relu1, conv2+relu2 after fusion
    for row, node in zip(rows, ("conv1", "conv2"), strict=True):
        assert node in row and ">cache<" in row and "–" not in row  # found, with a time
        anchor = re.search(r'href="#(p-[0-9a-f]+)"', row).group(1)
        assert f'<section class="problem" id="{anchor}">' in page
    assert section.count('<g class="layer">') == 2
    assert section.count('<g class="stack">') == 2
    # the run's measured total beside the profiled sum, and the gain over the heuristic where
    # the cache kept the heuristic's pick (or why it cannot say)
    assert re.search(r"Measured run: <b>[\d.]+ [µm]s</b> per inference \(median of 10 "
                     r"inferences", section)
    assert "The profiled times of 2 layers sum to" in section
    assert "Gain over the heuristic:" in section
    assert '<div class="name">model run</div>' in page


def test_model_gain_over_the_heuristic_comes_from_every_candidate_of_a_rankings_file(
        searched, tmp_path):
    """A rankings file keeps every candidate, so the heuristic's pick is always measured; a
    cache keeps each problem's Pareto front, and the section says how many it could not
    compare.  --iterations 0 leaves the run out."""
    _, model_path = searched
    path = tmp_path / "ranks.msgpack"
    assert main(["rank", f"model:{model_path}", "-o", str(path), "--budget", "0.002",
                 "--rounds", "1"]) == 0
    page = report(tmp_path, path, "--model", model_path, "--iterations", "0")
    section = page.split('<section id="model">', 1)[1].split("</section>", 1)[0]
    assert "Measured run" not in section and "model run" not in page
    gain = re.search(r"Gain over the heuristic: <b>([\d.]+)x</b> on (\d+) layers?", section)
    assert gain is not None, section
    assert float(gain.group(1)) >= 1.0 and int(gain.group(2)) == 2
    assert "not compared" not in section


def test_model_missing_from_the_input_is_decided_by_the_heuristic(tmp_path):
    empty = tmp_path / "empty.bin"
    empty.write_bytes(msgpack.packb({"format": "fastrun-cache", "version": 1,
                                     "categories": {}}, use_bin_type=True))
    model_path = tmp_path / "tiny.onnx"
    onnx.save(tiny_model(), str(model_path))
    page = report(tmp_path, empty, "--model", model_path)
    section = page.split('<section id="model">', 1)[1].split("</section>", 1)[0]
    assert section.count(">heuristic<") >= 2 and "No layer was found in the input" in section


def rankings_from(cache_path, label_prefix="<b>&"):
    """A rankings document with the cache's problems, plus a failure and an early stop."""
    problems = []
    for number, (category, key, entries) in enumerate(FileCache(cache_path)):
        problems.append({
            "operator": category.split("|")[1].split("@")[0], "category": category, "key": key,
            "label": f"{label_prefix} problem {number}", "weight": number + 1,
            "entries": [{"algorithm": e.algorithm, "time_s": e.time_s, "spread_s": e.spread_s,
                         "repeats": e.repeats, "workspace_bytes": e.workspace_bytes,
                         "error": e.error, "attributes": e.attributes.names(),
                         "early_stopped": i > 0} for i, e in enumerate(entries)],
            "failures": [{"algorithm": "naive", "reason": "NAIVE excluded <by strategy>"}]})
    # a problem whose faster algorithm needs workspace: a Pareto front of two points
    problems.append({
        "operator": "matmul", "category": "cpu;test|matmul@1", "key": "float32[8x8],float32[8x8]",
        "label": "time against workspace", "weight": 1,
        "entries": [{"algorithm": name, "time_s": time_s, "spread_s": 0.0, "repeats": 3,
                     "workspace_bytes": workspace, "error": 0.0, "attributes": ["REPRODUCIBLE"],
                     "early_stopped": False}
                    for name, time_s, workspace in (("fast", 1e-4, 4096), ("lean", 2e-4, 0))],
        "failures": []})
    return {"format": "fastrun-rankings", "version": 1, "suite": "unit", "device": "cpu;test",
            "fastrun_version": fastrun.__version__, "created_at": 1_700_000_000.0,
            "budget_s": 0.005, "strategy": "fast-run", "problems": problems}


def test_rankings_report_escapes_text_and_shows_failures_and_model(searched, tmp_path):
    cache, model_path = searched
    path = tmp_path / "ranks.msgpack"
    document = rankings_from(cache)
    path.write_bytes(msgpack.packb(document, use_bin_type=True))
    page = report(tmp_path, path, "--model", model_path)
    assert_self_contained(page)
    assert "<b>&" not in page and "&lt;b&gt;&amp; problem 0" in page
    assert "NAIVE excluded &lt;by strategy&gt;" in page
    assert "(stopped early)" in page and "suite" in page and "2023-11-14" in page
    assert 'class="front"' in page  # the time-against-workspace problem's front
    for problem in document["problems"]:
        assert f'id="{problem_anchor(problem["category"], problem["key"])}"' in page
    model = page.split('<section id="model">', 1)[1].split("</section>", 1)[0]
    assert model.count('"badge cache">cache<') == 2  # decided from the rankings


def test_max_problems_and_operator_filter(searched, tmp_path):
    cache, _ = searched
    page = report(tmp_path, cache, "--operator", "conv", "--max-problems", "1")
    assert page.count('<section class="problem"') == 1
    assert 'id="op-conv"' in page and 'id="op-matmul"' not in page
    assert "Showing the 1 most expensive" in page


@pytest.mark.parametrize("content", [b"", b"\xc1\xff garbage", msgpack.packb([1, 2]),
                                     msgpack.packb({"format": "something-else"}),
                                     msgpack.packb({"format": "fastrun-cache", "version": 99}),
                                     msgpack.packb({"format": "fastrun-rankings", "version": 1})])
def test_unreadable_input_is_an_error_naming_the_file_and_left_alone(tmp_path, capsys, content):
    bad = tmp_path / "bad.bin"
    bad.write_bytes(content)
    assert main(["report", str(bad), "-o", str(tmp_path / "out.html")]) == 2
    error = capsys.readouterr().err
    assert "bad.bin" in error and "error" in error
    assert bad.read_bytes() == content
    assert sorted(os.listdir(tmp_path)) == ["bad.bin"]


def test_missing_input_is_an_error(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope.bin"), "-o", str(tmp_path / "o.html")]) == 2
    assert "nope.bin" in capsys.readouterr().err


def find_chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("headless Chromium is needed to check that the report renders, and none was "
                f"found on PATH. Install it: {CHROMIUM_INSTALL}")


def screenshot(page_path, png_path, width=1200, height=1600) -> None:
    chromium = find_chromium()
    with tempfile.TemporaryDirectory() as profile:
        command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                   "--no-first-run", "--disable-background-networking",
                   "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                   f"--user-data-dir={profile}", f"--screenshot={png_path}",
                   f"--window-size={width},{height}", f"file://{os.path.abspath(page_path)}"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120,
                                check=False)
    assert result.returncode == 0 and os.path.exists(png_path), result.stderr[-2000:]


def test_page_renders_in_headless_chromium(searched, tmp_path):
    try:
        from PIL import Image
    except ImportError:
        pytest.fail("Pillow is needed to decode the screenshot: pip install -e '.[test]'")
    cache, model_path = searched
    page = tmp_path / "report.html"
    assert main(["report", str(cache), "--model", str(model_path), "-o", str(page)]) == 0
    png = tmp_path / "shot.png"
    screenshot(page, png)
    with Image.open(png) as image:
        assert image.size == (1200, 1600)
        pixels = np.asarray(image.convert("RGB")).reshape(-1, 3)
    colours = np.unique(pixels, axis=0)
    assert len(colours) > 50, "the screenshot has almost no colours: the page did not render"
    not_white = np.any(pixels < 240, axis=1).mean()
    assert not_white > 0.03, f"only {not_white:.1%} of the screenshot is not white"
    # the chosen-algorithm blue (#2563eb) of the bars/points or source badges is visible
    blue = np.all(np.abs(pixels.astype(int) - (0x25, 0x63, 0xEB)) < 12, axis=1).sum()
    assert blue > 100, "no chart colour in the screenshot: the SVG charts did not render"


def test_output_over_the_input_is_refused(searched, capsys):
    cache, _ = searched
    before = cache.read_bytes()
    assert main(["report", str(cache), "-o", str(cache)]) == 2
    assert "is the input file" in capsys.readouterr().err
    assert cache.read_bytes() == before


def test_a_cache_report_says_where_every_candidate_is_and_a_zero_axis_reads_zero(tmp_path):
    import re

    from fastrun.attribute import AlgoAttribute
    from fastrun.cache import Entry

    cache = tmp_path / "flat.bin"
    FileCache(cache).put("cpu;processor=X|matmul@4", "float32[8x8],float32[8x8]", [
        Entry("blas", AlgoAttribute.REPRODUCIBLE, 1e-6, 0.0, 0, 0.0, 10, 1.7e9, "0.1.0"),
        Entry("gemv", AlgoAttribute.NONE, 5e-7, 0.0, 0, 0.0, 10, 1.7e9, "0.1.0")])
    page = report(tmp_path, cache)
    assert "fastrun rank" in page and "Pareto front" in page
    scatter = page[page.index("time against workspace"):]
    scatter = scatter[:scatter.index("</svg>")]
    labels = re.findall(r">(\d+ B)<", scatter)
    assert labels == ["0 B"], labels  # not '1 B, 0 B, 0 B'


def test_scatter_labels_never_overlap_and_the_chosen_one_is_always_labelled():
    """Twelve algorithms on the Pareto front within a few percent of each other: the labels
    that fit are placed apart, the rest left to their tooltips, the chosen one first."""
    entries = [Entry(algorithm=f"blocked(kb={64 + i},mb=64,nb=64)", attributes=AlgoAttribute.NONE,
                     time_s=1e-4 * (1 + i / 100), spread_s=0.0,
                     workspace_bytes=4096 * (12 - i), error=None, repeats=10, measured_at=0.0,
                     version="")
               for i in range(12)]
    svg = scatter_chart(ProblemData("matmul", "cpu;x|matmul@1", "k", entries))
    labels = re.findall(r'<text x="([\d.-]+)" y="([\d.-]+)"[^>]*class="mono"[^>]*>([^<]*)<', svg)
    assert labels and any(text.startswith("blocked(kb=64,") for _, _, text in labels)
    boxes = [(float(x), float(y) - 9, len(text) * 6.1, 11.0) for x, y, text in labels]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not (a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3]
                        and b[1] < a[1] + a[3]), (a, b)


def test_ctrl_c_while_timing_the_model_is_one_plain_line(searched, tmp_path):
    """Ctrl-C while the report times the model (a SIGINT the process sends itself on the
    model's second run): one line that does not speak of saving a search, exit status 130."""
    cache, model_path = searched
    code = ("import os, signal, sys\n"
            "import fastrun.runtime.model as m\n"
            "from fastrun.cli.main import main\n"
            "runs = [0]\n"
            "original = m.Model.run\n"
            "def run(self, feeds=None):\n"
            "    runs[0] += 1\n"
            "    if runs[0] == 2:\n"
            "        os.kill(os.getpid(), signal.SIGINT)\n"
            "    return original(self, feeds)\n"
            "m.Model.run = run\n"
            f"sys.exit(main(['report', {str(cache)!r}, '--model', {str(model_path)!r}, "
            f"'--iterations', '50', '-o', {str(tmp_path / 'r.html')!r}]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip() == "fastrun: interrupted"
    assert not (tmp_path / "r.html").exists()


def test_a_run_far_from_its_layers_profiled_sum_is_flagged_with_reasons():
    """The model section flags a measured run more than twice above or below its layers'
    profiled sum, and names the likely causes in that direction; an ordinary gap is not
    flagged."""
    from fastrun.analysis.report.data import LayerRow, ModelData
    from fastrun.analysis.report.page import _model_figures

    def model(run_ms, sources=("cache", "cache", "heuristic")):
        layers = [LayerRow(i, f"n{i}", "Conv", "conv", "direct", source,
                           0.010 if source == "cache" else None)
                  for i, source in enumerate(sources)]
        return ModelData("m", "cpu", layers, run_ms=run_ms, iterations=10)

    assert "flag" not in _model_figures(model(25.0))  # 25 ms against a 20 ms sum
    slower = _model_figures(model(80.0))
    assert "4.0x above the profiled sum" in slower and "1 layer decided without" in slower
    faster = _model_figures(model(5.0, ("cache", "cache", "nearest")))
    assert "4.0x below the profiled sum" in faster and "busier machine" in faster
    assert "nearest measured problem (1 layer)" in faster
