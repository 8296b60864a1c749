"""The problems a tune has to search, as jobs with their dependencies.

Why jobs and not problems: a problem's search decides the sub-problems of every candidate
first (a Winograd conv times its batched GEMM's choice), so a fleet must search those before
their parents, and a parent's worker must be handed the children's measurements, or it would
search them again.  :func:`collect_jobs` walks each problem's sub-problems, as a search would,
and gives every job the (category, key) of the jobs it waits for.

A problem with a single eligible algorithm is not a job (a search would not time it, nor store
it); its sub-problems are, and its parent waits for them directly.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastrun.base.formats import TUNE_TIMES_FORMAT, TUNE_TIMES_VERSION
from fastrun.core.chooser import AlgoChooser
from fastrun.operator import Problem

Ident = tuple[str, str]  #: (category, key): what a cache entry is stored under


@dataclass
class TuneJob:
    """One problem to search on a worker, or one part of it (some of its candidates)."""

    operator: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    params: tuple[tuple[str, Any], ...]
    key: str
    #: the target category the result must be stored under
    category: str
    #: where it came from first: a model's node, a suite's label, a problems file
    label: str
    #: the jobs whose results its search needs (sub-problems, transitively flattened through
    #: single-algorithm problems), by ident
    children: tuple[Ident, ...] = ()
    #: seconds an earlier tune took for it (the scheduler's longest-first order), if known
    estimate_s: float | None = None
    #: a stand-in for its size where no time is known: log2 of the product of its sizes
    work: float = 0.0
    #: the candidates a search times, in the rule of thumb's order (desc texts)
    candidates: tuple[str, ...] = ()
    #: the children each candidate's timing needs (those without any are left out): a part
    #: of the problem waits only for its own candidates' children
    candidate_children: dict[str, tuple[Ident, ...]] = field(default_factory=dict)
    #: what an earlier tune spent per candidate, and outside them (inputs, reference,
    #: confirmation), when known: what splitting a problem into parts is planned from
    candidate_s: dict[str, float] = field(default_factory=dict)
    overhead_s: float | None = None
    #: a part times only these candidates (empty: the whole problem); part i of ``parts``
    algorithms: tuple[str, ...] = ()
    part: int = 0
    parts: int = 1
    attempts: list[str] = field(default_factory=list)

    @property
    def ident(self) -> Ident:
        """The problem's: what the cache stores it under and what parents wait for."""
        return (self.category, self.key)

    @property
    def uid(self) -> tuple[str, str, int]:
        """This job's own: the problem's ident and its part number."""
        return (self.category, self.key, self.part)

    @property
    def title(self) -> str:
        part = f" [part {self.part + 1}/{self.parts}]" if self.parts > 1 else ""
        return f"{self.operator}({self.key}){part}"

    def problem(self) -> Problem:
        return Problem.create(self.operator, self.shapes, self.dtypes, dict(self.params))

    def to_payload(self) -> dict[str, Any]:
        """What a worker needs to pose the problem again (plain JSON values)."""
        payload = {"operator": self.operator, "shapes": [list(s) for s in self.shapes],
                   "dtypes": list(self.dtypes),
                   "params": [[k, _plain(v)] for k, v in self.params],
                   "key": self.key, "category": self.category}
        if self.parts > 1:
            payload["algorithms"] = list(self.algorithms)
        return payload


def _plain(value: Any) -> Any:
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def apply_times(jobs: Iterable[TuneJob], records: Mapping[Ident, Mapping[str, Any]]) -> None:
    """Give each job what an earlier tune measured for its problem: its expected seconds (as
    one whole job: outside the candidates plus every candidate) and the per-candidate split."""
    for job in jobs:
        record = records.get(job.ident)
        if record is None:
            continue
        job.candidate_s = dict(record.get("candidates") or {})
        job.overhead_s = record.get("overhead_s")
        if not job.candidate_children:
            job.candidate_children = dict(record.get("candidate_children") or {})
        if job.candidate_s and job.overhead_s is not None:
            job.estimate_s = job.overhead_s + sum(job.candidate_s.values())
        else:
            job.estimate_s = record["seconds"]


def problem_from_payload(payload: Mapping[str, Any]) -> Problem:
    """The problem a payload poses; ValueError when it does not come back with the same key
    (another fastrun version canonicalises its parameters differently)."""
    problem = Problem.create(payload["operator"], payload["shapes"], payload["dtypes"],
                             dict((k, v) for k, v in payload["params"]))
    if problem.key != payload["key"]:
        raise ValueError(f"the problem {payload['operator']}({payload['key']}) comes back as "
                         f"{problem.key} on this worker: its fastrun differs from the driver's")
    return problem


