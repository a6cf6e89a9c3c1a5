"""Server-side figures of one measurement: deltas of the statistics extension around the load window.

The statistics extension is cumulative (Triton's shape: ``inference_stats.queue.{count,ns}`` ...), so a
measurement takes a snapshot before and after its load and divides the differences by the number of
successful requests in between — the same derivation perf_analyzer prints as its ``Server:`` block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True)
class StatsSnapshot:
    """Cumulative counters of one model (all versions summed); durations in nanoseconds."""

    success_count: int = 0
    fail_count: int = 0
    queue_ns: int = 0
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0
    inference_count: int = 0
    execution_count: int = 0

    @classmethod
    def from_response(cls, payload: dict[str, Any]) -> StatsSnapshot:
        totals = dict.fromkeys(cls.__dataclass_fields__, 0)
        for entry in payload.get("model_stats", []):
            stats = entry.get("inference_stats", {})
            for name in _DURATIONS:
                duration = stats.get(name, {})
                if name in ("success", "fail"):
                    totals[f"{name}_count"] += int(duration.get("count", 0))
                else:
                    totals[f"{name}_ns"] += int(duration.get("ns", 0))
            totals["inference_count"] += int(entry.get("inference_count", 0))
            totals["execution_count"] += int(entry.get("execution_count", 0))
        return cls(**totals)


@dataclass(frozen=True)
class ServerBreakdown:
    """Per-request averages over one window (microseconds) and the average executed batch."""

    requests: int
    failures: int
    queue_us: float
    compute_us: float
    avg_batch: float


def breakdown(before: StatsSnapshot, after: StatsSnapshot) -> ServerBreakdown:
    """Averages between two snapshots (zeros when no request succeeded in between)."""
    requests = after.success_count - before.success_count
    failures = after.fail_count - before.fail_count
    executions = after.execution_count - before.execution_count
    inferences = after.inference_count - before.inference_count
    if requests <= 0:
        return ServerBreakdown(0, failures, 0.0, 0.0, 0.0)
    compute = ((after.compute_input_ns - before.compute_input_ns) + (after.compute_infer_ns - before.compute_infer_ns)
               + (after.compute_output_ns - before.compute_output_ns))
    return ServerBreakdown(
        requests=requests,
        failures=failures,
        queue_us=(after.queue_ns - before.queue_ns) / requests / 1e3,
        compute_us=compute / requests / 1e3,
        avg_batch=inferences / executions if executions > 0 else 0.0,
    )
