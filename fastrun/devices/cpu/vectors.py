"""The vector width numba compiles CPU kernels for: the full 512 bits on AVX-512 processors.

LLVM, and so numba, tunes code for the processor it runs on, and for most Intel cores with
AVX-512 (Skylake-SP through Sapphire Rapids and later) that tuning says *prefer 256-bit
vectors*: a loop over float32 then moves 8 values per instruction where the core could move
16.  The peers do not hold back (onnxruntime's MLAS and oneDNN select 512-bit kernels on these
parts), and neither should fastrun: compiled for Sapphire Rapids, the ``register_tiled`` matmul
kernel's multiply-adds were all on 256-bit ``ymm`` registers, and with the preference turned
off all on 512-bit ``zmm`` ones (``tests/devices/test_vectors.py``).  AMD's Zen 4 and Zen 5
get 512-bit code from LLVM already.

The setting is ``FASTRUN_VECTOR_BITS``:

* ``512`` (the default): on a processor with AVX-512F, numba compiles with LLVM's
  ``prefer-256-bit`` tuning turned off;
* ``256``: with it turned on (LLVM's choice for many Intel cores, and a way to compare);
* ``auto``: LLVM's own choice for the processor.

It must be made before numba builds its code generator, which happens at the first
compilation of the process; :func:`configure_numba` does it and is called by the compute
library when it registers (before any of its kernels compiles).  A user who set
``NUMBA_CPU_NAME`` or ``NUMBA_CPU_FEATURES`` decided for numba: fastrun leaves both alone.

The choice changes every kernel's speed, so it is a fact of the CPU device's category
(``vectors=...``): a cache searched with 256-bit kernels is not reused by 512-bit ones.
"""

from __future__ import annotations

import functools
import logging
import os
import platform

from fastrun.devices.cpu.settings import VECTOR_BITS

log = logging.getLogger(__name__)

#: LLVM's x86 tuning feature that makes the vectoriser stop at 256 bits.
PREFER_256 = "prefer-256-bit"
#: numba's own variables for its target: set by the user, they win over FASTRUN_VECTOR_BITS.
NUMBA_VARIABLES = ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES")


def cpu_model_and_flags() -> tuple[str, set[str]]:
    """The processor's model name and feature flags (``/proc/cpuinfo``; the platform's name
    and no flags where it cannot be read): what the CPU category and the vector width are
    decided from."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                name, _, value = line.partition(":")
                name = name.strip()
                if name in ("model name", "Hardware", "CPU part") and not model:
                    model = value.strip()
                elif name in ("flags", "Features") and not flags:
                    flags = set(value.split())
                if model and flags:
                    break
    except OSError:
        pass
    return model or platform.processor() or platform.machine() or "unknown", flags


@functools.cache
def _has_avx512() -> bool:
    """Read once: the category asks on every lookup, /proc/cpuinfo is long on many cores."""
    return "avx512f" in cpu_model_and_flags()[1]


def category_fact() -> str:
    """What numba compiles for, as the CPU category records it (without importing numba):
    ``512``/``256`` when fastrun sets the preference, ``auto`` when LLVM chooses, ``numba-user``
    when the user configured numba's target."""
    if any(os.environ.get(name) for name in NUMBA_VARIABLES):
        return "numba-user"
    bits = VECTOR_BITS.get()
    return bits if bits != "auto" and _has_avx512() else "auto"


def _features(bits: str) -> str:
    from llvmlite import binding

    host = binding.get_host_cpu_features().flatten()
    kept = [f for f in host.split(",") if f and f.lstrip("+-") != PREFER_256]
    kept.append(("-" if bits == "512" else "+") + PREFER_256)
    return ",".join(kept)


def configure_numba() -> str:
    """Apply ``FASTRUN_VECTOR_BITS`` to numba's code generation; returns :func:`category_fact`.

    Idempotent.  Too late once numba has compiled something in this process: then the
    kernels keep LLVM's choice, a warning says so, and the category still says what was asked
    (so make the first numba compilation of a process fastrun's, e.g. create a session first).
    """
    fact = category_fact()
    if fact in ("auto", "numba-user"):
        return fact
    import numba.core.config as numba_config
    from numba.core.registry import cpu_target

    wanted = _features(fact)
    if wanted == numba_config.CPU_FEATURES:
        return fact
    if "_toplevel_target_context" in vars(cpu_target):
        log.warning("numba compiled code before fastrun could set its vector width "
                    "(FASTRUN_VECTOR_BITS=%s); kernels keep LLVM's default width", fact)
        return fact
    numba_config.CPU_FEATURES = wanted
    return fact

