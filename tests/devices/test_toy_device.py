"""Adding a device kind is a plugin, not a framework edit: a package made here registers a
"reference" device through the ``fastrun.devices`` entry point and, through
``fastrun.plugins``, one NAIVE algorithm per operator for it (the operator's own reference).
A small ONNX model then runs on it end to end (full-run: fast-run leaves NAIVE algorithms
out): searched, cached under the device's own
category, and equal to the CPU's result; ``load_and_run`` and ``fastrun config`` take the new
kind like a built-in one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

#: The whole plugin: the device, and an algorithm of its kind for every registered operator.
PLUGIN = '''
    import numpy as np

    from fastrun.algorithm import Algorithm
    from fastrun.attribute import AlgoAttribute
    from fastrun.category import DEVICE, device_text
    from fastrun.devices import Device


    class ReferenceDevice(Device):
        """Host memory, synchronous: only its kind and its category are its own."""

        kind = "reference"

        @property
        def category(self):
            return device_text([(DEVICE, "reference"), ("numpy", np.__version__)])

        @classmethod
        def open(cls, options):
            if options:
                raise ValueError(f"the reference device takes no options (got {options!r})")
            return cls()

        @classmethod
        def describe_devices(cls):
            return ["every operator's reference implementation, on the host"]


    class Reference(Algorithm):
        """The operator's trusted reference, as the one algorithm of the reference device."""

        device_kind = "reference"
        name = "reference"
        attributes = AlgoAttribute.NAIVE | AlgoAttribute.REPRODUCIBLE

        def __init__(self, operator):
            self.operator = operator.name
            super().__init__()
            self._operator = operator

        def run(self, problem, inputs, ctx, prepared=None):
            expected = np.dtype(self._operator.output_dtype(problem)) \\
                if hasattr(self._operator, "output_dtype") else None
            out = np.asarray(self._operator.reference(problem, [np.asarray(a) for a in inputs]))
            return out if expected is None else out.astype(expected, copy=False)


    def register(registry):
        for name in ("conv", "relu", "add", "matmul", "global_avgpool"):
            registry.register_algorithm(Reference(registry.operator(name)))
'''


def _install_plugin(root) -> None:
    """The package and its distribution metadata, as pip would leave them on the path.  Its
    plugin entry sorts after fastrun_algorithms', whose operators it finds registered."""
    (root / "reference_device.py").write_text(textwrap.dedent(PLUGIN))
    info = root / "reference_device-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: reference-device\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[fastrun.devices]\nreference = reference_device:ReferenceDevice\n\n"
        "[fastrun.plugins]\nzz_reference = reference_device:register\n")


def _model(path) -> None:
    """Conv -> Relu -> Add (a residual) -> GlobalAveragePool -> Flatten -> MatMul."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper, save

    rng = np.random.default_rng(0)
    w = rng.uniform(-1, 1, (4, 4, 3, 3)).astype(np.float32)
    fc = rng.uniform(-1, 1, (4, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("Add", ["r", "x"], ["s"]),
         helper.make_node("GlobalAveragePool", ["s"], ["g"]),
         helper.make_node("Flatten", ["g"], ["f"]),
         helper.make_node("MatMul", ["f", "fc"], ["y"])], "toy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(fc, "fc")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    save(model, str(path))


SCRIPT = """
import json, sys, numpy as np, fastrun
from fastrun.runtime import load
model_path, cache_path = sys.argv[1], sys.argv[2]
x = np.random.default_rng(1).uniform(-1, 1, (1, 4, 8, 8)).astype(np.float32)
with fastrun.session(device="reference", cache=cache_path, strategy="full-run",
                     progress=False) as session:
    model = load(model_path, session)
    (y,) = model.run({"x": x}).values()
    steps = [(step.operator, report.algorithm) for step, report in
             zip(model.steps, model.search()) if step.problem is not None]
    category = session.device.category
with fastrun.session(device="cpu", strategy="heuristic", progress=False) as session:
    (expected,) = load(model_path, session).run({"x": x}).values()
print(json.dumps({"steps": steps, "category": category,
                  "error": float(np.max(np.abs(y - expected)))}))
"""


def test_a_device_plugin_runs_a_model_end_to_end(tmp_path):
    _install_plugin(tmp_path)
    model, cache = tmp_path / "toy.onnx", tmp_path / "cache.bin"
    _model(model)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(model), str(cache)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["category"].startswith("reference;")
    assert result["steps"] and all(algorithm == "reference"
                                   for _, algorithm in result["steps"]), result["steps"]
    assert {"conv", "matmul", "global_avgpool"} <= {op for op, _ in result["steps"]}
    assert result["error"] < 1e-5

    # the CLI takes the new kind like a built-in one, with no edit
    run = subprocess.run([sys.executable, "-m", "fastrun.cli.load_and_run", str(model),
                          "--device", "reference", "--full-run", "--algo-policy", str(cache),
                          "--iter", "2", "--no-progress"],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    listing = subprocess.run([sys.executable, "-m", "fastrun.cli.main", "config", "--device",
                              "reference"], env=env, capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr[-3000:]
    assert "device category: reference;" in listing.stdout
    assert "every operator's reference implementation" in listing.stdout
    algorithms = subprocess.run([sys.executable, "-m", "fastrun.cli.main", "algorithms",
                                 "--device", "reference"], env=env, capture_output=True,
                                text=True, timeout=120)
    assert algorithms.returncode == 0, algorithms.stderr[-3000:]
    assert "reference" in algorithms.stdout and "[reference]" in algorithms.stdout
    bad = subprocess.run([sys.executable, "-m", "fastrun.cli.load_and_run", str(model),
                          "--device", "reference:fast", "--iter", "1", "--no-progress"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "takes no options" in bad.stderr
