"""Value types, the registry and the device: the identities caches depend on."""

import copy
import os
import pickle
import re
import subprocess
import sys

import pytest

from fastrun.algorithm import Algorithm, AlgorithmDesc
from fastrun.attribute import AlgoAttribute
from fastrun.base.problem import parse_value
from fastrun.devices import get_device
from fastrun.devices.cpu import CPUDevice
from fastrun.operator import Problem
from fastrun.registry import Registry, RegistryError
from tests.fakes import DoubleOp


def test_problem_key_is_canonical():
    a = Problem.create("conv", [(1, 3, 8, 8), (4, 3, 3, 3)], ["float32", "float32"],
                       {"strides": [2, 2], "group": 1, "weight_preprocess": True})
    b = Problem.create("conv", [[1, 3, 8, 8], [4, 3, 3, 3]], ["float32", "float32"],
                       {"weight_preprocess": True, "group": 1, "strides": (2, 2)})
    assert a == b and a.key == b.key
    assert a.key == ("float32[1x3x8x8],float32[4x3x3x3];"
                     "group=1,strides=(2,2),weight_preprocess=true")
    assert a.weight_preprocess and a.param("group") == 1 and a.param("missing", 7) == 7
    assert Problem.create("x", [(5,)], ["float64"]).key == "float64[5]"


def test_a_problem_copied_into_another_process_hashes_as_one_made_there():
    """The hash is computed once per problem; a pickled copy (what fleet workers get) must
    not carry it over, since another process hashes strings with another seed."""
    problem = Problem.create("conv", [(1, 3, 8, 8), (4, 3, 3, 3)], ["float32"] * 2,
                             {"group": 1})
    code = ("import pickle, sys; from fastrun.operator import Problem; "
            "copy = pickle.loads(sys.stdin.buffer.read()); "
            "made = Problem.create('conv', [(1, 3, 8, 8), (4, 3, 3, 3)], ['float32'] * 2, "
            "{'group': 1}); print(copy == made, {made: 'found'}.get(copy))")
    result = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(problem),
                            capture_output=True, check=True, env={**os.environ,
                                                                  "PYTHONHASHSEED": "7"})
    assert result.stdout.decode().split() == ["True", "found"]
    assert hash(copy.copy(problem)) == hash(problem)


def test_algorithm_desc_text_sorts_parameters():
    desc = AlgorithmDesc("matmul", "blocked", (("nb", 64), ("kb", 256), ("mb", 32)))
    assert desc.text == "blocked(kb=256,mb=32,nb=64)"
    assert str(desc) == "matmul:blocked(kb=256,mb=32,nb=64)"

    class Tiled(Algorithm):
        operator, name = "matmul", "tiled"

    assert Tiled({"b": 2, "a": (1, 1)}).desc.text == "tiled(a=(1,1),b=2)"
    assert parse_value("1,1") == (1, 1) and parse_value("true") is True
    assert parse_value("0.5") == 0.5 and parse_value("SAME_UPPER") == "SAME_UPPER"


def test_attribute_names_round_trip_and_errors():
    flags = AlgoAttribute.REPRODUCIBLE | AlgoAttribute.USABLE_DEPEND_ON_SHAPE
    assert flags.names() == ["REPRODUCIBLE", "USABLE_DEPEND_ON_SHAPE"]
    assert AlgoAttribute.from_names(flags.names()) == flags
    assert AlgoAttribute.NONE.text() == "-"
    with pytest.raises(ValueError, match="unknown algorithm attribute 'FAST'"):
        AlgoAttribute.from_names(["FAST"])


def test_registry_rejects_duplicates_and_orphans():
    registry = Registry(load_plugins=False)
    registry.register_operator(DoubleOp("fake"))
    with pytest.raises(RegistryError, match="operator 'fake' is already registered"):
        registry.register_operator(DoubleOp("fake"))

    class One(Algorithm):
        operator, name = "fake", "one"

    class Orphan(Algorithm):
        operator, name = "nowhere", "orphan"

    registry.register_algorithm(One())
    with pytest.raises(RegistryError, match="already registered"):
        registry.register_algorithm(One())
    with pytest.raises(RegistryError, match="operator 'nowhere' is not registered"):
        registry.register_algorithm(Orphan())
    assert [a.name for a in registry.algorithms("fake")] == ["one"]


def test_a_broken_plugin_is_reported_and_the_others_still_load(monkeypatch, caplog):
    class EntryPoint:
        def __init__(self, name, function):
            self.name, self.value, self._function = name, f"{name}:register", function

        def load(self):
            return self._function

    def broken(registry):
        raise ImportError("missing compiler")

    def good(registry):
        registry.register_operator(DoubleOp("good"))

    monkeypatch.setattr("fastrun.registry.entry_points",
                        lambda group: [EntryPoint("broken", broken), EntryPoint("good", good)])
    registry = Registry()
    assert registry.operators() == ["good"]
    assert registry.plugin_errors == {"broken": "ImportError: missing compiler"}
    assert "fastrun plugin 'broken' (broken:register) failed to load" in caplog.text


def test_cpu_category_names_what_changes_timings(monkeypatch):
    monkeypatch.delenv("FASTRUN_NUM_THREADS", raising=False)
    category = CPUDevice(1).category
    fields = category.split(";")
    assert fields[0] == "cpu" and "threads=1" in fields
    assert re.fullmatch(r"isa=(x86-64-v[1-4]|aarch64.*|\w+)", fields[2])
    assert any(f.startswith("numpy=") for f in fields)
    assert any(f.startswith("blas=") for f in fields)
    assert any(f.startswith("numba=") and f != "numba=none" for f in fields)
    assert CPUDevice(1).category != CPUDevice(2).category
    monkeypatch.setenv("FASTRUN_NUM_THREADS", "2")
    assert "threads=2" in get_device("cpu").category.split(";")
    cpus = os.cpu_count()
    for wrong in (0, -1, cpus + 1, 100_000):
        with pytest.raises(ValueError, match=f"thread count {wrong} is not between 1 and"):
            get_device(f"cpu:{wrong}")


def test_device_specs():
    assert get_device("cpu:2").threads == 2
    with pytest.raises(ValueError,
                       match="unknown device kind 'tpu': the installed kinds are cpu, opencl"):
        get_device("tpu")
    with pytest.raises(ValueError, match="bad device 'cpu:x'"):
        get_device("cpu:x")
    with pytest.raises(ValueError, match="expected PLATFORM:DEVICE"):
        get_device("opencl:1")
    # the one reading of a spec's shape (get_device, the tune's device list, Ray's actors)
    from fastrun.devices import split_spec

    assert split_spec("OpenCL:0:1 ") == ("opencl", "0:1")
    assert split_spec("cpu:4") == ("cpu", "4") and split_spec(None) == ("cpu", "")
    assert split_spec("opencl") == ("opencl", "")