def _work(chooser: AlgoChooser, problem: Problem) -> float:
    sizes = chooser.registry.operator(problem.operator).size_axes(problem.shapes)
    return sum(math.log2(s) for s in sizes if s > 0)


def collect_jobs(problems: Iterable[tuple[Problem, str]], chooser: AlgoChooser
                 ) -> list[TuneJob]:
    """Jobs for ``problems`` (each with a label) and every sub-problem their searches decide,
    children before parents, each (category, key) once."""
    jobs: dict[Ident, TuneJob] = {}
    needs: dict[Ident, tuple[Ident, ...]] = {}  # what depending on an ident means
    visiting: set[Ident] = set()

    def visit(problem: Problem, label: str) -> tuple[Ident, ...]:
        operator = chooser.registry.operator(problem.operator)
        ident = (chooser.category(operator), problem.key)
        if ident in needs:
            return needs[ident]
        if ident in visiting:  # a sub-problem cycle: the search excludes that candidate
            return ()
        visiting.add(ident)
        candidates = chooser.candidates(problem)
        # what each candidate's timing needs: its own sub-problems, not its rivals'
        per_candidate: dict[str, tuple[Ident, ...]] = {}
        for algorithm in candidates:
            needed: list[Ident] = []
            for sub in {(s.operator, s.key): s for s in algorithm.sub_problems(problem)}.values():
                needed.extend(c for c in visit(sub, label) if c not in needed)
            per_candidate[algorithm.desc.text] = tuple(needed)
        visiting.discard(ident)
        children = tuple(dict.fromkeys(c for needed in per_candidate.values() for c in needed))
        if len(candidates) < 2:
            needs[ident] = children
        else:
            order = operator.heuristic_order(problem, candidates)
            jobs[ident] = TuneJob(problem.operator, problem.shapes, problem.dtypes,
                                  problem.params, problem.key, ident[0], label, children,
                                  work=_work(chooser, problem),
                                  candidates=tuple(a.desc.text for a in order),
                                  candidate_children={name: needed for name, needed
                                                      in per_candidate.items() if needed})
            needs[ident] = (ident,)
        return needs[ident]

    for problem, label in problems:
        visit(problem, label)
    return list(jobs.values())


# -- the times log -------------------------------------------------------------------------------



def read_times(path: str) -> dict[Ident, dict[str, Any]]:
    """The records of a times log (``fastrun tune`` writes one beside the cache): per problem
    its search seconds (all its parts'), the seconds per candidate and outside them, the
    workers and its children; the last record of a problem wins.  Damaged lines are skipped;
    ValueError when the file is not a times log."""
    found: dict[Ident, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as file:
        lines = file.read().splitlines()
    if not lines:
        return found
    try:
        header = json.loads(lines[0])
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != TUNE_TIMES_FORMAT:
        raise ValueError(f"{path} is not a fastrun tune times log (its first line should be "
                         f'{{"format": "{TUNE_TIMES_FORMAT}", ...}}; fastrun tune writes one '
                         "beside its cache)")
    if header.get("version") != TUNE_TIMES_VERSION:
        raise ValueError(f"{path} is times log version {header.get('version')!r}; this fastrun "
                         f"reads version {TUNE_TIMES_VERSION}")
    for line in lines[1:]:
        try:
            record = json.loads(line)
            ident = (str(record["category"]), str(record["key"]))
            record["seconds"] = float(record["seconds"])
            record["children"] = [tuple(c) for c in record.get("children", [])]
            record["candidates"] = {str(k): float(v)
                                    for k, v in record.get("candidates", {}).items()}
            record["candidate_children"] = {
                str(k): tuple(tuple(c) for c in v)
                for k, v in record.get("candidate_children", {}).items()}
            overhead = record.get("overhead_s")
            record["overhead_s"] = None if overhead is None else float(overhead)
        except (ValueError, KeyError, TypeError):
            continue
        found[ident] = record
    return found


def append_time(path: str, job: TuneJob, seconds: float, workers: list[str],
                candidate_s: Mapping[str, float], overhead_s: float | None) -> None:
    """One line per finished problem (the header first in a new file)."""
    record = {"category": job.category, "key": job.key, "operator": job.operator,
              "seconds": seconds, "workers": workers, "candidates": dict(candidate_s),
              "overhead_s": overhead_s, "children": [list(c) for c in job.children],
              "candidate_children": {name: [list(c) for c in needed]
                                     for name, needed in job.candidate_children.items()}}
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", encoding="utf-8") as file:
        if new:
            header = {"format": TUNE_TIMES_FORMAT, "version": TUNE_TIMES_VERSION}
            file.write(json.dumps(header) + "\n")
        file.write(json.dumps(record, sort_keys=True) + "\n")
