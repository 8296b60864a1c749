"""The ONNX runtime on an OpenCL device (PoCL on the CPU in CI): models match their CPU runs,
tensors stay on the device from input to output (one upload per input, one download per
output), view steps reshape and cast device arrays, and ``load_and_run --device opencl``
works end to end.

Models whose operators have no OpenCL algorithm yet are skipped with the list of missing
operators (the runtime reports them all before searching); once every operator a model needs
has one, its test runs for real.  The heuristic strategy keeps PoCL from timing hundreds of
kernel configurations; one test searches in context on operators with a single OpenCL
algorithm, so the step runner runs on the device without timing anything.
"""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import fastrun
from fastrun.registry import Registry, default_registry
from fastrun.runtime import load
from fastrun.runtime.errors import DeviceUnsupportedError
from tests.opencl_helpers import device_fixture  # noqa: F401
from tests.runtime import _models
from tests.runtime._models import GraphWriter


def _session(device, strategy: str = "heuristic", registry: Registry | None = None):
    return fastrun.Session(device=device, cache=None, strategy=strategy, progress=False,
                           registry=registry)


def _on_device(proto, device, strategy: str = "heuristic", **kwargs):
    """The model loaded and searched on ``device``; skipped while one of its operators has no
    OpenCL algorithm."""
    model = load(proto, _session(device, strategy), **kwargs)
    try:
        model.search()
    except DeviceUnsupportedError as error:
        pytest.skip("operators without OpenCL algorithms yet: " + ", ".join(error.operators))
    return model


def _on_cpu(proto, **kwargs):
    return load(proto, fastrun.Session(device="cpu", cache=None, strategy="heuristic",
                                       progress=False), **kwargs)


def _relative(got: np.ndarray, expected: np.ndarray) -> float:
    scale = max(float(np.max(np.abs(expected))), 1e-30)
    return float(np.max(np.abs(got.astype(np.float64) - expected))) / scale


class Transfers:
    """Counts host<->device copies at pyopencl's one entry point for them, so copies made
    anywhere (the runtime, the chooser, an algorithm) are seen, not only the device's
    ``to_device``/``to_host``.  Device-to-device copies are not transfers and not counted."""

    def __init__(self, monkeypatch):
        import pyopencl as cl

        self.uploads = self.downloads = 0
        original = cl.enqueue_copy

        def counting(queue, dest, src, **kwargs):
            if isinstance(src, np.ndarray) and not isinstance(dest, np.ndarray):
                self.uploads += 1
            elif isinstance(dest, np.ndarray):
                self.downloads += 1
            return original(queue, dest, src, **kwargs)

        monkeypatch.setattr(cl, "enqueue_copy", counting)

    def reset(self) -> None:
        self.uploads = self.downloads = 0


def data_movement() -> onnx.ModelProto:
    """Conv, then every tensor operator and view step: Transpose, Reshape, Slice (negative
    step), Concat, Pad (reflect), Gather (constant indices), Cast to float64 and back,
    Flatten.  Needs only conv and the tensor operators on the device."""
    w = GraphWriter(seed=3)
    w.node("Conv", ["x", w.weight("w", (4, 3, 3, 3))], "c", pads=[1, 1, 1, 1])
    w.node("Transpose", ["c"], "t", perm=[0, 2, 3, 1])                     # N, 6, 6, 4
    w.node("Reshape", ["t", w.const("shape", np.array([0, 36, 4], np.int64))], "r")
    w.node("Slice", ["r", w.const("starts", np.array([30], np.int64)),
                     w.const("ends", np.array([2], np.int64)),
                     w.const("axes", np.array([1], np.int64)),
                     w.const("steps", np.array([-3], np.int64))], "s")     # N, 10, 4
    w.node("Concat", ["s", "s"], "cat", axis=2)                            # N, 10, 8
    w.node("Pad", ["cat", w.const("pads", np.array([0, 2, 1, 0, 1, 2], np.int64))], "p",
           mode="reflect")                                                 # N, 13, 11
    w.node("Gather", ["p", w.const("idx", np.array([[0, -1], [5, 2]], np.int64))], "g",
           axis=1)                                                         # N, 2, 2, 11
    w.nodes.append(helper.make_node("Cast", ["g"], ["g64"], name="g64", to=TensorProto.DOUBLE))
    w.nodes.append(helper.make_node("Cast", ["g64"], ["g32"], name="g32", to=TensorProto.FLOAT))
    w.node("Flatten", ["g32"], "y", axis=1)
    return w.model((1, 3, 6, 6), "y", output_rank=2)


