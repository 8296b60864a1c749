"""A device whose timings are replayed from a recording: searches without the noise.

Why: whether a change to the search (its order, early stopping, confirmation, the pick) makes
the decisions it should cannot be told from live timings, which move 10-40% between runs on a
shared machine.  Given the times a ranking recorded, a search must pick exactly the recorded
winner, every time.  This is Kernel Tuner's simulation mode: its runner reads a cache of
measured configurations back instead of timing them.

How: :class:`SimulatedDevice` wraps a real device and forwards everything to it but
:meth:`SimulatedDevice.measure`.  The profiler says what it is timing
(:data:`fastrun.devices.measuring`); for a recorded problem the call still runs (its output is
checked as in any search), and its recorded time is returned in place of the clock's.  A
candidate of a recorded problem that the recording has no time for raises
:class:`NotRecordedError`, so the search reports it as failed, naming it.  Problems the
recording does not hold at all (a conv's matmul sub-problems) are timed for real, or refused
with ``unrecorded="error"``.

The recording is a plain mapping, so that this module needs nothing above the devices;
``fastrun.analysis.rankings.recorded_times`` makes one from a rankings file.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fastrun.devices import Device, measuring

T = TypeVar("T")

#: (operator, problem key) -> {algorithm desc text: seconds}
Recording = Mapping[tuple[str, str], Mapping[str, float]]


class NotRecordedError(LookupError):
    """The search timed something the recording has no time for."""


class SimulatedDevice(Device):
    """``device`` with its timings of the recorded problems replayed from ``recording``.

    ``unrecorded``: what a timed call of a problem the recording lacks gets, ``"measure"``
    (the device's own clock) or ``"error"`` (:class:`NotRecordedError`)."""

    def __init__(self, device: Device, recording: Recording, unrecorded: str = "measure"):
        if unrecorded not in ("measure", "error"):
            raise ValueError(f"unrecorded must be 'measure' or 'error', got {unrecorded!r}")
        self.device = device
        self.times = {key: dict(times) for key, times in recording.items()}
        self.unrecorded = unrecorded
        #: timed calls answered from the recording, and by the device's clock
        self.replayed = 0
        self.measured = 0

    def measure(self, function: Callable[[], T]) -> tuple[int, T]:
        what = measuring.get()
        times = None if what is None else self.times.get(what[:2])
        if times is None:
            if what is not None and self.unrecorded == "error":
                raise NotRecordedError(f"the recording holds no times for {what[0]} {what[1]}")
            self.measured += 1
            return self.device.measure(function)
        seconds = times.get(what[2])
        if seconds is None:
            raise NotRecordedError(f"{what[2]} has no recorded time for {what[0]} {what[1]} "
                                   f"(recorded: {', '.join(sorted(times))})")
        _, value = self.device.measure(function)
        self.replayed += 1
        return round(seconds * 1e9), value

    # Everything else is the wrapped device's.
    kind = property(lambda self: self.device.kind)
    host_memory = property(lambda self: self.device.host_memory)
    category = property(lambda self: self.device.category)
    spec = property(lambda self: self.device.spec)

    def __getattr__(self, name: str) -> Any:  # a backend's own attributes
        return getattr(self.device, name)

    def __str__(self) -> str:
        return f"{self.device} (simulated: {len(self.times)} recorded problems)"


def _forward(name: str) -> Callable[..., Any]:
    def method(self: SimulatedDevice, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.device, name)(*args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"The wrapped device's ``{name}``."
    return method


# Every public method of the Device protocol but measure, read from the protocol itself, so
# that a method added there later is forwarded too rather than answered by its default.
for _name, _member in vars(Device).items():
    if inspect.isfunction(_member) and not _name.startswith("_") and _name != "measure":
        setattr(SimulatedDevice, _name, _forward(_name))
