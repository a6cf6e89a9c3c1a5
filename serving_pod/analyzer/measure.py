"""One measurement: a configuration already loaded on the server, driven at one concurrency.

:func:`measure` brackets the load generator's run with statistics snapshots (server queue and compute
time per request) and a resource sampler (server CPU, RSS, GPU memory). The resulting
:class:`Measurement` is the unit the checkpoint stores and everything downstream ranks and plots.
Neighbours: ``loadgen`` (client figures), ``stats``, ``resources``, ``target`` (the server).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from serving_pod.analyzer.loadgen import LoadGenerator
from serving_pod.analyzer.resources import ResourceSampler
from serving_pod.analyzer.stats import StatsSnapshot, breakdown
from serving_pod.analyzer.target import ServerClient


@dataclass(frozen=True)
class Measurement:
    """Figures of one (model, configuration, concurrency); latencies in ms, server times in µs, memory in MiB."""

    model: str
    config_key: str
    concurrency: int
    throughput: float
    p99_ms: float
    p50_ms: float | None = None
    p95_ms: float | None = None
    queue_us: float | None = None
    compute_us: float | None = None
    avg_batch: float | None = None
    cpu_percent: float | None = None
    rss_mb: float | None = None
    gpu_mb: float | None = None
    stable: bool = True
    tool: str = ""
    window: str = ""
    error: str = ""
    #: 0 for the search's measurement, 1.. for verification repeats of the same point
    trial: int = 0

    @property
    def ok(self) -> bool:
        return not self.error and math.isfinite(self.throughput) and math.isfinite(self.p99_ms)

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key in ("throughput", "p99_ms"):  # JSON has no NaN
            if not math.isfinite(data[key]):
                data[key] = None
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for key in ("throughput", "p99_ms"):
            if values.get(key) is None:
                values[key] = math.nan
        return cls(**values)


def failed(model: str, config_key: str, concurrency: int, error: str, window: str, trial: int = 0) -> Measurement:
    return Measurement(model, config_key, concurrency, math.nan, math.nan, stable=False, window=window, error=error,
                       trial=trial)


_FIGURES = ("throughput", "p99_ms", "p50_ms", "p95_ms", "queue_us", "compute_us", "avg_batch", "cpu_percent",
            "rss_mb", "gpu_mb")


def combine(trials: list[Measurement]) -> Measurement:
    """One point's successful trials as one: the median of each figure (``trial`` = how many were combined).

    Verification repeats the best points; ranking their medians rather than their single best window keeps a
    lucky window (on a shared machine) from deciding the recommendation.
    """
    import statistics

    ok = [m for m in trials if m.ok]
    if len(ok) <= 1:
        return ok[0] if ok else trials[0]
    values: dict[str, Any] = {}
    for name in _FIGURES:
        present = [getattr(m, name) for m in ok if getattr(m, name) is not None]
        values[name] = statistics.median(present) if present else None
    return dataclasses.replace(ok[0], **values, stable=all(m.stable for m in ok), trial=len(ok))


def points(measurements: list[Measurement]) -> list[Measurement]:
    """Every (configuration, concurrency) once, its trials combined (see :func:`combine`)."""
    groups: dict[tuple[str, int], list[Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.config_key, m.concurrency), []).append(m)
    return [combine(group) for group in groups.values()]


def measure(client: ServerClient, pid: int | None, load: LoadGenerator, url: str, model: str, config_key: str,
            concurrency: int, window: str, trial: int = 0) -> Measurement:
    """Run the load against ``url`` and assemble one :class:`Measurement` (errors are recorded, not raised)."""
    before = StatsSnapshot.from_response(client.statistics(model))
    with ResourceSampler(pid) as sampler:
        result = load.run(url, model, concurrency)
    after = StatsSnapshot.from_response(client.statistics(model))
    server = breakdown(before, after)
    usage = sampler.usage()
    error = result.error
    if not error and server.failures:
        error = f"{server.failures} request(s) failed on the server during the measurement"
    return Measurement(
        model=model, config_key=config_key, concurrency=concurrency,
        throughput=result.throughput, p99_ms=result.p99_ms, p50_ms=result.p50_ms, p95_ms=result.p95_ms,
        queue_us=server.queue_us if server.requests else None,
        compute_us=server.compute_us if server.requests else None,
        avg_batch=server.avg_batch if server.requests else None,
        cpu_percent=usage.cpu_percent, rss_mb=usage.rss_mb, gpu_mb=usage.gpu_mb,
        stable=result.stable, tool=result.tool, window=window, error=error, trial=trial,
    )
