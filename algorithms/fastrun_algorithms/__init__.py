"""fastrun's compute library: operators and algorithms registered into fastrun as a plugin.

Thread-pool settings that keep numba's and OpenBLAS's threads from slowing each other down are
made by ``fastrun`` itself (``fastrun/devices/cpu/threads.py``), before numpy is loaded.

Importing the package first deletes numba's cached kernels under it if any of its sources
changed since they were cached (``fastrun.numba_cache.sweep_stale_kernels``): kernels inline
helpers from other files, which numba's own check of a kernel's file does not see.
"""

import os as _os

from fastrun import numba_cache as _numba_cache

_numba_cache.sweep_stale_kernels(_os.path.dirname(__file__))


def register(registry) -> None:
    """Entry point of the ``fastrun.plugins`` group: add every operator and algorithm.

    numba's vector width is set first (``fastrun.devices.cpu.vectors``), before any kernel
    compiles."""
    from fastrun.devices.cpu import vectors

    vectors.configure_numba()
    from fastrun_algorithms import (
        activation,
        conv,
        conv_transpose,
        elementwise,
        layout,
        linear,
        matmul,
        pooling,
        reduce,
        resize,
        squeeze_excite,
        tensor,
    )

    matmul.register(registry)
    linear.register(registry)
    conv.register(registry)
    conv_transpose.register(registry)
    elementwise.register(registry)
    activation.register(registry)
    pooling.register(registry)
    reduce.register(registry)
    resize.register(registry)
    squeeze_excite.register(registry)
    tensor.register(registry)
    layout.register(registry)