def tensor_only() -> onnx.ModelProto:
    """Tensor operators and views only (each has a single OpenCL algorithm, so a fast-run
    search takes it without timing, but still runs every step on the device in context)."""
    w = GraphWriter(seed=4)
    w.node("Transpose", ["x"], "t", perm=[0, 3, 1, 2])
    w.node("Pad", ["t", w.const("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))], "p",
           mode="edge")
    w.node("Concat", ["p", "p"], "c", axis=1)
    w.node("Flatten", ["c"], "y", axis=2)
    return w.model((1, 5, 4, 3), "y", output_rank=3)


MODELS = {"conv_bn_relu": _models.conv_bn_relu, "small_cnn": _models.small_cnn,
          "residual_block": _models.residual_block, "data_movement": data_movement}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_on_opencl_matches_cpu(device, name):
    proto = MODELS[name]()
    model = _on_device(proto, device, batch=2)
    reference = _on_cpu(proto, batch=2)
    feeds = reference.random_inputs(seed=5)
    expected = reference.run(feeds)
    got = model.run(feeds)
    for output, value in expected.items():
        assert type(got[output]) is np.ndarray
        assert got[output].shape == value.shape and got[output].dtype == value.dtype
        assert _relative(got[output], value) <= 1e-4, output
    # the steps ran OpenCL algorithms, not host ones
    assert all(r.decision.algorithm.device_kind == "opencl"
               for r in model.reports if r.decision is not None)


def test_the_residual_add_fuses_into_the_conv_on_the_device(device):
    """ResNet's Add(conv, shortcut) -> Relu is one cl_igemm launch, as on the CPU: no add step
    of its own, and the result still matches the CPU's."""
    proto = _models.residual_block(channels=16, size=8)
    model = _on_device(proto, device, batch=1)
    operators = [step.operator for step in model.steps if step.problem is not None]
    assert "add" not in operators and "add_relu" not in operators
    fused = [r for r in model.reports
             if r.decision is not None and r.decision.problem.param("residual")]
    assert len(fused) == 1 and fused[0].decision.algorithm.desc.name == "cl_igemm"
    reference = _on_cpu(proto, batch=1)
    feeds = reference.random_inputs(seed=3)
    got, expected = model.run(feeds)["y"], reference.run(feeds)["y"]
    assert _relative(got, expected) <= 1e-4


def test_the_classifier_head_is_one_step_on_the_device(device):
    """GlobalAveragePool -> flatten -> Gemm (its matmul and bias add) becomes one pool_linear
    step on OpenCL, which has an algorithm for it; the CPU keeps its steps."""
    proto = _models.small_cnn()
    model = _on_device(proto, device, batch=2)
    reference = _on_cpu(proto, batch=2)
    reference.search()
    head = model.steps[-1]
    assert head.operator == "pool_linear" and len(head.inputs) == 3
    assert head.op_type == "GlobalAveragePool+Reshape+Gemm"
    assert len(model.steps) == len(reference.steps) - 3  # pool, reshape, matmul, add -> 1
    assert "pool_linear" not in {step.operator for step in reference.steps}
    feeds = reference.random_inputs(seed=4)
    assert _relative(model.run(feeds)["y"], reference.run(feeds)["y"]) <= 1e-5


def test_a_squeeze_excitation_block_keeps_its_steps_on_the_device(device):
    """squeeze_excite has a CPU algorithm only: on OpenCL the block stays a pool, two convs
    and a multiply, and matches the CPU's fused step."""
    proto = _models.mobilenet_v3_block()
    model = _on_device(proto, device, batch=1)
    assert "squeeze_excite" not in {step.operator for step in model.steps}
    assert "global_avgpool" in {step.operator for step in model.steps}
    reference = _on_cpu(proto, batch=1)
    reference.search()
    assert "squeeze_excite" in {step.operator for step in reference.steps}
    feeds = reference.random_inputs(seed=6)
    assert _relative(model.run(feeds)["y"], reference.run(feeds)["y"]) <= 1e-4


def test_a_head_without_a_bias_fuses_and_one_with_another_reader_does_not(device):
    w = GraphWriter()
    x = w.node("Conv", ["x", w.weight("w", (6, 3, 3, 3))], "conv")
    gap = w.node("GlobalAveragePool", [x], "gap")
    flat = w.node("Flatten", [gap], "flat")
    w.node("MatMul", [flat, w.weight("fc", (6, 4))], "y")
    model = _on_device(w.model((1, 3, 8, 8), "y", output_rank=2), device, batch=3)
    assert model.steps[-1].operator == "pool_linear" and len(model.steps[-1].inputs) == 2
    # the flattened value also feeds a second MatMul: nothing fuses
    w.node("Add", ["y", w.node("MatMul", [flat, w.weight("fc2", (6, 4))], "z")], "sum")
    model = _on_device(w.model((1, 3, 8, 8), "sum", output_rank=2), device, batch=3)
    assert "pool_linear" not in {step.operator for step in model.steps}
    reference = _on_cpu(w.model((1, 3, 8, 8), "sum", output_rank=2), batch=3)
    feeds = reference.random_inputs(seed=5)
    assert _relative(model.run(feeds)["sum"], reference.run(feeds)["sum"]) <= 1e-5


def test_run_host_seconds_gives_the_outputs_and_the_issue_time(device):
    """What bench_opencl_models reports as host microseconds per step: the same outputs as
    run(), and the seconds before the download (the data_movement model's Reshape is a view
    of the buffer)."""
    model = _on_device(data_movement(), device, batch=1)
    feeds = model.random_inputs(seed=1)
    outputs, seconds = model.run_host_seconds(feeds)
    expected = model.run(feeds)
    for name, value in expected.items():
        np.testing.assert_array_equal(outputs[name], value)
    assert seconds > 0 and model.step_count == len(model.steps)


@pytest.mark.parametrize("name", ["conv_bn_relu", "data_movement", "small_cnn"])
def test_one_upload_per_input_one_download_per_output(device, name, monkeypatch):
    proto = MODELS[name]()
    model = _on_device(proto, device, batch=1)
    feeds = model.random_inputs(seed=1)
    model.launch_plan()  # the first run records it, with check runs of its own
    transfers = Transfers(monkeypatch)
    for _ in range(3):
        transfers.reset()
        model.run(feeds)
        assert (transfers.uploads, transfers.downloads) == (len(model.inputs),
                                                            len(model.graph.outputs))
    transfers.reset()
    model.run_timed(feeds)
    assert (transfers.uploads, transfers.downloads) == (1, 1)


def test_constants_are_uploaded_once_at_search(device, monkeypatch):
    """Searching uploads the constants steps read; runs upload only the input.  (With
    replay on, the first run also records and checks a launch plan on random inputs.)"""
    transfers = Transfers(monkeypatch)
    model = load(data_movement(), _session(device), replay=False)
    model.search()
    constants = {id(v) for step in model.steps for v in step.inputs if v.is_const}
    assert transfers.uploads == len(constants) and transfers.downloads == 0
    transfers.reset()
    model.run(model.random_inputs())
    assert (transfers.uploads, transfers.downloads) == (1, 1)


def test_device_array_inputs_are_not_copied(device, monkeypatch):
    model = _on_device(data_movement(), device)
    feeds = model.random_inputs(seed=2)
    expected = model.run(feeds)
    on_device = model.random_inputs(seed=2, on_device=True)
    transfers = Transfers(monkeypatch)
    got = model.run(on_device)
    assert (transfers.uploads, transfers.downloads) == (0, 1)
    np.testing.assert_array_equal(got["y"], expected["y"])
    # a castable dtype is converted on the device, as a host input is converted on the host
    as_double = {"x": device.to_device(feeds["x"].astype(np.float64))}
    np.testing.assert_allclose(model.run(as_double)["y"], expected["y"], rtol=1e-6)


@pytest.mark.parametrize("replay", [True, False], ids=["replayed", "step-by-step"])
def test_a_resident_run_moves_nothing_and_leaves_the_outputs_on_the_device(
        device, monkeypatch, replay):
    """bench_opencl_models' resident mode: device inputs, no upload and no download, the
    outputs device arrays equal to run()'s."""
    model = load(_models.small_cnn(), _session(device), batch=1, replay=replay)
    feeds = model.random_inputs(seed=3)
    expected = model.run(feeds)
    on_device = model.random_inputs(seed=3, on_device=True)
    transfers = Transfers(monkeypatch)
    for _ in range(2):
        outputs = model.run_resident(on_device)
    assert (transfers.uploads, transfers.downloads) == (0, 0)
    assert set(outputs) == set(expected)
    for name, value in expected.items():
        assert isinstance(outputs[name], device.array_type())
        np.testing.assert_allclose(device.to_host(outputs[name]), value, rtol=1e-6, atol=1e-6)
    cpu = load(_models.small_cnn(), fastrun.session(device="cpu:1", progress=False), batch=1)
    with pytest.raises(ValueError, match="needs a model on a queued device"):
        cpu.run_resident(feeds)


def test_in_context_search_runs_steps_on_the_device(device):
    """fast-run executes the model step by step while it searches: on the device, with
    device arrays (view steps included)."""
    proto = tensor_only()
    model = load(proto, _session(device, "fast-run"))
    model.search()
    assert {r.source for r in model.reports if r.decision is not None} == {"only"}
    feeds = model.random_inputs(seed=3)
    np.testing.assert_array_equal(model.run(feeds)["y"], _on_cpu(proto).run(feeds)["y"])


def test_device_casts_match_numpy(device):
    from fastrun.devices.opencl.steps import cast

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(37) * 300).astype(np.float32)
    x[:3] = (0.0, -0.0, 0.5)
    for target in (np.float64, np.float16, np.int32, np.int64, np.int16, np.bool_):
        got = cast(device, device.to_device(x), np.dtype(target)).get()
        assert got.dtype == target
        np.testing.assert_array_equal(got, x.astype(target), err_msg=str(target))
    half = x.astype(np.float16)
    np.testing.assert_array_equal(cast(device, device.to_device(half), np.float32).get(),
                                  half.astype(np.float32))
    flags = rng.random(9) < 0.5
    np.testing.assert_array_equal(cast(device, device.to_device(flags), np.float32).get(),
                                  flags.astype(np.float32))


def test_zoo_squeezenet_on_opencl_matches_cpu(device):
    model = _on_device("zoo:squeezenet", device, batch=1)
    reference = _on_cpu("zoo:squeezenet", batch=1)
    feeds = reference.random_inputs(seed=0)
    expected = reference.run(feeds)
    got = model.run(feeds)
    for output, value in expected.items():
        assert got[output].shape == value.shape
        assert _relative(got[output], value) <= 1e-4, output


def test_a_transformer_block_runs_on_opencl_as_wide_steps(device):
    """A pre-norm encoder layer's MLP as exporters write it (LayerNormalization at opset 17,
    MatMul + bias Add, the exact GELU as Div/Erf/Add/Mul/Mul, a second projection, the
    residual): on the device its steps are one layer_norm, two linear (the first with its
    GELU) and the add, and it matches the CPU."""
    w = GraphWriter()
    n = w.node("LayerNormalization", ["x", w.weight("g", (48,)), w.weight("b", (48,))], "ln",
               axis=-1, epsilon=1e-6)
    h = w.node("Add", [w.node("MatMul", [n, w.weight("w1", (48, 96), 0.2)], "p1"),
                       w.weight("b1", (96,))], "h")
    scaled = w.node("Div", [h, w.const("root2", np.array(np.sqrt(2), np.float32))], "scaled")
    gate = w.node("Add", [w.node("Erf", [scaled], "erf"),
                          w.const("one", np.array(1.0, np.float32))], "gate")
    g = w.node("Mul", [w.node("Mul", [h, gate], "hg"), w.const("half", np.array(0.5, np.float32))],
               "gelu")
    o = w.node("Add", [w.node("MatMul", [g, w.weight("w2", (96, 48), 0.2)], "p2"),
                       w.weight("b2", (48,))], "o")
    w.node("Add", [o, "x"], "y")
    proto = w.model((1, 20, 48), "y", opset=17, output_rank=3)
    model = _on_device(proto, device)
    operators = [step.operator for step in model.steps if step.problem is not None]
    assert operators.count("linear") == 2 and "layer_norm" in operators
    assert not {"erf", "gelu", "mul", "div", "matmul"} & set(operators), operators
    reference = _on_cpu(proto)
    feeds = reference.random_inputs(seed=2)
    assert _relative(model.run(feeds)["y"], reference.run(feeds)["y"]) <= 1e-5


def _without_opencl(operator: str) -> Registry:
    """The default registry's operators and algorithms, less ``operator``'s OpenCL ones."""
    full, registry = default_registry(), Registry(load_plugins=False)
    for name in full.operators():
        registry.register_operator(full.operator(name))
        for algorithm in full.algorithms(name):
            if name != operator or algorithm.device_kind != "opencl":
                registry.register_algorithm(algorithm)
    return registry


def test_missing_opencl_algorithm_names_every_node(device):
    model = load(_models.residual_block(), _session(device, registry=_without_opencl("conv")))
    with pytest.raises(DeviceUnsupportedError) as info:
        model.search()
    text = str(info.value)
    assert info.value.operators == ["conv"]
    assert text.count("operator conv (algorithms for: cpu)") == len(info.value.missing) >= 2
    assert "node " in text and "(Conv)" in text and "opencl" in text


def test_load_and_run_reports_missing_operator(device, tmp_path, monkeypatch, capsys):
    from fastrun.cli import load_and_run

    path = tmp_path / "residual.onnx"
    onnx.save(_models.residual_block(), path)
    registry = _without_opencl("conv")
    monkeypatch.setattr("fastrun.api.default_registry", lambda: registry)
    status = load_and_run.main([str(path), "--device", "opencl", "--iter", "1",
                                "--no-progress"])
    err = capsys.readouterr().err
    assert status == 2
    assert "load_and_run: error:" in err and "operator conv" in err and "(Conv)" in err


@pytest.mark.parametrize("name", ["conv_bn_relu", "small_cnn"])
def test_load_and_run_opencl_check(device, name, tmp_path, capsys):
    from fastrun.cli import load_and_run

    proto = MODELS[name]()
    probe = load(proto, _session(device))
    try:
        probe.search()
    except DeviceUnsupportedError as error:
        pytest.skip("operators without OpenCL algorithms yet: " + ", ".join(error.operators))
    path = tmp_path / f"{name}.onnx"
    onnx.save(proto, path)
    dump = tmp_path / "out.npz"
    status = load_and_run.main([str(path), "--device", "opencl", "--check", "--iter", "2",
                                "--no-progress", "--verbose", "--dump-output", str(dump)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "ok" in out and "MISMATCH" not in out
    # the launch plan line: replayed, or run step by step where that was measured faster
    assert re.search(r"launches   (\d+ launches replayed|step by step: [\d.]+ ms)", out), out
    with np.load(dump) as saved:
        assert saved["y"].dtype == np.float32 and saved["y"].shape[0] == 1
    status = load_and_run.main([str(path), "--device", "opencl", "--check", "--iter", "2",
                                "--no-progress", "--no-replay"])
    out = capsys.readouterr().out
    assert status == 0 and "ok" in out and "launches   off" in out, out
