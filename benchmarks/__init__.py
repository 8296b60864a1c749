"""Benchmark scripts, run as ``python -m benchmarks.NAME``.

Importing the package applies fastrun's thread-pool defaults
(``fastrun.devices.cpu.threads``) before any
script imports numpy: they must be in the environment when OpenBLAS starts, and a script that
imports numpy first would otherwise measure OpenBLAS's default 0.1 s of spinning after every
call, which slows the numba kernel that runs next (up to 2x) and is not how fastrun runs.
"""

import fastrun.devices.cpu.threads  # noqa: F401
