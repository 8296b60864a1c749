"""fastrun's compute library: operators and algorithms registered into fastrun as a plugin."""

import os

# numba's OpenMP threads busy-wait after a parallel region; the next BLAS call then competes
# with them for the cores and runs up to 4x slower (measured: 30 us -> 118 us for a
# 100x300x70 sgemm right after a blocked kernel).  That would make every measurement that
# follows a numba kernel wrong, in profiling and in production alike.  Passive waiting must be
# set before the OpenMP runtime starts, i.e. before the first parallel kernel runs; a value the
# user set is respected.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")


def register(registry) -> None:
    """Entry point of the ``fastrun.plugins`` group: add every operator and algorithm."""
    from fastrun_algorithms import matmul

    matmul.register(registry)
