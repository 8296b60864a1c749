"""numba's vector width: 512-bit kernels on AVX-512 processors unless the user says otherwise."""

import json
import os
import re
import subprocess
import sys

import pytest

from fastrun.devices.cpu import CPUDevice, vectors
from fastrun.devices.cpu.vectors import cpu_model_and_flags

AVX512 = "avx512f" in cpu_model_and_flags()[1]

#: Compiles register_tiled's kernel as numba would for an Intel Sapphire Rapids core (whose LLVM
#: tuning prefers 256-bit vectors), then counts the multiply-adds on 512- and 256-bit registers.
_PROBE = """
import json, re, numpy as np
import numba.core.config
numba.core.config.CPU_NAME = "sapphirerapids"
import fastrun
from fastrun.registry import Registry
Registry().operators()  # loads the library, which sets the width before anything compiles
from fastrun_algorithms.matmul import register_tiled
kernel = register_tiled._compiled(np.dtype("float32"), "C", "C")
a = np.ones((1, 32, 32), np.float32)
kernel(a, a, np.empty_like(a))
asm = "\\n".join(kernel.inspect_asm().values())
print(json.dumps({width: len(re.findall(r"vfmadd\\w+\\s+[^\\n]*" + width, asm))
                  for width in ("zmm", "ymm")}))
"""


def _fma_registers(tmp_path, **env: str) -> dict[str, int]:
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("FASTRUN_VECTOR_BITS", *vectors.NUMBA_VARIABLES)}
    environment.update(env, NUMBA_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", _PROBE], env=environment, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(not AVX512, reason="the processor has no AVX-512")
def test_kernels_use_512_bit_vectors_where_llvm_would_prefer_256(tmp_path):
    wide = _fma_registers(tmp_path)
    assert wide["zmm"] > 0 and wide["ymm"] == 0, wide
    narrow = _fma_registers(tmp_path, FASTRUN_VECTOR_BITS="256")
    assert narrow["zmm"] == 0 and narrow["ymm"] > 0, narrow


def test_the_category_records_the_width(monkeypatch):
    for name in ("FASTRUN_VECTOR_BITS", *vectors.NUMBA_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    expected = "512" if AVX512 else "auto"
    assert f";vectors={expected}" in CPUDevice(1).category
    monkeypatch.setenv("FASTRUN_VECTOR_BITS", "auto")
    assert ";vectors=auto" in CPUDevice(1).category
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+avx2")
    assert ";vectors=numba-user" in CPUDevice(1).category


def test_a_bad_setting_is_named(monkeypatch):
    monkeypatch.setenv("FASTRUN_VECTOR_BITS", "1024")
    with pytest.raises(ValueError, match=re.escape("FASTRUN_VECTOR_BITS='1024'")):
        _ = CPUDevice(1).category
