"""A model run on a shared machine uses only the cores other processes leave idle (issue 33,
item 5): with every core of the lent Xeon busy, an empty parallel region of 16 threads cost
3.6-4.0 ms and resnet18 ran 4-9x slower than at one thread."""

from __future__ import annotations

import subprocess
import sys
import time

import numba
import pytest

from fastrun.devices.cpu import CPUDevice
from fastrun.devices.cpu.share import IdleCores, threads_to_use

STAT = """cpu  {total} 0 0 0 0 0 0 0 0 0
cpu0 {c0} 0 0 {i0} 0 0 0 0 0 0
cpu1 {c1} 0 0 {i1} 0 0 0 0 0 0
cpu2 900 0 0 0 0 0 0 0 0 0
intr 1 2 3
"""
SELF = "1234 (python3 (a) b) R 1 2 3 4 5 6 7 8 9 10 {utime} {stime} 0 0 20 0 4 0 5"


class FakeProc:
    """/proc/stat and /proc/self/stat as a test sets them, and a clock it moves."""

    def __init__(self) -> None:
        self.now = 100.0
        self.cores = [0, 0]
        self.own = 0

    def read(self, path: str) -> str:
        if path == "/proc/stat":
            return STAT.format(total=sum(self.cores), c0=self.cores[0], c1=self.cores[1],
                               i0=1000 - self.cores[0], i1=1000 - self.cores[1])
        return SELF.format(utime=self.own, stime=0)


def test_the_others_load_is_the_cores_busy_time_less_this_processs_own():
    proc = FakeProc()
    idle = IdleCores({0, 1}, interval_s=0.05, read=proc.read, clock=lambda: proc.now)
    assert idle.update() is None  # one reading: nothing to compare with yet
    proc.now += 1.0
    proc.cores = [100, 60]  # 1.6 cores busy over the second (100 ticks a second)...
    proc.own = 40  # ...0.4 of them this process's
    assert idle.update() is None  # one interval: a load counts once it held over two
    proc.now += 1.0
    proc.cores = [200, 130]  # 1.7 cores busy, 0.3 of them this process's
    proc.own = 70
    assert idle.update() == pytest.approx(1.2)  # the smaller of 1.2 and 1.4
    proc.now += 0.01  # within the interval: the estimate is not read again
    proc.cores = [300, 300]
    assert idle.update() == pytest.approx(1.2)
    proc.now += 1.0
    proc.own = 70  # a second of 2.7 busy cores of others after one of 1.4: 1.4 still
    assert idle.update() == pytest.approx(1.4)


def test_unreadable_files_change_nothing():
    def refuse(path: str) -> str:
        raise OSError("no /proc here")

    idle = IdleCores({0}, read=refuse)
    assert idle.update() is None and idle.update() is None
    assert threads_to_use(8, 8, None) == 8


@pytest.mark.parametrize("others, expected", [(0.0, 16), (0.4, 16), (0.6, 15), (1.2, 15),
                                              (8.0, 8), (15.4, 1), (16.0, 1), (40.0, 1)])
def test_a_run_takes_the_cores_left_idle_and_at_least_one(others, expected):
    assert threads_to_use(16, 16, others) == expected


def test_a_busy_process_squeezed_by_the_run_still_takes_its_core():
    """On 2 cores, beside a run of 2 threads, one busy process gets about two thirds of a
    core: that is a core taken (counting only whole cores left the run at 2 threads, and under
    OpenMP every region then waited for a worker without a core)."""
    assert threads_to_use(2, 2, 2 / 3) == 1
    assert threads_to_use(2, 2, 0.3) == 2


def test_with_every_core_busy_a_run_uses_one_thread_and_the_search_all(monkeypatch):
    monkeypatch.delenv("FASTRUN_SHARE_CORES", raising=False)
    device = CPUDevice(2)
    device.activate()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.3)
        for _ in range(4):
            with device.sharing():
                inside = numba.get_num_threads()
            time.sleep(0.1)
        assert device.shared_threads == 1 and inside == 1
        assert numba.get_num_threads() == 2  # the category's count again after the run
    finally:
        for process in busy:
            process.kill()
            process.wait()


def test_sharing_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("FASTRUN_SHARE_CORES", "0")
    device = CPUDevice(2)
    device.activate()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        for _ in range(3):
            with device.sharing():
                assert numba.get_num_threads() == 2
            time.sleep(0.1)
    finally:
        busy.kill()
        busy.wait()
