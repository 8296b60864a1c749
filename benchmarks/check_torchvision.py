"""Every torchvision model a user brings: exported, loaded and checked against onnxruntime.

For each model, in processes of their own, as a user would run them:

1. export it to ONNX at opset 17 with random weights (``export_torchvision.py``, run by
   ``--python``, an interpreter with torch and torchvision; skipped where the file exists);
2. ``load_and_run FILE --check`` (heuristic picks, or ``--fast-run`` into a cache per model
   under ``--cache-dir``), which compares the outputs with onnxruntime's.

Printed per model: whether it loaded, the check (largest difference relative to the largest
output; the tolerance is load_and_run's), the search time with ``--fast-run``, and the run's
median.  The speed against onnxruntime is ``bench_scaling``'s, which takes the exported files
(``--models DIR/vit_b_16.onnx``) and the caches this script leaves.

    python -m benchmarks.check_torchvision --python /path/to/venv/bin/python
        [--models vit_b_16,swin_t] [--out-dir DIR] [--fast-run] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

from benchmarks._common import header
from benchmarks.export_torchvision import MODELS

_DIFF = re.compile(r"max abs diff (\S+) \((\S+) of the largest output\), (\w+)")
_SEARCH = re.compile(r"^search\s+(\S+) s", re.M)
_RUN = re.compile(r"^run .*median (\S+) ms", re.M)


def _check(path: str, args: argparse.Namespace, cache: str | None) -> dict:
    command = [sys.executable, "-m", "fastrun.cli.load_and_run", path, "--check",
               "--iter", "5", "--no-progress"]
    if cache:
        command += ["--fast-run", "--algo-policy", cache]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    text = done.stdout + done.stderr
    diff, search, run = _DIFF.search(text), _SEARCH.search(text), _RUN.search(text)
    error = next((line for line in text.splitlines() if "error" in line.lower()), "")
    return {"rc": done.returncode, "seconds": time.perf_counter() - started,
            "relative": diff.group(2) if diff else "-", "verdict": diff.group(3) if diff else
            "not run", "search_s": search.group(1) if search else "-",
            "run_ms": run.group(1) if run else "-", "error": error[:120]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable,
                        help="an interpreter with torch and torchvision, for the exports")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out-dir", default="torchvision-onnx",
                        help="where the exported files go (kept: an existing file is reused)")
    parser.add_argument("--fast-run", action="store_true", help="search each model first")
    parser.add_argument("--cache-dir", default="torchvision-caches",
                        help="with --fast-run: one cache per model, NAME.bin")
    args = parser.parse_args()
    models = args.models.split(",")
    missing = [m for m in models if not os.path.exists(os.path.join(args.out_dir, f"{m}.onnx"))]
    if missing:
        exporter = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "export_torchvision.py")
        done = subprocess.run([args.python, exporter, args.out_dir, *missing])
        if done.returncode:
            sys.exit(f"check_torchvision: exporting {', '.join(missing)} with {args.python} "
                     f"failed (it needs torch and torchvision; see --python)")
    if args.fast_run:
        os.makedirs(args.cache_dir, exist_ok=True)
    print(header(f"torchvision models, opset 17, load_and_run --check"
                 f"{' --fast-run' if args.fast_run else ''}"))
    print("| model | check | largest difference / largest output | search s | run ms |")
    print("| --- | --- | --- | --- | --- |")
    passed = 0
    for model in models:
        cache = os.path.join(args.cache_dir, f"{model}.bin") if args.fast_run else None
        result = _check(os.path.join(args.out_dir, f"{model}.onnx"), args, cache)
        verdict = result["verdict"] if result["rc"] in (0, 1) else \
            f"exit {result['rc']}: {result['error']}"
        passed += result["rc"] == 0 and verdict == "ok"
        print(f"| {model} | {verdict} | {result['relative']} | {result['search_s']} | "
              f"{result['run_ms']} |", flush=True)
    print(f"\n{passed} of {len(models)} models ran and matched onnxruntime")


if __name__ == "__main__":
    main()
