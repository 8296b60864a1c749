"""Turning decisions into the JSON object and the table the CLIs print."""

from __future__ import annotations

from typing import Any

from fastrun.base.units import human_bytes, human_seconds
from fastrun.core.reasons import Why, why_of

__all__ = ["decision_dict", "decision_text", "human_bytes", "human_seconds"]


def decision_dict(decision, session) -> dict[str, Any]:
    """The ``--json`` object: problem, category, chosen, source, entries, exclusions, policy."""
    problem = decision.problem
    return {
        "problem": {
            "operator": problem.operator,
            "key": problem.key,
            "shapes": [list(s) for s in problem.shapes],
            "dtypes": list(problem.dtypes),
            "params": {name: value for name, value in problem.params},
        },
        "category": decision.category,
        "strategy": session.options.strategy.text(),
        "workspace_limit": session.options.workspace_limit,
        "chosen": decision.algorithm.desc.text,
        "source": decision.source,
        "search_seconds": decision.search_seconds,
        "entries": [e.to_dict() for e in decision.entries],
        "failures": [{"algorithm": f.algorithm, "reason": f.reason, "error": f.error}
                     for f in decision.failures],
        "excluded": dict(decision.excluded),
        "policy": decision.policy.to_dict(),
    }


def _policy_lines(policy: dict[str, Any], indent: str = "  ") -> list[str]:
    lines = [f"{indent}{policy['operator']}({policy['key']}) -> {policy['algorithm']} "
             f"[{policy['source']}, {human_seconds(policy['time_s'])}, "
             f"workspace {human_bytes(policy['workspace_bytes'])}]"]
    for child in policy["children"]:
        lines += _policy_lines(child, indent + "  ")
    return lines


def _excluded_lines(excluded: dict[str, str]) -> list[str]:
    """Why each candidate was left out; those written for another kind of device (hundreds of
    OpenCL configurations on a CPU run) collapse into one line per kind (``--json`` keeps
    them all)."""
    other_devices: dict[str, int] = {}
    lines = []
    for name, reason in excluded.items():
        if why_of(reason) is Why.OTHER_DEVICE:
            kind = reason.device_kind
            other_devices[kind] = other_devices.get(kind, 0) + 1
        else:
            lines.append(f"  {name}: {reason}")
    lines += [f"  {count} {kind} candidate{'s' if count > 1 else ''}: another kind of device"
              for kind, count in other_devices.items()]
    return lines


def decision_text(report: dict[str, Any]) -> str:
    problem = report["problem"]
    lines = [
        f"problem   {problem['operator']}({problem['key']})",
        f"category  {report['category']}",
        f"strategy  {report['strategy']}, workspace limit "
        f"{human_bytes(report['workspace_limit'])}",
        f"source    {report['source']}"
        + (f" (search {report['search_seconds']:.2f} s)" if report["source"] == "profiled"
           else ""),
        "",
    ]
    if report["entries"]:
        header = (f"  {'rank':<5} {'algorithm':<34} {'median':>11} {'spread':>11} "
                  f"{'workspace':>11} {'error':>9} {'n':>4}  attributes")
        lines.append(header)
        for rank, entry in enumerate(report["entries"], 1):
            mark = "*" if entry["algorithm"] == report["chosen"] else " "
            error = "-" if entry["error"] is None else f"{entry['error']:.1e}"
            lines.append(
                f"  {mark}{rank:<4} {entry['algorithm']:<34} {human_seconds(entry['time_s']):>11} "
                f"{human_seconds(entry['spread_s']):>11} "
                f"{human_bytes(entry['workspace_bytes']):>11} {error:>9} {entry['repeats']:>4}  "
                f"{'|'.join(entry['attributes']) or '-'}")
        lines.append("  (* chosen)")
    else:
        lines.append(f"  chosen without timing: {report['chosen']}")
    if report["excluded"]:
        lines += ["", "excluded:", *_excluded_lines(report["excluded"])]
    lines += ["", "execution policy:", *_policy_lines(report["policy"])]
    return "\n".join(lines)
