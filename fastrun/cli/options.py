"""The command line's shared pieces: the search flags (``fastrun profile`` and
``load_and_run`` take the same ones, with MegEngine's meaning) and the timing loop
(``load_and_run`` and ``fastrun report --model`` time a model the same way).

Why a module of their own: each command imports these, and none imports another command, so
the commands form no import circle (``tests/test_layering.py``).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from fastrun import config
from fastrun.cli import unsaved

T = TypeVar("T")


def argument_type(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type from a parser that raises ValueError: its message becomes the usage
    error argparse prints."""
    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


#: sizes such as 64MiB (``config.parse_size``)
parse_size = argument_type(config.parse_size)


def parse_budget(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(
            f"bad budget {text!r}: expected a positive number of seconds, e.g. 0.2")
    return value


def add_search_limits(parser: argparse.ArgumentParser) -> None:
    """What a search may spend: timed repeats per candidate, and workspace (every command that
    searches: load_and_run's and profile's strategy flags, and tune)."""
    parser.add_argument("--budget", type=parse_budget, default=None, metavar="SECONDS",
                        help="timed repeats per candidate (default 0.2 s, FASTRUN_PROFILE_SECONDS)")
    parser.add_argument("--workspace-limit", type=parse_size, default=None,
                        metavar="SIZE", help="workspace limit, e.g. 64MiB (default: unlimited)")


def add_strategy_arguments(parser: argparse.ArgumentParser) -> None:
    """The search flags, with MegEngine's load_and_run meaning."""
    search = parser.add_mutually_exclusive_group()
    search.add_argument("--fast-run", action="store_true",
                        help="profile every usable non-NAIVE algorithm on a cache miss")
    search.add_argument("--full-run", action="store_true",
                        help="profile every usable algorithm, NAIVE included, on a cache miss")
    parser.add_argument("--reproducible", action="store_true",
                        help="choose only REPRODUCIBLE algorithms")
    parser.add_argument("--algo-policy", "--fast-run-algo-policy", dest="algo_policy",
                        metavar="FILE",
                        help="cache file; alone: read it and use heuristics for misses; with "
                             "--fast-run/--full-run: search what is missing, saving as it goes")
    add_search_limits(parser)
    parser.add_argument("--nearest", type=parse_distance, default=None, metavar="DISTANCE",
                        help="without a search, serve a problem the cache lacks from the "
                             "nearest measured one within this shape distance (default 1.0, "
                             "FASTRUN_NEAREST: one axis doubled; 0: never; docs/fleet.md)")
    unsaved.add_argument(parser)


def parse_distance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a distance: expected a number >= 0 "
                                         "(0 turns nearest serving off)")
    return value


def strategy_from(args: argparse.Namespace) -> str:
    words = ["fast-run" if args.fast_run else "full-run" if args.full_run else "heuristic"]
    if args.reproducible:
        words.append("reproducible")
    return "+".join(words)


class TimingInterrupted(KeyboardInterrupt):
    """Ctrl-C during the timed iterations, carrying what was timed before it (a Ctrl-C all
    the same to code that does not look)."""

    def __init__(self, outputs: dict[str, np.ndarray], totals: list[float],
                 step_times: list[list[float]]):
        super().__init__()
        self.outputs, self.totals, self.step_times = outputs, totals, step_times


def time_iterations(model, feeds, iterations: int, warmup: int, per_step: bool,
                    duration: float | None = None,
                    ) -> tuple[dict[str, np.ndarray], list[float], list[list[float]]]:
    """``iterations`` timed runs after ``warmup`` untimed ones, or as many as fit in
    ``duration`` seconds (at least one): what `load_and_run` and `fastrun report --model`
    time.  A Ctrl-C raises :class:`TimingInterrupted` with the iterations timed so far."""
    outputs = {}
    for _ in range(warmup):
        outputs = model.run(feeds)
    totals, step_times = [], []
    ends = None if duration is None else time.perf_counter() + duration
    try:
        while (len(totals) < iterations) if ends is None else (
                not totals or time.perf_counter() < ends):
            started = time.perf_counter()
            if per_step:
                outputs, times = model.run_timed(feeds)
                step_times.append(times)
            else:
                outputs = model.run(feeds)
            totals.append(time.perf_counter() - started)
    except KeyboardInterrupt:
        raise TimingInterrupted(outputs, totals, step_times) from None
    return outputs, totals, step_times
