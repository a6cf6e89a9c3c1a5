"""perf_analyzer as the analyzer's load generator: locating the binary, running one point, reading ``-f`` CSV.

Where the binary comes from, first match wins: ``--perf-analyzer PATH``, ``$FERRY_PERF_ANALYZER``,
``perf_analyzer`` on ``PATH``, then the copy the test tooling installs under ``$FERRY_TOOLS_DIR`` or
``<checkout>/.tools`` (with its ``libcudart`` / ``libb64`` folders put on ``LD_LIBRARY_PATH``). A point
whose windows never agree within ``--stability-percentage`` (exit 2 on a busy 2-core machine) is taken as
the medians of its windows (``-v`` prints each one) and flagged unstable, as the benchmarks do.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from serving_pod.analyzer import placement
from serving_pod.analyzer.errors import InputError
from serving_pod.analyzer.loadgen import LoadResult, WindowSettings

_PASS = re.compile(r"Pass \[(\d+)\] throughput: ([0-9.]+) infer/sec\. p99 latency: (\d+) usec")


@dataclass(frozen=True)
class Located:
    path: Path | None
    env: Mapping[str, str] = field(default_factory=dict)
    reason: str = ""


def _tools_dirs() -> list[Path]:
    env = os.environ.get("FERRY_TOOLS_DIR")
    return [Path(env)] if env else [Path(__file__).resolve().parents[2] / ".tools"]


def _runs(path: Path, env: Mapping[str, str]) -> str:
    """Empty when ``path --version`` works, else why not."""
    try:
        proc = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30, env=dict(env))
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{path}: {exc}"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"{path} --version exited {proc.returncode}: {tail[0]}"
    return ""


def _with_libs(tools: Path) -> dict[str, str]:
    libs = [p.parent for p in sorted(tools.glob("cudart-*/**/libcudart.so.*"))[:1]]
    libs += [p.parent for p in sorted(tools.glob("libb64/**/libb64.so.0d"))[:1]]
    env = dict(os.environ)
    parts = [str(d) for d in libs] + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    if parts:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env


def locate(explicit: str | None = None) -> Located:
    """Find a runnable perf_analyzer; an explicit path that does not run is an :class:`InputError`."""
    if explicit:
        path = Path(explicit)
        env = _with_libs(_tools_dirs()[0])
        problem = _runs(path, env) if path.is_file() else f"{path} does not exist"
        if problem:
            raise InputError(f"invalid --perf-analyzer: {problem}")
        return Located(path, env)
    candidates: list[tuple[Path, dict[str, str]]] = []
    if os.environ.get("FERRY_PERF_ANALYZER"):
        candidates.append((Path(os.environ["FERRY_PERF_ANALYZER"]), _with_libs(_tools_dirs()[0])))
    if shutil.which("perf_analyzer"):
        candidates.append((Path(shutil.which("perf_analyzer") or ""), _with_libs(_tools_dirs()[0])))
    for tools in _tools_dirs():
        for binary in sorted(tools.glob("perf_analyzer-*/**/bin/perf_analyzer"), reverse=True):
            candidates.append((binary, _with_libs(tools)))
    reasons = []
    for path, env in candidates:
        problem = _runs(path, env)
        if not problem:
            return Located(path, env)
        reasons.append(problem)
    where = "; ".join(reasons) or "not on PATH, no $FERRY_PERF_ANALYZER, nothing under " + \
        ", ".join(str(t) for t in _tools_dirs())
    return Located(None, reason=where)


def perf_args(model: str, url: str, concurrency: int, window: WindowSettings, csv_path: str) -> list[str]:
    return ["-m", model, "-u", url, "-i", window.protocol, "--concurrency-range", str(concurrency),
            "--measurement-interval", str(window.measurement_interval_ms),
            "--stability-percentage", f"{window.stability_percentage:g}", "--max-trials", str(window.max_trials),
            "--percentile=99", "-f", csv_path, "-v"]


def parse_csv(text: str) -> dict[str, float]:
    """The last row of the first table of a ``-f`` CSV file, as column -> number."""
    lines = []
    for line in text.splitlines():
        if not line.strip():
            break
        lines.append(line)
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))
    if not rows:
        raise ValueError("perf_analyzer CSV has no rows")
    row = rows[-1]
    try:
        return {key: float(value) for key, value in row.items() if key and value not in (None, "")}
    except ValueError as exc:
        raise ValueError(f"perf_analyzer CSV has a non-number: {exc}") from None


def result_from_csv(row: Mapping[str, float]) -> LoadResult:
    if "Inferences/Second" not in row or "p99 latency" not in row:
        raise ValueError(f"perf_analyzer CSV lacks throughput or p99 columns: {sorted(row)}")

    def ms(column: str) -> float | None:
        return row[column] / 1e3 if column in row else None

    return LoadResult(row["Inferences/Second"], ms("p50 latency"), ms("p95 latency"), row["p99 latency"] / 1e3,
                      True, "perf_analyzer")


def result_from_passes(stdout: str) -> LoadResult | None:
    """Medians over the printed windows, the first (warm-up) one left out when there are more than two."""
    passes = [(float(m[2]), float(m[3])) for m in _PASS.finditer(stdout)]
    passes = passes[1:] if len(passes) > 2 else passes
    if not passes:
        return None
    return LoadResult(statistics.median(t for t, _ in passes), None, None,
                      statistics.median(p for _, p in passes) / 1e3, False, "perf_analyzer")


class PerfAnalyzerLoad:
    """One perf_analyzer process per point (``--concurrency-range N``)."""

    name = "perf_analyzer"

    def __init__(self, located: Located, window: WindowSettings) -> None:
        assert located.path is not None
        self.located, self.window = located, window

    def run(self, url: str, model: str, concurrency: int) -> LoadResult:
        budget_s = 60 + self.window.max_trials * self.window.measurement_interval_ms / 1e3 * 3
        with tempfile.TemporaryDirectory(prefix="ferry-analyzer-") as tmp:
            csv_path = Path(tmp) / "point.csv"
            argv = [str(self.located.path), *perf_args(model, url, concurrency, self.window, str(csv_path))]
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=budget_s,
                                      env=dict(self.located.env), **placement.confined(self.window.client_cpus))
            except subprocess.TimeoutExpired:
                return LoadResult.failed(self.name, f"perf_analyzer timed out after {budget_s:.0f} s")
            except OSError as exc:
                return LoadResult.failed(self.name, f"perf_analyzer could not run: {exc}")
            stdout = proc.stdout + proc.stderr
            if csv_path.exists() and csv_path.stat().st_size > 0:
                try:
                    return result_from_csv(parse_csv(csv_path.read_text()))
                except ValueError as exc:
                    return LoadResult.failed(self.name, str(exc))
        if "Failed to obtain stable measurement" in stdout:
            estimate = result_from_passes(stdout)
            if estimate is not None and math.isfinite(estimate.p99_ms):
                return estimate
        tail = " | ".join(stdout.strip().splitlines()[-3:]) or "no output"
        return LoadResult.failed(self.name, f"perf_analyzer exited {proc.returncode}: {tail}")
