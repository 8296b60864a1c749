"""A reader that stops early (``fastrun cache show F | head -1``) is not an error.

When the reading end of standard output closes, the next write raises BrokenPipeError; the
command stops quietly with status 141 (128 + SIGPIPE, what a shell reports for a program killed
by the signal), and standard output is pointed at /dev/null so that Python's final flush does
not raise again while exiting.
"""

from __future__ import annotations

import os
import sys

#: 128 + SIGPIPE
STATUS = 141


def closed() -> int:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return STATUS
