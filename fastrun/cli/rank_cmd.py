"""``fastrun rank`` and ``fastrun regress``: record a suite's full algorithm rankings, and check
today's rankings against a recorded baseline with a noise-aware rule (docs/regression.md)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any

from fastrun.cli.formatting import human_bytes, human_seconds

#: Budget of ``fastrun rank`` per candidate when none is given: longer than a search's default
#: repeats nothing useful for cheap problems (repeats stop at 100) and keeps a suite short.
DEFAULT_RANK_BUDGET = 0.05
#: Rounds of ``fastrun rank``: a burst of other work on a shared machine disturbs one round's
#: few milliseconds of a candidate, rarely the same candidate in three rounds.
DEFAULT_ROUNDS = 3


def _session(args: argparse.Namespace):
    from fastrun.api import Session
    from fastrun.cache import InMemoryCache

    # A private in-memory cache: a ranking measures afresh and never changes a user's cache.
    # Early stopping is off unless asked for: a candidate stopped after two runs has a median
    # that moves by 2x between runs, which no regression rule can tell from a real change.
    options: dict[str, Any] = {}
    if not args.early_stop:
        options["early_stop_ratio"] = float("inf")
    return Session(device=args.device, cache=InMemoryCache(), strategy="fast-run",
                   budget_s=args.budget, progress=None if not args.json else False, **options)


def _progress(args: argparse.Namespace):
    if args.json:
        return None

    def report(done: int, total: int, ranked) -> None:
        winner = ranked.winner.algorithm if ranked.winner else "nothing usable"
        print(f"[{done}/{total}] {ranked.label}: {winner}", file=sys.stderr, flush=True)
    return report


def _confirm_progress(args: argparse.Namespace):
    """Progress of :func:`fastrun.analysis.rankings.confirm`: says first why more rounds come."""
    report = _progress(args)
    if report is None:
        return None

    def confirming(done: int, total: int, ranked) -> None:
        if done == 1:
            print(f"confirming: re-measuring the problems that regressed ({total} more "
                  "measurements)", file=sys.stderr, flush=True)
        report(done, total, ranked)
    return confirming


def _ranking_lines(ranked) -> list[str]:
    lines = [f"{ranked.label} (x{ranked.weight})  {ranked.title()}"]
    best = ranked.winner.time_s if ranked.winner else None
    lines.append(f"  {'#':>2} {'algorithm':<30} {'median':>11} {'spread':>9} {'x best':>7} "
                 f"{'repeats':>7} {'workspace':>10}")
    for index, entry in enumerate(ranked.entries, 1):
        spread = f"{entry.relative_spread * 100:.1f}%"
        ratio = f"{entry.time_s / best:.2f}" if best else "-"
        stopped = "  (stopped early)" if entry.early_stopped else ""
        lines.append(f"  {index:>2} {entry.algorithm:<30} {human_seconds(entry.time_s):>11} "
                     f"{spread:>9} {ratio:>7} {entry.repeats:>7} "
                     f"{human_bytes(entry.workspace_bytes):>10}{stopped}")
    for failure in ranked.failures:
        lines.append(f"   - {failure.algorithm:<30} {failure.reason}")
    return lines


def _cmd_rank(args: argparse.Namespace) -> int:
    from fastrun.analysis.rankings import rank
    from fastrun.analysis.suites import get_suite

    session = _session(args)
    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
    suite = get_suite(args.suite, session.registry, session.device.kind)
    rankings = rank(session, suite, progress=_progress(args), rounds=args.rounds)
    rankings.save(args.output)
    if args.json:
        print(json.dumps(rankings.to_dict(), indent=2))
        return 0
    print(f"suite {rankings.suite}: {len(rankings.problems)} problems, budget "
          f"{rankings.budget_s} s per candidate, {rankings.rounds} round(s), device "
          f"{rankings.device}")
    for ranked in rankings.problems:
        print()
        print("\n".join(_ranking_lines(ranked)))
    print(f"\nwrote {args.output}")
    return 0


def _comparison_lines(item, cross_device: bool) -> list[str]:
    verdict = {"regression": "REGRESSION", "ok": "ok", "new": "new (no baseline)",
               "missing": "not measured now"}[item.verdict]
    rho = "-" if item.spearman is None else f"{item.spearman:+.2f}"
    lines = [f"{item.label}  {item.operator}({item.key})",
             f"  winner then {item.winner_then or '-'}, now {item.winner_now or '-'}; "
             f"spearman {rho}; verdict {verdict}"]
    if item.changes:
        header = (f"    {'algorithm':<30} {'reference':<30} {'then':>6} {'now':>6} "
                  f"{'change':>7} {'limit':>6}")
        if not cross_device:
            header += f" {'then s':>10} {'now s':>10}"
        lines.append(header)
        for change in item.changes:
            flag = "  <-- slower" if change.regressed else ""
            line = (f"    {change.algorithm:<30} {change.reference:<30} "
                    f"{change.ratio_then:>6.2f} {change.ratio_now:>6.2f} {change.change:>7.2f} "
                    f"{change.threshold:>6.2f}")
            if not cross_device:
                line += (f" {human_seconds(change.then_s):>10} "
                         f"{human_seconds(change.now_s):>10}")
            lines.append(line + flag)
    lines += [f"  ! {reason}" for reason in item.reasons]
    lines += [f"  . {note}" for note in item.notes]
    return lines


def _cmd_regress(args: argparse.Namespace) -> int:
    from fastrun.analysis.rankings import confirm, load_rankings, rank
    from fastrun.analysis.suites import get_suite

    if args.margin < 0:
        raise ValueError(f"--margin must be >= 0, got {args.margin}")
    if args.rounds is not None and args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
    if args.confirm < 0:
        raise ValueError(f"--confirm must be >= 0, got {args.confirm}")
    if args.processes < 0:
        raise ValueError(f"--processes must be >= 0, got {args.processes}")
    baseline = load_rankings(args.baseline)
    _baseline_conditions(args, baseline)
    session = _session(args)
    _check_threads(baseline.device, session.device.category)
    suite = get_suite(args.suite or baseline.suite, session.registry, session.device.kind)
    current = rank(session, suite, progress=_progress(args), rounds=args.rounds)
    comparison, current = confirm(session, baseline, current, suite, args.margin, args.confirm,
                                  progress=_confirm_progress(args))
    _confirm_in_fresh_processes(args, comparison)
    if args.output:
        current.save(args.output)
    if args.json:
        print(json.dumps(comparison.to_dict(), indent=2))
    else:
        cross = comparison.cross_device
        print(f"baseline {args.baseline}: suite {baseline.suite}, {len(baseline.problems)} "
              f"problems, fastrun {baseline.fastrun_version}")
        if cross:
            print(f"the baseline comes from another device ({baseline.device}; this is "
                  f"{current.device}): only within-run ratios between algorithms are "
                  "compared, never absolute times")
        else:
            print("comparing within-run ratios between algorithms (each algorithm's time over "
                  "a reference algorithm's in the same run); absolute times for information")
        print(f"a change counts when it exceeds the measured spreads plus a margin of "
              f"{args.margin:.0%}\n'then'/'now': time / reference time; 'change': now/then")
        for item in comparison.problems:
            print()
            print("\n".join(_comparison_lines(item, cross)))
        regressions = comparison.regressions
        print()
        if comparison.remeasured:
            held = len(regressions) + len(comparison.cleared_by_processes)
            print(f"{len(comparison.remeasured)} problem(s) regressed at first and were measured "
                  f"{comparison.confirm_rounds} more round(s): {held} confirmed, "
                  f"{len(comparison.remeasured) - held} cleared as noise")
        if comparison.processes_checked:
            print(f"checked in {comparison.processes_checked} fresh process(es): "
                  f"{len(comparison.cleared_by_processes)} cleared, {len(regressions)} held")
        if regressions:
            print(f"REGRESSION in {len(regressions)} of {len(comparison.problems)} problems:")
            for item in regressions:
                for reason in item.reasons:
                    print(f"  {item.label}: {reason}")
            print("if the change is intended, refresh the baseline (docs/regression.md)")
        else:
            print(f"no regression in {len(comparison.problems)} problems")
    return 1 if comparison.regressions else 0


#: Fresh processes a regression must also show in (``--processes``).  A process of
#: unchanged code sometimes runs a kernel at another speed for its whole life: on the 2-core
#: VM, ``register_tiled`` on the ci suite's 8x(32x32) product took 29 us in some processes
#: and 45-50 us in others, minutes apart, in old and new code alike, which rounds inside one
#: process cannot clear.
DEFAULT_PROCESSES = 2


def _confirm_in_fresh_processes(args: argparse.Namespace, comparison: Any) -> None:
    """Re-run the check in up to ``args.processes`` child processes while regressions remain;
    a problem stays regressed only if it regressed in each of them too, else it is cleared
    with a note.  A child that fails to give a verdict leaves the regression standing."""
    regressed = {item.label for item in comparison.regressions}
    if not regressed or args.processes < 1:
        return
    command = [sys.executable, "-m", "fastrun.cli.main", "regress", "--baseline", args.baseline,
               "--margin", str(args.margin), "--confirm", str(args.confirm), "--device",
               args.device, "--budget", str(args.budget), "--rounds", str(args.rounds),
               "--processes", "0", "--json", *(["--suite", args.suite] if args.suite else []),
               *(["--early-stop"] if args.early_stop else [])]
    if not args.json:
        print(f"confirming in fresh processes: {len(regressed)} problem(s) regressed in this "
              f"one (up to {args.processes} more processes)", flush=True)
    checked = 0
    for _ in range(args.processes):
        done = subprocess.run(command, capture_output=True, text=True)
        try:
            verdict = json.loads(done.stdout)
        except ValueError:
            return  # no verdict: what this process found stands
        regressed &= {item["label"] for item in verdict["problems"]
                      if item["verdict"] == "regression"}
        checked += 1
        if not regressed:
            break
    for item in comparison.regressions:
        if item.label not in regressed:
            item.verdict = "ok"
            item.notes.append("cleared in a fresh process: this process ran the kernels at "
                              "another speed, not the code")
            comparison.cleared_by_processes.append(item.label)
    comparison.processes_checked = checked


def _baseline_conditions(args: argparse.Namespace, baseline: Any) -> None:
    """Measure as the baseline was measured where the user did not say otherwise: its
    thread count, budget and rounds (a baseline of one thread ranked with all cores reads as
    regressions of every parallel kernel)."""
    from fastrun import category

    facts = dict(category.parse_device(baseline.device))
    if args.device is None:
        threads = facts.get("threads")
        args.device = (f"cpu:{threads}" if facts.get("device") == "cpu" and threads
                       else facts.get("device") or "cpu")
    if args.budget is None:
        args.budget = baseline.budget_s
    if args.rounds is None:
        args.rounds = baseline.rounds


def _check_threads(baseline: str, here: str) -> None:
    """A baseline recorded at another thread count is a different measurement, not a
    regression: refuse it, naming the flag that matches it."""
    from fastrun import category

    then = dict(category.parse_device(baseline))
    now = dict(category.parse_device(here))
    differing = {name for name in then.keys() | now.keys() if then.get(name) != now.get(name)}
    if differing == {"threads"}:  # the same machine and libraries: only the threads differ
        raise ValueError(f"the baseline was recorded with threads={then['threads']} and this run "
                         f"uses threads={now['threads']}: a different measurement, not a "
                         f"regression; use --device cpu:{then['threads']} (or leave --device "
                         "out: regress then uses the baseline's)")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def _common(parser: argparse.ArgumentParser, from_baseline: bool = False) -> None:
    default = "the baseline's" if from_baseline else None
    parser.add_argument("--budget", type=_positive,
                        default=None if from_baseline else DEFAULT_RANK_BUDGET,
                        metavar="SECONDS", help="timed repeats per candidate (default "
                        f"{default or DEFAULT_RANK_BUDGET})")
    device_default = f"{default} kind and thread count" if default else "cpu"
    parser.add_argument("--device", default=None if from_baseline else "cpu",
                        help=f"device (default {device_default})")
    parser.add_argument("--early-stop", action="store_true",
                        help="stop timing clearly slower candidates early, as a search does "
                             "(faster, but their times rest on two runs)")
    parser.add_argument("--rounds", type=int, default=None if from_baseline else DEFAULT_ROUNDS,
                        metavar="N", help="measure the suite N times and keep each algorithm's "
                        f"fastest round (default {default or DEFAULT_ROUNDS})")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def add_parser(commands: Any) -> None:
    """Add ``rank`` and ``regress`` to the ``fastrun`` sub-command parsers."""
    from fastrun.analysis.rankings import DEFAULT_CONFIRM_ROUNDS, DEFAULT_MARGIN
    from fastrun.analysis.suites import suite_names

    suites = ", ".join(suite_names())
    rank = commands.add_parser(
        "rank", help="record the full algorithm ranking of every problem of a suite",
        description="Profile every problem of a suite (fast-run candidates, sub-problems "
                    "decided first) and write every candidate's median and spread to a "
                    f"rankings file. Suites: {suites}, model:PATH, zoo:NAME.")
    rank.add_argument("suite", help=f"{suites}, model:PATH or zoo:NAME")
    rank.add_argument("-o", "--output", required=True, help="rankings file to write")
    _common(rank)
    rank.set_defaults(handler=_cmd_rank)

    regress = commands.add_parser(
        "regress", help="re-rank a baseline's suite and report real ranking regressions",
        description="Rank the baseline's suite (or --suite) now and compare within-run ratios "
                    "between algorithms with the baseline's. Exit status 1 on a regression "
                    "beyond the measured spreads plus --margin, 0 otherwise, 2 on bad input.")
    regress.add_argument("--baseline", required=True, help="rankings file from 'fastrun rank'")
    regress.add_argument("--suite", help="suite to rank (default: the baseline's)")
    regress.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                         help=f"relative margin beyond the spreads (default {DEFAULT_MARGIN})")
    regress.add_argument("--confirm", type=int, default=DEFAULT_CONFIRM_ROUNDS, metavar="N",
                         help="re-measure the problems that regressed N more rounds, keeping "
                              "each algorithm's fastest round over all; only regressions that "
                              f"persist count (default {DEFAULT_CONFIRM_ROUNDS}; 0: off)")
    regress.add_argument("--processes", type=int, default=DEFAULT_PROCESSES, metavar="N",
                         help="re-run the check in up to N fresh processes while regressions "
                              "remain; only regressions every process shows count (default "
                              f"{DEFAULT_PROCESSES}; 0: off)")
    regress.add_argument("-o", "--output", help="also write this run's rankings here")
    _common(regress, from_baseline=True)
    regress.set_defaults(handler=_cmd_regress)
