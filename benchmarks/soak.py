"""Memory soak: keep a server under perf_analyzer load for N minutes and sample its RSS (process tree).

The performance issue's memory target: RSS at the end of a c=16 run within 10% of RSS after its first
minute. perf_analyzer runs with one window longer than the soak and is stopped at the deadline, so the load
never pauses. Neighbours: ``servers`` (process and RSS), ``compare_triton`` (caller).
"""

from __future__ import annotations

import math
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks import perfcsv, report, servers
from tests.support.perf_analyzer import Located

SAMPLE_EVERY_S = 5.0


@dataclass(frozen=True)
class SoakResult:
    server: str
    protocol: str
    concurrency: int
    minutes: float
    idle_rss_mib: float
    rss_1min_mib: float
    rss_end_mib: float
    growth: float
    samples: tuple[tuple[float, float], ...]
    requests: int = -1
    error: str = ""


def rss_at(samples: tuple[tuple[float, float], ...], at_s: float) -> float:
    """The sample taken closest to ``at_s`` seconds into the run (NaN without samples)."""
    if not samples:
        return math.nan
    return min(samples, key=lambda s: abs(s[0] - at_s))[1]


def success_count(port: int, model: str) -> int:
    """The model's ``inference_stats.success.count`` (-1 when it cannot be read)."""
    try:
        return int(sum(s["inference_stats"]["success"]["count"] for s in servers.model_stats(port, model)))
    except (OSError, ValueError, KeyError):
        return -1


def soak(spec: servers.ServerSpec, ports: servers.Ports, pa: Located, model: str, minutes: float,
         logs: Path, *, protocol: str = "http", concurrency: int = 16) -> SoakResult:
    """Run ``spec`` under ``concurrency`` load for ``minutes``, sampling RSS every few seconds."""
    logs.mkdir(parents=True, exist_ok=True)
    duration = minutes * 60.0
    samples: list[tuple[float, float]] = []
    error = ""
    with servers.Server(spec, ports, logs / f"{spec.name}-soak.server.log") as srv:
        srv.start(models=[model])
        time.sleep(2.0)
        idle = srv.rss_bytes() / (1024 * 1024)
        served_before = success_count(ports.http, model)
        port = ports.http if protocol == "http" else ports.grpc
        point = perfcsv.PerfSpec(model, f"127.0.0.1:{port}", protocol, concurrency,
                                 measurement_interval_ms=int(duration * 1000) + 120_000, percentile=None,
                                 max_trials=3)
        argv = pa.command(*perfcsv.perf_args(point, str(logs / f"{spec.name}-soak.csv")))
        with (logs / f"{spec.name}-soak.log").open("w") as out:
            load = subprocess.Popen(argv, env=dict(pa.env), stdout=out, stderr=subprocess.STDOUT)
            began = time.monotonic()
            try:
                while (elapsed := time.monotonic() - began) < duration:
                    time.sleep(min(SAMPLE_EVERY_S, max(0.0, duration - elapsed)))
                    samples.append((time.monotonic() - began, srv.rss_bytes() / (1024 * 1024)))
                    if load.poll() is not None:
                        error = f"perf_analyzer stopped early (exit {load.returncode})"
                        break
                    if not srv.alive():
                        error = f"server died: {srv.log_tail()}"
                        break
            finally:
                if load.poll() is None:
                    load.terminate()
                    load.wait(30)
        served = success_count(ports.http, model) - served_before
    frozen = tuple(samples)
    first, end = rss_at(frozen, 60.0), (frozen[-1][1] if frozen else math.nan)
    return SoakResult(spec.name, protocol, concurrency, minutes, idle, first, end, report.growth(first, end),
                      frozen, served, error)
