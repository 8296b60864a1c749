"""Keep the CPU's thread pools from fighting over the cores, so that timings are stable.

Fast Run rests on one premise: an algorithm's time does not depend on what ran before it.  Two
thread pools share the cores here, numba's (OpenMP layer) and OpenBLAS's, and both busy-wait
after their work by default.  Measured on a 2-core machine:

* numba's OpenMP workers spinning after a parallel region made the next sgemm (100x300x70) run
  4x slower (30 us -> 118 us).  ``OMP_WAIT_POLICY=passive`` removes it.
* OpenBLAS's workers spin for 2^28 cycles (~0.1 s) after a call; a numba kernel started in that
  window sometimes waited a scheduler slice (2-8 ms instead of ~150 us).  Spinning for 2^20
  cycles (``OPENBLAS_THREAD_TIMEOUT=20``, ~0.4 ms) removed the stalls in 60 of 60 trials and
  kept back-to-back BLAS calls as fast as before (31.5 us for 128^3).

Both variables are read when the runtimes start, so they are set here, when ``fastrun`` is
imported, before numpy loads OpenBLAS.  A value the user set is kept.  A program that imports
numpy before fastrun should set them itself (see docs/performance.md).
"""

import os

DEFAULTS = {
    "OMP_WAIT_POLICY": "passive",
    "OPENBLAS_THREAD_TIMEOUT": "20",
}

for _name, _value in DEFAULTS.items():
    os.environ.setdefault(_name, _value)
