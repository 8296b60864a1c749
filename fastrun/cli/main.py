"""The ``fastrun`` command: profile one problem, list algorithms, show the configuration."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Sequence
from typing import Any

from fastrun.base.problem import parse_value
from fastrun.cli import formatting, pipes, unsaved
from fastrun.cli.options import add_strategy_arguments, strategy_from
from fastrun.devices import device_backends


def _parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: expected e.g. 256x512") from None
    if any(d < 0 for d in dims):
        raise argparse.ArgumentTypeError(f"bad shape {text!r}: negative dimension")
    return dims


def _parse_shapes(text: str) -> list[tuple[int, ...]]:
    return [_parse_shape(part) for part in text.split(",") if part]


def _parse_attr(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"bad attribute {text!r}: expected NAME=VALUE")
    parsed = parse_value(value)
    for number in parsed if isinstance(parsed, tuple) else (parsed,):
        if isinstance(number, float) and not math.isfinite(number):
            raise argparse.ArgumentTypeError(
                f"bad attribute {text!r}: {number} is not a finite number")
    return name, parsed


def _parse_dtype(text: str) -> str:
    import numpy as np

    try:
        return np.dtype(text).name
    except TypeError:
        raise argparse.ArgumentTypeError(
            f"bad dtype {text!r}: expected a numpy dtype, e.g. float32 or float64") from None


def _cmd_profile(args: argparse.Namespace) -> int:
    from fastrun.api import Session

    session = Session(
        device=args.device,
        cache=unsaved.session_cache(args),
        strategy=strategy_from(args),
        workspace_limit=args.workspace_limit,
        budget_s=args.budget,
        nearest=args.nearest,
        progress=None if not args.json else False,
    )
    args.session = session  # for the Ctrl-C message
    shapes, params = list(args.inputs), dict(args.attrs)
    if args.bias:
        if len(shapes) < 2 or not shapes[1]:
            raise ValueError("--bias needs a weight as the second input (its first dimension "
                             "is the number of output channels)")
        shapes.append((shapes[1][0],))
    if args.epilogue:
        params["activation"] = args.epilogue
    if args.weight_preprocess:
        params["weight_preprocess"] = True
    problem = session.problem(args.operator, shapes, [args.dtype] * len(shapes), **params)
    try:
        decision = session.decide(problem)
    finally:
        unsaved.finish(session.cache, args.save_cache_to, "fastrun")
    report = formatting.decision_dict(decision, session)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(formatting.decision_text(report))
    return 0


def _cmd_algorithms(args: argparse.Namespace) -> int:
    from fastrun.registry import default_registry

    registry = default_registry()
    names = [args.operator] if args.operator else registry.operators()
    for name in names:
        algorithms = [a for a in registry.algorithms(name)
                      if args.device is None or a.device_kind == args.device]
        if not algorithms:
            continue
        versions = ", ".join(f"{kind} {registry.algorithm_set_version(name, kind)}"
                             for kind in sorted({a.device_kind for a in algorithms}))
        print(f"{name} (algorithm set version: {versions})")
        for algorithm in algorithms:
            where = "" if algorithm.device_kind == "cpu" else f"  [{algorithm.device_kind}]"
            print(f"  {algorithm.desc.text:<36} {algorithm.attributes.text()}{where}")
    for plugin, error in registry.plugin_errors.items():
        print(f"plugin {plugin} failed to load: {error}", file=sys.stderr)
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    import os

    from fastrun.devices import declared_settings, get_device

    device = get_device(args.device)
    print(f"device category: {device.category}")
    print(f"{device.kind} devices (this one is {device.spec}):")
    for line in device.describe_devices():
        print(f"  {line}")
    print("settings:")
    for setting in declared_settings():
        value = os.environ.get(setting.variable)
        shown = f"{setting.variable}={value}" if value else f"{setting.variable} (unset)"
        print(f"  {shown:<32} [{setting.group}] {setting.doc}")
    return 0


def _cmd_zoo_list(args: argparse.Namespace) -> int:
    from fastrun.runtime import zoo

    for name in zoo.names():
        print(f"zoo:{name:<14} {zoo.describe(name)}")
    return 0


def _cmd_zoo_export(args: argparse.Namespace) -> int:
    import onnx

    from fastrun.runtime import zoo

    name = args.name.removeprefix("zoo:")
    model = zoo.build(name, seed=args.seed, opset=args.opset)
    onnx.save_model(model, args.output)
    opset = model.opset_import[0].version
    print(f"wrote zoo:{name} (seed {args.seed}, opset {opset}) to {args.output}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from fastrun._version import __version__
    from fastrun.cli import cache_cmd, rank_cmd, report_cmd, tune_cmd

    parser = argparse.ArgumentParser(
        prog="fastrun", description="Fast-Run algorithm selection: profile, cache, dispatch.")
    parser.add_argument("--version", action="version", version=f"fastrun {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log the search (-vv for debug detail)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    profile = commands.add_parser(
        "profile", help="search (or look up) the best algorithm for one problem",
        description="Profile one operator problem, or read its decision from a cache, and print "
                    "the ranking. Without --fast-run/--full-run nothing is timed: the cache is "
                    "read and misses fall back to the heuristic.")
    profile.add_argument("operator", help="operator name, e.g. matmul")
    profile.add_argument("--inputs", type=_parse_shapes, required=True, metavar="SHAPES",
                         help="comma-separated input shapes, e.g. 256x512,512x128")
    profile.add_argument("--dtype", type=_parse_dtype, default="float32",
                         help="input dtype (default float32)")
    profile.add_argument("--attrs", nargs="*", type=_parse_attr, default=[], metavar="NAME=VALUE",
                         help="operator parameters, e.g. strides=1,1 group=1")
    profile.add_argument("--bias", action="store_true",
                         help="add a bias input of shape (K,), K = the weight's first dimension")
    profile.add_argument("--epilogue", choices=["none", "relu", "clip", "relu6"],
                         help="activation fused into the output loop (conv)")
    profile.add_argument("--weight-preprocess", action="store_true",
                         help="profile with constant weights transformed once, outside the "
                              "timing (recorded in the cache key)")
    profile.add_argument("--device", default="cpu",
                         help="cpu (default), cpu:THREADS, opencl[:PLATFORM:DEVICE]")
    profile.add_argument("--json", action="store_true", help="print one JSON object")
    add_strategy_arguments(profile)
    profile.set_defaults(handler=_cmd_profile)

    algorithms = commands.add_parser("algorithms", help="list registered algorithms")
    algorithms.add_argument("operator", nargs="?", help="only this operator")
    algorithms.add_argument("--device", choices=sorted(device_backends()),
                            help="only the algorithms of this kind of device")
    algorithms.set_defaults(handler=_cmd_algorithms)

    show_config = commands.add_parser("config", help="show the device category and settings")
    show_config.add_argument("--device", default="cpu",
                             help="cpu (default), cpu:THREADS, opencl[:PLATFORM:DEVICE]")
    show_config.set_defaults(handler=_cmd_config)

    zoo = commands.add_parser("zoo", help="built-in ONNX models: list, export")
    zoo_commands = zoo.add_subparsers(dest="zoo_command", required=True, metavar="ACTION")
    zoo_commands.add_parser("list", help="list the built-in models").set_defaults(
        handler=_cmd_zoo_list)
    export = zoo_commands.add_parser("export", help="write a built-in model to an .onnx file")
    export.add_argument("name", help="model name, e.g. resnet18 (or zoo:resnet18)")
    export.add_argument("-o", "--output", required=True, help="output .onnx file")
    export.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    export.add_argument("--opset", type=int, default=None,
                        help="ONNX opset (default 13, or 17 for the transformers)")
    export.set_defaults(handler=_cmd_zoo_export)
    cache_cmd.add_parser(commands)
    rank_cmd.add_parser(commands)
    report_cmd.add_parser(commands)
    tune_cmd.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    unsaved.quiet_warnings()
    unsaved.quiet_interrupted_finalizers()
    from fastrun.core.chooser import NoUsableAlgorithmError
    from fastrun.registry import RegistryError

    try:
        return args.handler(args)
    except BrokenPipeError:
        return pipes.closed()
    except (NoUsableAlgorithmError, RegistryError, ValueError) as error:
        print(f"fastrun: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return unsaved.interrupted(getattr(args, "session", None),
                                   getattr(args, "algo_policy", None), "fastrun")


if __name__ == "__main__":
    sys.exit(main())
