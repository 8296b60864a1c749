"""Where a replayed model's host time goes, launch by launch: each enqueue of its launch plan
timed alone, from an idle queue and behind a replay the device is still running, with the
median per kernel name.  What issue 18's host-per-step figures in docs/performance.md are
explained by (a ``cl_winograd`` step issues three launches where ``cl_igemm`` issues one),
and how its one-time filter transform was found replayed on every run.

    python -m benchmarks.probe_replay_launches resnet50 32 [--cache FILE] [--rounds 15]

Searches first (fast-run) where the cache does not hold the model's problems.
"""

from __future__ import annotations

import argparse
import collections
import statistics

from benchmarks._common import header, model_spec


def _table(plan, device, busy: bool, rounds: int) -> tuple[float, list[float]]:
    """(median host seconds of a whole replay, each launch's median seconds)."""
    per_launch: list[list[float]] = [[] for _ in range(plan.launch_count)]
    totals = []
    for _ in range(rounds):
        device.synchronize()
        if busy:
            plan.replay()  # the device is still running this one while the next is issued
        seconds = plan.timed_replay()
        totals.append(sum(seconds))
        for slot, value in zip(per_launch, seconds, strict=True):
            slot.append(value)
    device.synchronize()
    return statistics.median(totals), [statistics.median(slot) for slot in per_launch]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a zoo name (resnet50) or an ONNX file")
    parser.add_argument("batch", type=int)
    parser.add_argument("--device", default="opencl")
    parser.add_argument("--cache", default=None, help="cache file (default: in memory)")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    import fastrun
    from fastrun.runtime import load

    session = fastrun.session(device=args.device, cache=args.cache, strategy="fast-run",
                              progress=False)
    spec = model_spec(args.model)
    model = load(spec, session, batch=args.batch, weight_preprocess=True)
    model.run(model.random_inputs(seed=1))
    plan = model.launch_plan()
    print(header(f"host cost per launch of {spec} at batch {args.batch} on {session.device}"))
    if plan is None:
        print(f"no launch plan: {model.replay_note}")
        return
    print(f"# {plan.launch_count} launches for {model.step_count} steps, enqueued "
          f"{plan.enqueue}; medians of {args.rounds} replays")
    names = plan.kernel_names
    for label, busy in (("from an idle queue", False), ("behind a running replay", True)):
        total, seconds = _table(plan, session.device, busy, args.rounds)
        by_name = collections.defaultdict(list)
        for name, value in zip(names, seconds, strict=True):
            by_name[name].append(value)
        print(f"{label}: {total * 1e6:.0f} us per replay, {total * 1e6 / model.step_count:.1f} "
              f"us per step, median launch {statistics.median(seconds) * 1e6:.1f} us")
        for name, values in sorted(by_name.items(), key=lambda item: -sum(item[1])):
            median = statistics.median(values) * 1e6
            print(f"  {name:<16} x{len(values):<3} median {median:5.1f} us, "
                  f"{sum(values) * 1e6:6.0f} us in all")


if __name__ == "__main__":
    main()
