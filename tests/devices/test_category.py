"""Tests of fastrun.category: categories as named facts, one module for building, reading,
matching and printing them."""

from __future__ import annotations

import pytest

from fastrun import category
from fastrun.category import Category, CategoryError
from fastrun.devices.cpu import CPUDevice

CPU = ("cpu;processor=Intel Xeon;isa=x86-64-v4;threads=16;numpy=2.4.6;blas=openblas-0.3;"
       "blas_threads=1;numba=0.68.1;vectors=512;layer=tbb")


def test_text_and_facts_round_trip() -> None:
    parsed = category.parse(f"{CPU}|conv@6")
    assert parsed.kind == "cpu" and parsed.operator == "conv" and parsed.algorithms == "6"
    facts = parsed.facts()
    assert facts["processor"] == "Intel Xeon" and facts["threads"] == "16"
    assert facts["operator"] == "conv" and facts["algorithms"] == "6"
    assert Category.from_facts(facts) == parsed
    assert Category.from_facts(facts).text == f"{CPU}|conv@6"
    assert category.split(f"{CPU}|conv@6") == (CPU, "conv@6")
    assert category.operator_of(f"{CPU}|conv@6") == "conv"
    assert category.operator_of("no operator part") is None


def test_this_machines_category_parses_back_to_its_facts() -> None:
    text = category.text(CPUDevice(1).category, "matmul", 4)
    facts = category.parse(text).facts()
    assert facts["device"] == "cpu" and facts["threads"] == "1"
    assert {"processor", "isa", "blas", "numba", "layer"} <= set(facts)
    assert Category.from_facts(facts).text == text


def test_format1_strings_are_read_with_their_facts_named() -> None:
    old_cpu = "cpu;Intel Xeon;x86-64-v4;threads=16;numba=0.68.1|conv@6|format=1"
    assert category.normalize(old_cpu) == (
        "cpu;processor=Intel Xeon;isa=x86-64-v4;threads=16;numba=0.68.1|conv@6")
    old_gpu = "opencl;platform=NVIDIA CUDA;device=NVIDIA H100;driver=580.1|matmul@2|format=1"
    facts = category.parse(old_gpu).facts()
    assert facts["device"] == "opencl" and facts["model"] == "NVIDIA H100"
    assert facts["driver"] == "580.1"


def test_values_are_cleaned_and_bad_maps_refused() -> None:
    assert category.clean(" a|b;c \n d ") == "a/b,c d"
    assert category.clean("x\x1b[2Jy") == "x?[2Jy"
    assert len(category.clean("v" * 10_000)) == category.MAX_VALUE
    for bad, message in [
        ([1, 2], "map of facts"),
        ({"operator": "conv", "algorithms": "1"}, "'device'"),
        ({"device": "cpu", "operator": "conv"}, "'algorithms'"),
        ({"device": "cpu", "operator": "conv", "algorithms": "1", "bad name!": "x"}, "name"),
        ({"device": "cpu", "operator": "conv", "algorithms": "1", "threads": "1|2"}, "value"),
        ({"device": "cpu", "operator": "conv", "algorithms": "1", "threads": [1]}, "value"),
    ]:
        with pytest.raises(CategoryError, match=message):
            Category.from_facts(bad)


def test_differences_say_which_fact_and_what_each_side_has() -> None:
    cached = f"{CPU}|conv@6"
    here = cached.replace("threads=16", "threads=2").replace("numba=0.68.1", "numba=0.69.0")
    found = category.differences(category.parse(cached), category.parse(here))
    assert [str(d) for d in found] == ["threads 16 (cache) vs 2 (this device)",
                                       "numba 0.68.1 (cache) vs 0.69.0 (this device)"]
    assert category.explain([cached, "cpu;processor=Other|matmul@4"], here) == (
        "threads 16 (cache) vs 2 (this device); numba 0.68.1 (cache) vs 0.69.0 (this device)")
    assert category.explain([cached], cached) is None  # it applies
    assert category.explain(["cpu;processor=x|matmul@4"], here) is None  # nothing for conv
    newer_set = cached.replace("conv@6", "conv@7")
    assert category.explain([cached], newer_set) == "algorithms 6 (cache) vs 7 (this device)"
    missing = cached.replace(";layer=tbb", "")
    assert category.explain([missing], cached) == "layer (not stated) (cache) vs tbb (this device)"


def test_the_closest_category_is_the_one_with_fewest_differences() -> None:
    here = f"{CPU}|conv@6"
    far = here.replace("threads=16", "threads=1").replace("isa=x86-64-v4", "isa=x86-64-v3")
    near = here.replace("layer=tbb", "layer=omp")
    best, found = category.closest([far, near], here)
    assert best == near and [d.fact for d in found] == ["layer"]


def test_printable_escapes_control_characters() -> None:
    assert category.printable("key\x1b[2J\r\n\x07ok") == "key\\x1b[2J\\r\\n\\x07ok"
    assert category.printable("float32[1x3x224x224]") == "float32[1x3x224x224]"
