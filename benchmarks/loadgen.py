"""Run perf_analyzer for one measurement point and read its result (the only process-running part of it).

Each run writes ``<name>.csv`` and ``<name>.log`` (its stdout) into the run's log folder. perf_analyzer exits
2 when its windows never agree within the stability percentage (on a shared 2-core box p99 jumps between
windows while throughput holds). Such a point is retried ``retries`` times with the same flags, then taken
as the medians of its windows and flagged ``stable=False`` — the same treatment for every server.
``measure_point`` also reads the server's CPU per inference around the run (``cpu``) and gives the round's
``report.Measurement``. ``--client-cpus`` (``add_client_cpus``) confines perf_analyzer to some CPUs, as a
client machine of its own would be: on a 2-core box its threads otherwise end up on the core of Ferry's
event loop, and HTTP throughput falls over each run (benchmarks/README.md, "The client's CPUs").
Neighbours: ``perfcsv`` (flags and parsing), ``servers`` (the process under test).
"""

from __future__ import annotations

import argparse
import math
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from benchmarks import cpu, perfcsv, report
from serving_pod.analyzer import placement
from tests.support.perf_analyzer import Located, ensure_perf_analyzer


def start_run() -> tuple[Located | None, str]:
    """What every driver does first: SIGTERM unwinds (so the servers under test are stopped), perf_analyzer
    is located (None, after printing why not) and the run gets its UTC stamp for file names."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    pa = ensure_perf_analyzer()
    if not pa.ok:
        print(f"error: {pa.reason}", file=sys.stderr)
        return None, ""
    return pa, datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def add_client_cpus(parser: argparse.ArgumentParser) -> None:
    """The drivers' ``--client-cpus`` option (parsed to a tuple of CPU numbers; empty: any CPU)."""
    def cpus(text: str) -> tuple[int, ...]:
        try:
            return placement.parse_cpus(text, placement.usable_cpus())
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parser.add_argument("--client-cpus", type=cpus, default=(), metavar="LIST",
                        help="run perf_analyzer on these CPUs only, e.g. 1 or 2-3 (servers keep every CPU)")


def popen_kwargs(spec: perfcsv.PerfSpec) -> dict:
    """``subprocess`` keyword arguments that apply ``spec.cpus`` to the perf_analyzer process."""
    return placement.confined(spec.cpus)


@dataclass(frozen=True)
class PointResult:
    """The outcome of one point; NaN figures and an ``error`` when perf_analyzer produced nothing usable."""

    spec: perfcsv.PerfSpec
    throughput: float
    p99_us: float
    stable: bool
    server: tuple[perfcsv.ServerBreakdown, ...]
    attempts: int
    error: str = ""

    @property
    def ok(self) -> bool:
        return math.isfinite(self.throughput) and math.isfinite(self.p99_us)


def run_point(command: Sequence[str], env: Mapping[str, str], spec: perfcsv.PerfSpec, log_dir: Path, name: str,
              *, retries: int = 0, timeout: float = 600.0) -> PointResult:
    """Run ``command + perf_args(spec)``; see the module docstring for unstable measurements."""
    log_dir.mkdir(parents=True, exist_ok=True)
    csv_path, log_path = log_dir / f"{name}.csv", log_dir / f"{name}.log"
    nan = math.nan
    for attempt in range(1, retries + 2):
        csv_path.unlink(missing_ok=True)
        argv = [*command, *perfcsv.perf_args(spec, str(csv_path))]
        try:
            proc = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=timeout,
                                  **popen_kwargs(spec))
            stdout, rc = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout or ""
            stdout, rc = (out.decode(errors="replace") if isinstance(out, bytes) else out), None
        log_path.write_text(f"$ {perfcsv.join_command(argv)}\n{stdout}")
        breakdown = tuple(perfcsv.parse_server_breakdown(stdout))
        if rc == 0 and csv_path.exists():
            try:
                row = perfcsv.parse_csv(csv_path.read_text())[-1]
            except perfcsv.PerfOutputError as exc:
                return PointResult(spec, nan, nan, False, breakdown, attempt, str(exc))
            return PointResult(spec, row.throughput, row.p99_us, True, breakdown, attempt)
        tail = " | ".join(stdout.strip().splitlines()[-2:])
        error = f"perf_analyzer {'timed out' if rc is None else f'exit {rc}'}: {tail}"
        if not perfcsv.unstable(stdout):
            return PointResult(spec, nan, nan, False, breakdown, attempt, error)
        estimate = perfcsv.unstable_estimate(stdout)
        if attempt == retries + 1 and estimate is not None:
            return PointResult(spec, estimate[0], estimate[1], False, breakdown, attempt)
    return PointResult(spec, nan, nan, False, (), retries + 1, error)


def warm_up(command: Sequence[str], env: Mapping[str, str], spec: perfcsv.PerfSpec, log_dir: Path, name: str,
            seconds: float) -> None:
    """Load the server for ``seconds`` at ``spec``'s point, measuring nothing (one window, any outcome).

    A server that just started runs its first seconds slower: its code and data are cold and, in a virtual
    machine, memory the previous server freed comes back page by page. On the 2-core VM of 2026-11-25 the
    first point after a switch of servers measured at half speed, client included (perf_analyzer's own CPU
    per inference doubled), in two runs of two; a warm-up keeps that out of every server's figures alike.
    """
    if seconds <= 0:
        return
    window = replace(spec, measurement_interval_ms=max(100, int(seconds * 1000)), max_trials=1)
    run_point(command, env, window, log_dir, name, timeout=seconds + 120)


def measure_point(command: Sequence[str], env: Mapping[str, str], spec: perfcsv.PerfSpec, log_dir: Path, name: str,
                  *, server: str, round_no: int, server_pid: int, http_port: int,
                  retries: int = 0) -> tuple[PointResult, report.Measurement, cpu.CpuShare]:
    """``run_point`` with the server's and the client's CPU per inference of ``spec.model`` around it."""
    before = cpu.sample(server_pid, http_port, spec.model)
    res = run_point(command, env, spec, log_dir, name, retries=retries)
    used = cpu.share(before, cpu.sample(server_pid, http_port, spec.model))
    measurement = report.Measurement(server, spec.protocol, spec.concurrency, round_no, res.throughput, res.p99_us,
                                     res.stable, used.server_us, used.client_us, used.processes, used.busy)
    return res, measurement, used
