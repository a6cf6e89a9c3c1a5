"""Instructions per request of Ferry's in-process HTTP path, counted by callgrind: a figure noise cannot move.

On a shared virtual machine ``http_path``'s CPU per request wanders by a quarter from run to run (66-85 µs
for ``double_py`` in three runs on 2026-11-25), more than most changes to the request path are worth. The
number of instructions executed does not wander. This runs ``benchmarks.http_path`` for one model under
``valgrind --tool=callgrind`` at two request counts, side by side, and divides the difference in
instructions by the difference in requests, so start-up, model loading and warm-up cancel out::

    python -m benchmarks.instructions                      # double_py, 1000 and 3000 requests (~70 s)
    python -m benchmarks.instructions --model mlp_onnx --requests 500,1500

An A/B of a change is this command on each of two checkouts (``git worktree``); differences of about 1% are
real (the same code measured twice: 423,096 and 424,796 instructions per request).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.http_path import INPUT_WIDTHS

ROOT = Path(__file__).resolve().parent.parent
_TOTAL = re.compile(r"I\s+refs:\s+([\d,]+)")


def count(model: str, requests: int, *, cwd: Path = ROOT) -> int:
    """Instructions callgrind counts for one whole ``http_path`` run of ``requests`` requests on ``model``."""
    argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
            "-m", "benchmarks.http_path", "--models", model, "--requests", str(requests)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, check=False)
    match = _TOTAL.search(done.stderr)
    if done.returncode != 0 or match is None:
        raise RuntimeError(f"callgrind run failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return int(match.group(1).replace(",", ""))


def per_request(model: str, low: int, high: int, *, cwd: Path = ROOT) -> float:
    """(instructions at ``high`` - at ``low``) / (``high`` - ``low``); the two runs go side by side."""
    with ThreadPoolExecutor(2) as pool:
        at_low, at_high = pool.map(lambda n: count(model, n, cwd=cwd), (low, high))
    return (at_high - at_low) / (high - low)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="double_py", choices=sorted(INPUT_WIDTHS))
    p.add_argument("--requests", default="1000,3000", help="the two request counts, low,high")
    args = p.parse_args(argv)
    try:
        low, high = (int(part) for part in args.requests.split(","))
    except ValueError:
        p.error("--requests takes two counts, e.g. 1000,3000")
    if not 0 < low < high:
        p.error("--requests: the counts must be positive and the second larger")
    if shutil.which("valgrind") is None:
        print("error: valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    print(f"{args.model}: {per_request(args.model, low, high):,.0f} instructions per request "
          f"(callgrind, {low} and {high} requests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
