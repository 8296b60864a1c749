"""The OpenCL matmul algorithms on the OpenCL device here (PoCL on the CPU in CI): every family
and a seeded sample of ``cl_gemm`` configurations against the reference, their usability and
workspace claims, and a fast-run search that picks a configuration, caches it under the OpenCL
category and times no more than the tuning budget fully.

PoCL compiles each configuration on first use (about a second each on 2 cores), so the
configurations are sampled, not all run; pyopencl and PoCL keep the binaries on disk, so
later runs are faster.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

import fastrun
from fastrun.cache import InMemoryCache
from fastrun.operator import Problem
from fastrun.registry import Registry
from fastrun_algorithms import matmul
from fastrun_algorithms.matmul._batch import layout_of
from fastrun_algorithms.matmul.opencl import (
    DirectCLMatmul,
    GemmCLMatmul,
    TiledCLMatmul,
    opencl_algorithms,
)
from fastrun_algorithms.matmul.opencl.space import gemm_configurations
from tests.opencl_helpers import DeviceContext, device_fixture  # noqa: F401

REGISTRY = Registry(load_plugins=False)
matmul.register(REGISTRY)
OPERATOR = REGISTRY.operator("matmul")
OPENCL = [a for a in REGISTRY.algorithms("matmul") if a.device_kind == "opencl"]
GEMM = [a for a in OPENCL if a.desc.name == "cl_gemm"]

#: (A shape, B shape): odd sizes that pad every dimension, a tile multiple, a batch with a
#: broadcast operand, and 1-D operands
ODD = ((37, 29), (29, 45))
MULTIPLE = ((64, 32), (32, 128))
BATCHED = ((3, 33, 17), (17, 70))
VECTOR = ((70,), (70, 5))


def check(device, algorithm, a_shape, b_shape, dtype="float32", seed=0):
    problem = Problem.create("matmul", [a_shape, b_shape], [dtype, dtype])
    OPERATOR.validate(problem)
    assert algorithm.usable(problem), algorithm.unusable_reason(problem)
    rng = np.random.default_rng(seed)
    inputs = OPERATOR.random_inputs(problem, rng)
    output = algorithm.run(problem, [device.to_device(x) for x in inputs], DeviceContext(device))
    host = device.to_host(output)
    assert host.shape == OPERATOR.output_shape(problem)
    assert host.dtype == np.dtype(dtype)
    error = OPERATOR.error(problem, host, OPERATOR.reference(problem, inputs))
    assert error <= OPERATOR.tolerance(problem), f"{algorithm.desc.text} on {problem}: {error}"


def test_registered_space_is_bounded_and_unique():
    texts = [a.desc.text for a in OPENCL]
    assert len(texts) == len(set(texts))
    assert len(GEMM) == len(gemm_configurations())
    # 346 tile configurations, and 4 split-K variants of each of the 43 double-buffered ones
    # with vector loads
    assert 100 <= len(GEMM) <= 520 and len(OPENCL) <= 560
    assert sum(1 for a in GEMM if a.split > 1) == 4 * sum(
        1 for a in GEMM if a.split == 1 and a.db and a.vw >= 2)
    # identity carries every parameter, e.g. the configuration the issue names and the
    # double-buffered one that wins on an H100
    assert "cl_gemm(db=0,kwg=16,mdimc=16,mwg=64,ndimc=16,nwg=64,sa=1,sb=1,vw=4)" in texts
    assert "cl_gemm(db=1,kwg=16,mdimc=16,mwg=128,ndimc=16,nwg=128,sa=1,sb=1,vw=4)" in texts
    # double buffering only with both tiles staged
    assert all(a.sa and a.sb for a in GEMM if a.db)
    assert [a.desc.text for a in opencl_algorithms()] == texts


FAMILIES = [a for a in OPENCL if a.desc.name in ("cl_naive", "cl_tiled")] + [
    DirectCLMatmul({"wm": 1, "wn": 4, "lx": 8, "ly": 1}),
    DirectCLMatmul({"wm": 4, "wn": 4, "lx": 8, "ly": 4}),
    DirectCLMatmul({"wm": 1, "wn": 4, "lx": 16, "ly": 2}),
]


@pytest.mark.parametrize("algorithm", FAMILIES, ids=lambda a: a.desc.text)
@pytest.mark.parametrize("shapes", [ODD, BATCHED, VECTOR], ids=["odd", "batched", "vector"])
def test_naive_tiled_and_direct_match_the_reference(device, algorithm, shapes):
    problem = Problem.create("matmul", list(shapes), ["float32"] * 2)
    if not algorithm.usable(problem):
        pytest.skip(algorithm.unusable_reason(problem))
    check(device, algorithm, *shapes)


GEMM_SAMPLE = random.Random(2024).sample([a for a in GEMM if a.split == 1], 20)
#: Every kernel path: double-buffered with 4-wide A reads from local memory (VWM 4), with
#: 2-wide ones, and with scalar ones (MWG not a multiple of MDIMC x VW)
GEMM_SAMPLE += [GemmCLMatmul(p) for p in (
    {"mwg": 128, "nwg": 128, "kwg": 16, "mdimc": 16, "ndimc": 16, "vw": 4, "sa": 1, "sb": 1,
     "db": 1},
    {"mwg": 64, "nwg": 32, "kwg": 16, "mdimc": 8, "ndimc": 8, "vw": 2, "sa": 1, "sb": 1,
     "db": 1},
    {"mwg": 32, "nwg": 64, "kwg": 16, "mdimc": 16, "ndimc": 8, "vw": 4, "sa": 1, "sb": 1,
     "db": 1},
)]


@pytest.mark.parametrize("algorithm", GEMM_SAMPLE, ids=lambda a: a.desc.text)
def test_gemm_sample_matches_the_reference_padded_and_unpadded(device, algorithm):
    m, n, k = algorithm.mwg, algorithm.nwg, algorithm.kwg
    # Just over one tile in every dimension: every operand is padded, and edge tiles are
    # mostly padding.
    check(device, algorithm, (m + 5, k + 7), (k + 7, n + 3))
    check(device, algorithm, (2, m, 2 * k), (2, 2 * k, n), seed=1)  # tile multiple, batched


def test_float64_and_broadcast_batches(device):
    if "cl_khr_fp64" not in device.cl_device.extensions:
        pytest.skip(f"{device.name} has no float64")
    gemm = GemmCLMatmul({"mwg": 32, "nwg": 32, "kwg": 16, "mdimc": 8, "ndimc": 8, "vw": 2,
                         "sa": 1, "sb": 1, "db": 0})
    check(device, gemm, (33, 20), (2, 20, 7), dtype="float64")
    check(device, TiledCLMatmul({"ts": 8}), (2, 9, 20), (20, 7), dtype="float64")


def test_empty_products(device):
    gemm = GEMM_SAMPLE[0]
    for a_shape, b_shape in (((0, 5), (5, 3)), ((4, 0), (0, 3))):
        problem = Problem.create("matmul", [a_shape, b_shape], ["float32"] * 2)
        inputs = [np.ones(a_shape, np.float32), np.ones(b_shape, np.float32)]
        out = device.to_host(gemm.run(problem, [device.to_device(x) for x in inputs],
                                      DeviceContext(device)))
        np.testing.assert_array_equal(out, np.matmul(*inputs))


def test_usability_reasons():
    partial = Problem.create("matmul", [(2, 1, 4, 5), (1, 3, 5, 6)], ["float32"] * 2)
    assert "broadcast partly" in GEMM[0].unusable_reason(partial)
    tiny = Problem.create("matmul", [(3, 5), (5, 4)], ["float32"] * 2)
    big = GemmCLMatmul({"mwg": 128, "nwg": 64, "kwg": 16, "mdimc": 16, "ndimc": 16, "vw": 4,
                        "sa": 1, "sb": 1, "db": 0})
    assert big.unusable_reason(tiny) == "MWG=128 is larger than the product needs (3)"
    wide = DirectCLMatmul({"wm": 1, "wn": 4, "lx": 64, "ly": 1})
    assert "64 work-items per group along N" in wide.unusable_reason(tiny)
    # every problem keeps at least one configuration of each family
    for algorithm in (DirectCLMatmul({"wm": 4, "wn": 4, "lx": 8, "ly": 1}),
                      GemmCLMatmul({"mwg": 32, "nwg": 32, "kwg": 16, "mdimc": 8, "ndimc": 8,
                                    "vw": 1, "sa": 1, "sb": 1, "db": 0})):
        assert algorithm.usable(tiny)


def test_device_limits_are_checked_before_running():
    class SmallDevice:
        name = "small"
        max_work_group_size = 256
        local_mem_size = 8 * 1024

        class cl_device:  # mimics pyopencl's attribute
            extensions = "cl_khr_global_int32_base_atomics"

    problem = Problem.create("matmul", [(64, 64), (64, 64)], ["float32"] * 2)
    assert "over the device's maximum of 256" in TiledCLMatmul({"ts": 32}) \
        .device_unusable_reason(SmallDevice, problem)
    staged = GemmCLMatmul({"mwg": 128, "nwg": 128, "kwg": 16, "mdimc": 16, "ndimc": 16,
                           "vw": 4, "sa": 1, "sb": 1, "db": 0})
    # A's rows padded by one 4-wide vector: (128 + 4) x 16 + 16 x 128 words
    assert staged.device_unusable_reason(SmallDevice, problem) == (
        "needs 16640 B of local memory, over the device's 8192 B")
    double = GemmCLMatmul({**staged.param, "db": 1})
    assert double.local_bytes(4) == 2 * 16640
    doubles = Problem.create("matmul", [(4, 4), (4, 4)], ["float64"] * 2)
    assert "float64" in TiledCLMatmul({"ts": 8}).device_unusable_reason(SmallDevice, doubles)


def test_workspace_counts_the_padded_copies():
    gemm = GemmCLMatmul({"mwg": 64, "nwg": 32, "kwg": 16, "mdimc": 16, "ndimc": 8, "vw": 4,
                         "sa": 1, "sb": 1, "db": 0})
    aligned = Problem.create("matmul", [(128, 32), (32, 64)], ["float32"] * 2)
    assert gemm.workspace_bytes(aligned) == 0
    # no tile multiple, but K and N multiples of VW: the kernel handles every edge
    edges = Problem.create("matmul", [(3, 50, 20), (20, 60)], ["float32"] * 2)
    assert gemm.workspace_bytes(edges) == 0
    # N no multiple of VW: B (broadcast, once) and C copied with N rounded up to 64
    odd_n = Problem.create("matmul", [(3, 50, 32), (32, 62)], ["float32"] * 2)
    assert gemm.workspace_bytes(odd_n) == 4 * (32 * 64 + 3 * 50 * 64)
    # K no multiple of VW: A and B copied with K rounded up to 24, C not
    odd_k = Problem.create("matmul", [(64, 22), (22, 32)], ["float32"] * 2)
    assert gemm.workspace_bytes(odd_k) == 4 * (64 * 24 + 24 * 32)


def test_only_the_edges_a_product_has_are_built_in():
    """An aligned product builds the kernel without a clamp or a select; each unaligned
    dimension switches on its own edge (K and N after rounding up to VW)."""
    gemm = GemmCLMatmul({"mwg": 32, "nwg": 64, "kwg": 16, "mdimc": 8, "ndimc": 8, "vw": 2,
                         "sa": 1, "sb": 1, "db": 1})

    def edges(a_shape, b_shape):
        problem = Problem.create("matmul", [a_shape, b_shape], ["float32"] * 2)
        return gemm.shape_defines(layout_of(problem))

    assert edges((64, 32), (32, 128)) == {"EDGE_M": 0, "EDGE_N": 0, "EDGE_K": 0}
    assert edges((197, 768), (768, 768)) == {"EDGE_M": 1, "EDGE_N": 0, "EDGE_K": 0}
    assert edges((12, 197, 64), (12, 64, 197)) == {"EDGE_M": 1, "EDGE_N": 1, "EDGE_K": 0}
    assert edges((64, 197), (197, 64)) == {"EDGE_M": 0, "EDGE_N": 0, "EDGE_K": 1}


@pytest.mark.parametrize("staging", [(1, 1, 1), (1, 1, 0), (0, 1, 0), (0, 0, 0)],
                         ids=["double-buffered", "staged", "b-staged", "unstaged"])
def test_edges_run_in_one_launch_without_copies(device, monkeypatch, staging):
    """Sizes that are no tile multiple (a ViT's 197 tokens) are handled by the kernel: one
    launch, no padded copy, the same result as the reference; a K or N that is no multiple
    of VW is copied."""
    sa, sb, db = staging
    gemm = GemmCLMatmul({"mwg": 32, "nwg": 32, "kwg": 16, "mdimc": 8, "ndimc": 8, "vw": 2,
                         "sa": sa, "sb": sb, "db": db})
    launches = []
    launch = device.launch
    monkeypatch.setattr(device, "launch", lambda kernel, *rest, **kw: (
        launches.append(kernel.function_name), launch(kernel, *rest, **kw))[1])
    for a_shape, b_shape in (((37, 48), (48, 64)), ((2, 33, 32), (32, 32)), ((1, 16), (16, 32)),
                             ((37, 50), (50, 70)), ((2, 33, 18), (2, 18, 34)), ((5, 2), (2, 6))):
        launches.clear()
        check(device, gemm, a_shape, b_shape)
        assert launches == ["mm_gemm"]
    launches.clear()
    check(device, gemm, (37, 45), (45, 71))  # K and N odd: A, B and C copied
    assert launches == ["pad_copy", "pad_copy", "mm_gemm", "unpad_copy"]


def test_heuristic_puts_direct_first_for_small_and_big_register_tiles_for_large():
    small = Problem.create("matmul", [(5, 7), (7, 3)], ["float32"] * 2)
    usable = [a for a in OPENCL if a.usable(small)]
    assert OPERATOR.heuristic_order(small, usable)[0].desc.name == "cl_direct"
    large = Problem.create("matmul", [(2048, 2048), (2048, 2048)], ["float32"] * 2)
    order = OPERATOR.heuristic_order(large, [a for a in OPENCL if a.usable(large)])
    first = order[0].param
    assert order[0].desc.name == "cl_gemm" and order[-1].desc.name == "cl_naive"
    assert (first["mwg"] // first["mdimc"]) * (first["nwg"] // first["ndimc"]) == 64
    assert first["vw"] == 4 and first["sa"] == first["sb"] == first["db"] == 1


def test_fast_run_search_picks_a_checked_configuration_and_caches_it(device):
    cache = InMemoryCache()
    options = {"cache": cache, "strategy": "fast-run", "budget_s": 0.002, "progress": False,
               "tuning_budget": 3, "device": device}
    with fastrun.session(**options) as session:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((20, 24)).astype(np.float32)
        b = rng.standard_normal((24, 36)).astype(np.float32)
        out = device.to_host(fastrun.call("matmul", a, b))
        np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
        (decision,) = session.chooser.decisions()
    assert decision.source == "profiled"
    assert decision.algorithm.device_kind == "opencl"
    assert decision.algorithm.desc.name != "cl_naive"  # NAIVE: not a fast-run candidate
    # the budget: at most 3 timed fully (and each checked against the reference)
    assert 1 <= len(decision.entries) <= 3
    assert all(entry.error is not None and entry.error <= 1e-3 for entry in decision.entries)
    reasons = list(decision.excluded.values())
    assert any(r.startswith("dropped by successive halving after") for r in reasons)
    assert any(r.startswith("not in the budgeted search's sample") for r in reasons)
    assert any(r == "runs on cpu devices" for r in reasons)
    # cached under the OpenCL device's category; a second session only looks it up
    ((category, _, entries),) = list(cache)
    assert category.startswith("opencl;") and "|matmul@" in category
    assert entries[0].algorithm == decision.algorithm.desc.text
    with fastrun.session(**options) as again:
        repeat = again.decide(again.problem("matmul", [(20, 24), (24, 36)], ["float32"] * 2))
    assert repeat.source == "cache" and repeat.algorithm.desc == decision.algorithm.desc


@pytest.mark.parametrize("split", [2, 4, 16])
def test_split_k_gemm_sums_its_slices_in_one_launch(device, split):
    """Skinny products with a deep K: each call launches one kernel, gives the same bits
    (whichever slice finishes last) and leaves the tile counters zeroed; padded and
    batched shapes too."""
    algorithm = GemmCLMatmul({"mwg": 32, "nwg": 64, "kwg": 16, "mdimc": 16, "ndimc": 8,
                              "vw": 4, "sa": 1, "sb": 1, "db": 1, "split": split})
    for shapes in (((37, 1000), (1000, 70)), ((2, 32, 16 * 2 * split), (16 * 2 * split, 64))):
        problem = Problem.create("matmul", list(shapes), ["float32"] * 2)
        assert algorithm.usable(problem), algorithm.unusable_reason(problem)
        inputs = OPERATOR.random_inputs(problem, np.random.default_rng(split))
        outputs = [device.to_host(algorithm.run(problem, [device.to_device(x) for x in inputs],
                                                DeviceContext(device))) for _ in range(3)]
        for again in outputs[1:]:
            np.testing.assert_array_equal(again, outputs[0])
        error = OPERATOR.error(problem, outputs[0], OPERATOR.reference(problem, inputs))
        assert error <= OPERATOR.tolerance(problem)
    assert all(not device.to_host(c).any() for c in algorithm._counters.values())
    shallow = Problem.create("matmul", [(64, 40), (40, 64)], ["float32"] * 2)  # 3 steps
    assert "reduction slices need" in algorithm.unusable_reason(shallow)
    square = Problem.create("matmul", [(4096, 64), (64, 4096)], ["float32"] * 2)
    assert "fill the device" in algorithm.device_unusable_reason(device, square)
