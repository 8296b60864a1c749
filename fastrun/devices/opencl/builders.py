"""Helper processes that compile a search's OpenCL programs several at once.

A search on a GPU builds hundreds of kernel configurations, and NVIDIA's driver compiles one
program at a time per process: on an H200 (driver 580) sixteen ``cl_igemm`` programs took
3.4 s one after another and 2.8 s from eight threads, but 0.4 s from eight processes, and the
searching process then loaded each binary they returned in well under a millisecond (the
driver's own cache already held the machine code).  ``benchmarks/probe_cl_build.py`` measures
it.

So while :meth:`OpenCLDevice.parallel_builds` is open, a program the device lacks is compiled by
one of these helpers first.  Each helper is ``python -m fastrun.devices.opencl.builders P D``:
a process of its own (not a multiprocessing child, which would import the user's main script
again) that opens the same device with pyopencl and answers requests on its stdin with the
compiled binary on its stdout (msgpack, each message after its length).  A helper that cannot
compile a program, or dies, only costs time: the device then builds from source itself, which
is also where a compiler error is reported with its log.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Sequence
from typing import Any, BinaryIO

import msgpack

log = logging.getLogger(__name__)


class HelperError(RuntimeError):
    """A build helper could not start, or stopped answering."""


def _send(pipe: BinaryIO, value: Any) -> None:
    data = msgpack.packb(value)
    pipe.write(len(data).to_bytes(8, "little") + data)
    pipe.flush()


def _receive(pipe: BinaryIO) -> Any:
    """The next message; EOFError at the end of the stream (a pipe's read of n bytes waits
    for all n, so the length comes first)."""
    head = pipe.read(8)
    if len(head) < 8:
        raise EOFError("the pipe closed")
    size = int.from_bytes(head, "little")
    data = pipe.read(size)
    if len(data) < size:
        raise EOFError("the pipe closed mid-message")
    return msgpack.unpackb(data, raw=False)


class _Helper:
    """One helper process and its two pipes."""

    def __init__(self, platform_index: int, device_index: int):
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(platform_index), str(device_index)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._ready = False

    def _gone(self, error: Exception) -> HelperError:
        return HelperError(f"build helper {self.process.pid} is gone (exit code "
                           f"{self.process.poll()}): {error}")

    def _answer(self) -> Any:
        try:
            return _receive(self.process.stdout)
        except (EOFError, OSError, ValueError) as error:
            raise self._gone(error) from None

    def compile(self, source: str, options: Sequence[str]) -> bytes | None:
        if not self._ready:  # the first answer says whether the helper opened the device
            status = self._answer()
            if status != "ready":
                raise HelperError(f"build helper {self.process.pid} could not start: {status}")
            self._ready = True
        try:
            _send(self.process.stdin, [source, list(options)])
        except OSError as error:
            raise self._gone(error) from None
        return self._answer()

    def stop(self) -> None:
        try:
            self.process.stdin.close()  # the helper's loop ends at the end of its input
            self.process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()


class BuildHelpers:
    """Helper processes for one OpenCL device, started on the first request and stopped by
    :meth:`close`.  Each thread that asks for a binary takes an idle helper (waiting for one
    if all are busy), so as many programs compile at once as there are helpers."""

    def __init__(self, platform_index: int, device_index: int, processes: int):
        self.platform_index = platform_index
        self.device_index = device_index
        self.processes = processes
        self._changed = threading.Condition()
        self._helpers: list[_Helper] = []
        self._idle: list[_Helper] = []
        self._broken = False

    def binary(self, source: str, options: Sequence[str]) -> bytes | None:
        """The compiled program from a helper; None when it did not compile there or the
        helpers are gone (the caller then builds it itself)."""
        helper = self._take()
        if helper is None:
            return None
        try:
            binary = helper.compile(source, options)
        except HelperError as error:
            self._give_up(error)
            return None
        with self._changed:
            self._idle.append(helper)
            self._changed.notify()
        return binary

    def _take(self) -> _Helper | None:
        with self._changed:
            if not self._helpers and not self._broken:
                try:
                    for _ in range(self.processes):
                        self._helpers.append(_Helper(self.platform_index, self.device_index))
                except OSError as error:
                    self._broken = True
                    log.warning("cannot start OpenCL build helpers (%s); programs are built "
                                "in this process", error)
                self._idle = list(self._helpers)
            while not self._idle and not self._broken:
                self._changed.wait()
            return None if self._broken else self._idle.pop()

    def _give_up(self, error: Exception) -> None:
        with self._changed:
            if not self._broken:
                log.warning("OpenCL build helpers stopped (%s); programs are built in this "
                            "process from now on", error)
            self._broken = True
            self._changed.notify_all()
        self.close()

    def close(self) -> None:
        """Stop the helpers (each holds a context on the device)."""
        with self._changed:
            helpers, self._helpers, self._idle = self._helpers, [], []
        for helper in helpers:
            helper.stop()


def _serve(platform_index: int, device_index: int, requests: BinaryIO,
           answers: BinaryIO) -> None:
    """A helper's loop: the device opened, then one binary (or None) per request."""
    import pyopencl as cl

    from fastrun.devices.opencl import _platform_devices

    warnings.simplefilter("ignore")  # compiler chatter: the searching process reports builds

    try:
        device = _platform_devices(cl)[platform_index][1][device_index]
        context = cl.Context([device])
    except Exception as error:  # reported by the first compile request
        _send(answers, f"{type(error).__name__}: {error}")
        return
    _send(answers, "ready")
    while True:
        try:
            source, options = _receive(requests)
        except EOFError:  # the searching process closed the pipe: done
            return
        try:
            program = cl.Program(context, source).build(options=options, devices=[device])
            _send(answers, program.get_info(cl.program_info.BINARIES)[0])
        except cl.Error:  # the searching process builds it again and reports the log
            _send(answers, None)


def main(argv: Sequence[str]) -> None:
    # the answers go to a private copy of stdout; anything a library prints goes to stderr
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _serve(int(argv[0]), int(argv[1]), sys.stdin.buffer, answers)


if __name__ == "__main__":
    main(sys.argv[1:])
