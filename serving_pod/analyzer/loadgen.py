"""What a load generator is to the analyzer, and which one a sweep uses.

A :class:`LoadGenerator` drives one model at one client concurrency for a bounded time and returns a
:class:`LoadResult` (client-side throughput and latency percentiles). Two exist: ``perf`` (NVIDIA's
perf_analyzer, preferred: the figures Triton users know) and ``builtin_load`` (a tritonclient aio loop,
used when perf_analyzer cannot be found). :func:`select` applies ``--load-generator``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from serving_pod.analyzer.errors import InputError

CHOICES = ("auto", "perf_analyzer", "builtin")


@dataclass(frozen=True)
class WindowSettings:
    """How each measurement runs (perf_analyzer's own vocabulary), and on which CPUs its client runs.

    ``client_cpus`` (``--client-cpus``; empty: any CPU) confines perf_analyzer (``placement``).
    """

    measurement_interval_ms: int = 600
    stability_percentage: float = 50.0
    max_trials: int = 6
    protocol: str = "http"
    client_cpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.measurement_interval_ms < 100:
            raise InputError(f"invalid --measurement-interval-ms {self.measurement_interval_ms}: must be >= 100")
        if not 0 < self.stability_percentage <= 1000:
            raise InputError(f"invalid --stability-percentage {self.stability_percentage:g}: must be in (0, 1000]")
        if self.max_trials < 3:
            raise InputError(f"invalid --max-trials {self.max_trials}: must be >= 3 (three windows must agree)")
        if self.protocol not in ("http", "grpc"):
            raise InputError(f"invalid protocol {self.protocol!r}: use http or grpc")

    def signature(self) -> str:
        """Measurements are reused from a checkpoint only under the same window settings."""
        signature = (f"{self.protocol}/{self.measurement_interval_ms}ms/"
                     f"{self.stability_percentage:g}%/{self.max_trials}")
        if self.client_cpus:  # absent otherwise: checkpoints written before the option stay usable
            signature += "/client-cpus=" + ",".join(map(str, self.client_cpus))
        return signature


@dataclass(frozen=True)
class LoadResult:
    """Client-side figures of one run; latencies in milliseconds. ``error`` set when nothing usable came out."""

    throughput: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float
    stable: bool
    tool: str
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and math.isfinite(self.throughput) and math.isfinite(self.p99_ms)

    @classmethod
    def failed(cls, tool: str, error: str) -> LoadResult:
        return cls(math.nan, None, None, math.nan, False, tool, error)


class LoadGenerator(Protocol):
    """Drives ``model`` at ``url`` (host:port of ``window.protocol``) with ``concurrency`` outstanding requests
    and reports what the client saw."""

    name: str
    window: WindowSettings

    def run(self, url: str, model: str, concurrency: int) -> LoadResult: ...


def select(choice: str, *, window: WindowSettings, perf_analyzer: str | None = None) -> LoadGenerator:
    """``auto``: perf_analyzer when found and runnable, else the built-in generator (no server needed yet)."""
    from serving_pod.analyzer import builtin_load, perf

    if choice not in CHOICES:
        raise InputError(f"invalid --load-generator {choice!r}: use one of {', '.join(CHOICES)}")
    if choice != "builtin":
        located = perf.locate(perf_analyzer)
        if located.path is not None:
            return perf.PerfAnalyzerLoad(located, window)
        if choice == "perf_analyzer" or window.client_cpus:
            needed = " (--client-cpus needs it)" if window.client_cpus else ""
            raise InputError(f"perf_analyzer is not available{needed}: {located.reason}")
    if window.client_cpus:
        raise InputError("--client-cpus needs perf_analyzer: the built-in load generator runs inside the "
                         "analyzer's own process")
    return builtin_load.BuiltinLoad(window)
