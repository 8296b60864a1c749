"""``fastrun cache``: show, merge, diff, prune and export cache files.

Only argument parsing and output live here; the work is done by :mod:`fastrun.cache.tools`, which
returns the data that ``--json`` prints as it is. Problems with a file raise
:class:`fastrun.cache.tools.CacheToolError` (a ValueError), which ``fastrun``'s main reports as
``fastrun: error: ...`` with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from fastrun.base.files import atomic_write
from fastrun.base.units import plural
from fastrun.category import printable
from fastrun.category import split as split_category
from fastrun.cli.formatting import human_bytes, human_seconds
from fastrun.cli.options import argument_type

MERGE_RULE = ("for each key, entries are combined by algorithm; of two measurements of the same "
              "algorithm the steady one wins (a low-confidence measurement loses), then the one "
              "with more repeats, then the newer one (measured_at), then "
              "the one from the later input; the union is then pruned (an entry goes when one "
              "with the same attributes is no slower and needs no more workspace)")


def _parse_duration(text: str) -> float:
    from fastrun.cache.tools import parse_duration

    return argument_type(parse_duration)(text)


def _parse_threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(
            f"bad threshold {text!r}: expected a non-negative fraction, e.g. 0.1 for 10%")
    return value


def _add_selection(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--category", action="append", default=[], metavar="PATTERN",
                        help=f"only {what} categories matching PATTERN (repeatable: any): "
                             "FACT=VALUE[;FACT=VALUE...] matches those facts exactly (e.g. "
                             "threads=16, never blas_threads=16); any other PATTERN is a part "
                             "of the category text (e.g. '|conv@')")
    parser.add_argument("--operator", metavar="NAME",
                        help=f"only {what} categories of this operator, e.g. matmul")


def add_parser(commands: Any) -> None:
    """Add ``fastrun cache`` and its actions to the ``fastrun`` subcommands."""
    cache = commands.add_parser(
        "cache", help="inspect and maintain cache files: show, merge, diff, prune, compact, "
                 "export",
        description="Inspect and maintain fastrun cache files. show, diff and export only "
                    "read (a damaged file is reported and left as it is); merge, prune and "
                    "compact rewrite the output atomically under the cache's lock.")
    actions = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")

    _add_reading_actions(actions)
    _add_rewriting_actions(actions)


def _add_reading_actions(actions: Any) -> None:
    """show, check, diff and export: they only read (a damaged file is reported, not moved)."""
    show = actions.add_parser(
        "show", help="the measured entries kept and the lookup choice of every key",
        description="Print, per category and key, the measured algorithms the cache keeps "
                    "(each problem's Pareto front of time and workspace, not the whole "
                    "ranking: fastrun rank records that), fastest first, and what a plain "
                    "lookup chooses (the fastest entry), plus the fastest REPRODUCIBLE one "
                    "when it differs. Dates are UTC. Damaged "
                    "records and invalid entries are listed first; then the exit status is "
                    "1 (2 when the file is no readable cache).")
    show.add_argument("file", help="cache file")
    _add_selection(show, "show")
    show.add_argument("--device", default="cpu",
                      help="say which categories apply to this device of this machine, and "
                           "which facts differ where not (default cpu; 'none': do not compare)")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(handler=_cmd_show)

    check = actions.add_parser(
        "check", help="find damaged records and invalid entries",
        description="Read a cache file as a lookup would and list everything it skips: "
                    "damaged records (offset, bytes, why; every whole record around them is "
                    "used), a tail of bytes after the last whole record (a write cut short, "
                    "or one in progress), and entries with invalid values. The file is only "
                    "read; `fastrun cache compact` rewrites it without the damage. Exit "
                    "status 0 when clean, 1 when something is skipped, 2 when the file is no "
                    "readable cache.")
    check.add_argument("file", help="cache file")
    check.add_argument("--json", action="store_true", help="print one JSON object")
    check.set_defaults(handler=_cmd_check)

    diff = actions.add_parser(
        "diff", help="compare two cache files",
        description="Compare cache A with cache B: categories and keys only in one of them, "
                    "and per common key the winner and the time ratio B/A of every algorithm "
                    "both measured, flagged beyond the threshold. Files from different device "
                    "categories are matched by operator@version and key across devices, and "
                    "times relative to a reference algorithm are compared instead of absolute "
                    "times. Exit status 1 when a winner changed, 0 otherwise, 2 on bad input.")
    diff.add_argument("a", metavar="A", help="the old cache file")
    diff.add_argument("b", metavar="B", help="the new cache file")
    diff.add_argument("--threshold", type=_parse_threshold, default=0.1, metavar="FRACTION",
                      help="flag a ratio above 1+FRACTION or below 1/(1+FRACTION) "
                           "(default 0.1)")
    diff.add_argument("--json", action="store_true", help="print one JSON object")
    diff.set_defaults(handler=_cmd_diff)

    export = actions.add_parser(
        "export", help="write the whole cache as JSON",
        description="Write the whole cache as one JSON document "
                    '({"format": "fastrun-cache-json", "version": 1, "categories": '
                    "{category: {key: [entry, ...]}}}; see docs/cache-format.md).")
    export.add_argument("file", help="cache file")
    export.add_argument("--json", action="store_true", required=True,
                        help="export as JSON (the only format; required so that others can "
                             "be added)")
    export.add_argument("-o", "--output", metavar="OUT.json",
                        help="write to this file instead of standard output")
    export.set_defaults(handler=_cmd_export)


def _add_rewriting_actions(actions: Any) -> None:
    """merge, prune and compact: they rewrite their output atomically under its lock."""
    merge = actions.add_parser(
        "merge", help="merge cache files into one",
        description=f"Merge cache files into OUT: {MERGE_RULE}. OUT may be one of the inputs; "
                    "if it exists and is not, its contents are kept and merged too. OUT is "
                    "written once, atomically, under its lock; inputs are only read.")
    merge.add_argument("inputs", nargs="+", metavar="FILE", help="cache files to merge")
    merge.add_argument("-o", "--output", required=True, metavar="OUT", help="merged cache file")
    merge.add_argument("--json", action="store_true", help="print the counts as JSON")
    merge.set_defaults(handler=_cmd_merge)

    prune = actions.add_parser(
        "prune", help="remove categories, keys or old entries",
        description="Remove the selected categories whole or, with --older-than or "
                    "--version-below, only their entries that match (all given criteria must "
                    "match). Keys whose entries all go are removed, and so are emptied "
                    "categories. The file is rewritten atomically under its lock.")
    prune.add_argument("file", help="cache file")
    _add_selection(prune, "prune")
    prune.add_argument("--older-than", type=_parse_duration, metavar="DURATION",
                       help="remove entries measured longer ago than this, e.g. 30d, 12h, 90m")
    prune.add_argument("--version-below", metavar="X.Y.Z",
                       help="remove entries measured by a fastrun version older than X.Y.Z")
    prune.add_argument("--dry-run", action="store_true",
                       help="say what would be removed; change nothing")
    prune.add_argument("--json", action="store_true", help="print the report as JSON")
    prune.set_defaults(handler=_cmd_prune)

    compact = actions.add_parser(
        "compact", help="fold the log of measurements into a new snapshot",
        description="Rewrite a cache file as one snapshot of its contents, atomically under "
                    "its lock (a put appends to the file's log; searches compact it from time "
                    "to time). A format-1 or format-2 file is converted to format 3.")
    compact.add_argument("file", help="cache file")
    compact.add_argument("--json", action="store_true", help="print the counts as JSON")
    compact.set_defaults(handler=_cmd_compact)


# --------------------------------------------------------------------------------------------
# handlers


def _print_json(document: Any) -> None:
    print(json.dumps(document, indent=2))


def _cmd_show(args: argparse.Namespace) -> int:
    from fastrun.cache import tools as cachetools

    device = None if args.device == "none" else args.device
    report = cachetools.show(args.file, args.category, args.operator, device)
    if args.json:
        _print_json(report)
    else:
        print(show_text(report))
    return 1 if report["damage"] or report["skipped"] else 0


def _cmd_check(args: argparse.Namespace) -> int:
    from fastrun.cache import tools as cachetools

    report = cachetools.check(args.file)
    if args.json:
        _print_json(report)
    else:
        print(check_text(report))
    return 0 if report["clean"] else 1


def _cmd_merge(args: argparse.Namespace) -> int:
    from fastrun.cache import tools as cachetools

    report = cachetools.merge(args.inputs, args.output)
    if args.json:
        _print_json(report)
    else:
        print(merge_text(report))
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    from fastrun.cache import tools as cachetools

    report = cachetools.diff(args.a, args.b, args.threshold)
    if args.json:
        _print_json(report)
    else:
        print(diff_text(report))
    # like diff(1): 1 when the files differ in what matters, a winner, so CI can act on it
    return 1 if report["summary"]["winner_changes"] else 0


def _cmd_prune(args: argparse.Namespace) -> int:
    from fastrun.cache import tools as cachetools

    report = cachetools.prune(args.file, args.category, args.operator, args.older_than,
                              args.version_below, dry_run=args.dry_run)
    if args.json:
        _print_json(report)
    else:
        print(prune_text(report))
    return 0


def _cmd_compact(args: argparse.Namespace) -> int:
    from fastrun.cache import tools as cachetools

    report = cachetools.compact(args.file)
    if args.json:
        _print_json(report)
    else:
        print(f"compacted {report['file']}: {_summary(report)}; "
              f"{human_bytes(report['bytes_before'])} -> {human_bytes(report['bytes_after'])}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from fastrun.cache import tools as cachetools

    if args.output is not None and os.path.exists(args.output) and os.path.exists(args.file) \
            and os.path.samefile(args.output, args.file):
        raise cachetools.CacheToolError(
            f"-o {args.output} is the cache file being exported: it would be replaced by its "
            "JSON export; choose another output file")
    text = json.dumps(cachetools.export(args.file), indent=1) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return 0
    # Replace the output atomically: an interrupted export leaves no half document behind.
    try:
        atomic_write(args.output, text)
    except OSError as error:
        raise cachetools.CacheToolError(
            f"cannot write {args.output}: {error.strerror or error}") from None
    print(f"exported {args.file} to {args.output}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------------------------
# text output


def _summary(counts: dict[str, int]) -> str:
    return (f"{plural(counts['categories'], 'category', 'categories')}, "
            f"{plural(counts['keys'], 'key')}, "
            f"{plural(counts['entries'], 'entry', 'entries')}")


def _damage_lines(report: dict[str, Any]) -> list[str]:
    """The damaged spans and invalid entries a report lists, one line each."""
    lines = []
    if report["damage"]:
        total = sum(item["bytes"] for item in report["damage"])
        lines.append(f"damaged: {plural(len(report['damage']), 'span')} of bytes skipped "
                     f"({human_bytes(total)}):")
        lines += [f"  offset {item['offset']}: {plural(item['bytes'], 'byte')}, "
                  f"{printable(item['why'])}" for item in report["damage"]]
    if report["skipped"]:
        count = plural(len(report["skipped"]), "invalid entry", "invalid entries")
        lines.append(f"skipped {count}:")
        lines += [f"  {printable(item['key'])} [{printable(item['category'])}]: "
                  f"{printable(item['why'])}" for item in report["skipped"]]
    return lines


def check_text(report: dict[str, Any]) -> str:
    head = (f"cache file {report['file']} ({report['format']}, "
            f"{human_bytes(report['bytes'])}): {_summary(report['summary'])}")
    if report["clean"]:
        return f"{head}\nclean: every record is whole and every entry valid"
    return "\n".join([head, *_damage_lines(report),
                      "(`fastrun cache compact` rewrites the file with every whole record and "
                      "without the damage)"])


def show_text(report: dict[str, Any]) -> str:
    lines = [f"cache file {report['file']}: {_summary(report['summary'])}"]
    lines += _damage_lines(report)
    for category in report["categories"]:
        lines += ["", printable(category["device"]),
                  f"  | {printable(split_category(category['category'])[1])}"]
        if category.get("applies_here") is False:
            lines.append("  does not apply to this device: "
                         + printable("; ".join(category["differences"])))
        for item in category["keys"]:
            choice = f"lookup -> {printable(str(item['lookup']))}"
            if item["lookup_reproducible"] != item["lookup"]:
                choice += f"; reproducible -> {printable(item['lookup_reproducible'] or '(none)')}"
            if item["low_confidence"]:
                choice += ("  [low confidence: unstable timing; fastrun tune or a search "
                           "measures it again]")
            lines += ["", f"  {printable(item['key'])}", f"    {choice}",
                      f"    {'rank':<5}{'algorithm':<34} {'median':>11} {'spread':>11} "
                      f"{'workspace':>11} {'error':>9} {'n':>5}  {'measured (UTC)':<16} "
                      f"{'version':<8} attributes"]
            for rank, entry in enumerate(item["entries"], 1):
                mark = "*" if entry["algorithm"] == item["lookup"] else " "
                error = "-" if entry["error"] is None else f"{entry['error']:.1e}"
                measured = entry["measured"].replace("T", " ")[:16]
                lines.append(
                    f"    {mark}{rank:<4}{printable(entry['algorithm']):<34} "
                    f"{human_seconds(entry['time_s']):>11} {human_seconds(entry['spread_s']):>11} "
                    f"{human_bytes(entry['workspace_bytes']):>11} {error:>9} "
                    f"{entry['repeats']:>5}  {measured:<16} {printable(entry['version']):<8} "
                    f"{'|'.join(entry['attributes']) or '-'}")
    if report["categories"]:
        lines += ["", "(* what a plain lookup chooses: the fastest entry)"]
    return "\n".join(lines)


def merge_text(report: dict[str, Any]) -> str:
    count = sum(1 for s in report["sources"] if not s["path"].endswith("(existing contents)"))
    if report["written"]:
        head = f"merged {plural(count, 'file')} into {report['output']}"
    else:
        head = (f"{report['output']} already holds the merge of {plural(count, 'file')} "
                "(not rewritten)")
    lines = [f"{head}: {_summary(report['result'])}"]
    for source in report["sources"]:
        lines.append(f"  {source['path']}: {plural(source['keys'], 'key')} "
                     f"({source['keys_only_here']} only there), {source['entries_kept']} of its "
                     f"{source['entries']} entries kept")
    by = report["resolved_by"]
    lines += [
        f"  keys in several files: {report['shared_keys']}",
        f"  conflicts resolved: {report['conflicts']} (steady {by['steady']}, "
        f"more repeats {by['more_repeats']}, "
        f"newer {by['newer']}, later input {by['later_input']}); identical duplicates: "
        f"{report['identical_duplicates']}; dominated entries pruned: {report['pruned']}",
        f"  rule: {MERGE_RULE}",
    ]
    return "\n".join(lines)


def _ratio_text(ratio: float | None) -> str:
    return "undef" if ratio is None else f"{ratio:.3f}"


def diff_text(report: dict[str, Any]) -> str:
    summary = report["summary"]
    lines = [f"A: {report['a']}", f"B: {report['b']}", f"note: {report['note']}"]
    if report["cross_device"]:
        lines += [f"  A device: {printable(d)}" for d in report["devices_a"]]
        lines += [f"  B device: {printable(d)}" for d in report["devices_b"]]
    for side in ("a", "b"):
        items = report[f"categories_only_in_{side}"]
        if items:
            lines.append(f"categories only in {side.upper()} ({len(items)}):")
            other = "b" if side == "a" else "a"
            for item in items:
                lines.append(f"  {printable(item['category'])} ({plural(item['keys'], 'key')})")
                if item.get(f"differs_from_{other}"):
                    lines.append(f"    differs from {other.upper()}: "
                                 f"{printable(item[f'differs_from_{other}'])}")
        keys = report[f"keys_only_in_{side}"]
        if keys:
            lines.append(f"keys only in {side.upper()} ({len(keys)}):")
            shown = None
            for item in keys:  # grouped by category, which is printed once per group
                if item["category"] != shown:
                    lines.append(f"  [{printable(item['category'])}]")
                    shown = item["category"]
                lines.append(f"    {printable(item['key'])}")
    lines.append(f"common keys: {summary['common_keys']}, winner changes: "
                 f"{summary['winner_changes']}, flagged ratios: {summary['flagged']} "
                 f"(threshold {report['threshold']:.0%})")
    cross = report["cross_device"]
    shown_category = None
    for item in report["common"]:
        # across devices the categories differ in their device part: show what is shared
        where = split_category(item["category_a"])[1] if cross else item["category_a"]
        if where != shown_category:
            lines += ["", f"category {printable(where)}"]
            shown_category = where
        lines += ["", f"  {printable(item['key'])}"]
        change = "CHANGED" if item["winner_changed"] else "same"
        lines.append(f"    winner: {printable(str(item['winner_a']))} -> "
                     f"{printable(str(item['winner_b']))} ({change})")
        if cross and item["reference"]:
            lines.append(f"    times relative to {printable(item['reference'])} within each "
                         "file")
        header = f"    {'algorithm':<34} {'A':>11} {'B':>11} {'B/A':>8}"
        if cross:
            header += f" {'rel A':>8} {'rel B':>8} {'rel B/A':>8}"
        lines.append(header)
        for alg in item["algorithms"]:
            row = (f"    {printable(alg['algorithm']):<34} {human_seconds(alg['time_a']):>11} "
                   f"{human_seconds(alg['time_b']):>11} {_ratio_text(alg['time_ratio']):>8}")
            if cross:
                row += (f" {_ratio_text(alg['relative_a']):>8} "
                        f"{_ratio_text(alg['relative_b']):>8} {_ratio_text(alg['ratio']):>8}")
            if alg["flagged"]:
                row += "  !"
            lines.append(row)
        for side in ("a", "b"):
            if item[f"only_in_{side}"]:
                names = ", ".join(printable(name) for name in item[f"only_in_{side}"])
                lines.append(f"    only in {side.upper()}: {names}")
    if any(alg["flagged"] for item in report["common"] for alg in item["algorithms"]):
        lines += ["", "(! ratio beyond the threshold)"]
    return "\n".join(lines)


def prune_text(report: dict[str, Any]) -> str:
    removed = report["removed"]
    left = _summary(report["left"])
    if report["dry_run"]:
        lines = [f"would remove {_summary(removed)} from {report['file']} (dry run); "
                 f"would leave {left}"]
    elif report["written"]:
        lines = [f"removed {_summary(removed)} from {report['file']}; left: {left}"]
    else:
        lines = [f"nothing to remove from {report['file']}; left: {left}"]
    lines += [f"  category {printable(c)}" for c in report["removed_categories"]]
    # keys of a category removed whole are not listed again
    whole = set(report["removed_categories"])
    shown = [item for item in report["removed_keys"] if item["category"] not in whole]
    hidden = len(shown) - 50
    shown = shown[:50]
    lines += [f"  key {printable(item['key'])} ({plural(item['entries'], 'entry', 'entries')})"
              f"  [{printable(item['category'])}]" for item in shown]
    if hidden > 0:
        lines.append(f"  ... and {hidden} more keys")
    return "\n".join(lines)
