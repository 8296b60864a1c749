"""fastrun's compute library: operators and algorithms registered into fastrun as a plugin.

Thread-pool settings that keep numba's and OpenBLAS's threads from slowing each other down are
made by ``fastrun`` itself (``fastrun/devices/cpu/threads.py``), before numpy is loaded.
"""


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
    tensor.register(registry)
    layout.register(registry)
