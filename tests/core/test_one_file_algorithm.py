"""Adding a CPU conv algorithm is one file and one registration line: a plugin package made
here, found through the ``fastrun.plugins`` entry point like any installed one, is ranked by
its own rule, profiled, and checked against the reference, with no framework or library edit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

#: The whole plugin: a conv algorithm (NCHW, group 1, no residual) computed by numpy's
#: einsum over the padded input, ranked first by its own rule, and a wrong twin that the
#: numerical check must catch.
PLUGIN = '''
    import numpy as np

    from fastrun_algorithms.conv.base import ConvAlgorithm
    from fastrun_algorithms.conv.geometry import geometry


    class EinsumConv(ConvAlgorithm):
        name = "einsum_conv"
        offset = 0.0

        def conv_unusable_reason(self, problem):
            geo = geometry(problem)
            if geo.group != 1 or geo.has_residual or (geo.dil_h, geo.dil_w) != (1, 1):
                return "einsum_conv computes group 1, dilation 1, no residual"
            return None

        def conv_rank(self, geo):
            return (-1, 0)  # before every shipped algorithm

        def run(self, problem, inputs, ctx, prepared=None):
            geo = geometry(problem)
            x = np.pad(inputs[0], ((0, 0), (0, 0), (geo.pad_top, geo.pad_bottom),
                                   (geo.pad_left, geo.pad_right)))
            w = inputs[1]
            out = np.zeros((geo.n, geo.k, geo.oh, geo.ow), dtype=x.dtype)
            for i in range(geo.r):
                for j in range(geo.s):
                    patch = x[:, :, i:i + geo.oh * geo.stride_h:geo.stride_h,
                              j:j + geo.ow * geo.stride_w:geo.stride_w]
                    out += np.einsum("nchw,kc->nkhw", patch, w[:, :, i, j])
            if geo.has_bias:
                out += inputs[2].reshape(1, -1, 1, 1)
            return out + self.offset


    class WrongEinsumConv(EinsumConv):
        name = "einsum_conv_wrong"
        offset = 0.5

        def conv_rank(self, geo):
            return (-1, 1)


    def register(registry):
        registry.register_algorithm(EinsumConv())
        registry.register_algorithm(WrongEinsumConv())
'''


def _install_plugin(root) -> None:
    """The package and its distribution metadata, as pip would leave them on the path."""
    (root / "einsum_plugin.py").write_text(textwrap.dedent(PLUGIN))
    info = root / "einsum_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: einsum-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[fastrun.plugins]\neinsum = einsum_plugin:register\n")


#: Both decisions in one interpreter: the heuristic's, then a fast-run search's.
SCRIPT = """
import json, numpy as np, fastrun
rng = np.random.default_rng(0)
x = rng.uniform(-1, 1, (1, 4, 9, 9)).astype(np.float32)
w = rng.uniform(-1, 1, (6, 4, 3, 3)).astype(np.float32)
b = rng.uniform(-1, 1, 6).astype(np.float32)
result = {}
for strategy in ("heuristic", "fast-run"):
    with fastrun.session(strategy=strategy, budget_s=0.002, progress=False) as session:
        problem = session.registry.operator("conv").problem(
            [x.shape, w.shape, b.shape], ["float32"] * 3, pads=[1, 1, 1, 1])
        decision = session.decide(problem)
        result[strategy] = {"chosen": decision.algorithm.desc.text,
                            "timed": [e.algorithm for e in decision.entries],
                            "failures": {f.algorithm: f.reason for f in decision.failures}}
print(json.dumps(result))
"""


def test_a_conv_algorithm_in_one_file_is_ranked_profiled_and_checked(tmp_path):
    _install_plugin(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["heuristic"]["chosen"] == "einsum_conv"  # its own rule put it first
    searched = result["fast-run"]
    assert "einsum_conv" in searched["timed"] and "im2col" in searched["timed"]
    assert "numerical error" in searched["failures"]["einsum_conv_wrong"]
    assert "einsum_conv_wrong" not in searched["timed"]
