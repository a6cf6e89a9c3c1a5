"""Per model-version statistics in Triton's exact shape, and the source of the ``nv_*`` metrics.

Updated only on the engine's event loop thread (schedulers hand results back there), so plain
integer counters suffice: no locks on the hot path. The statistics extension and the Prometheus
collector both read these objects, so the two can never disagree.

Triton's invariants (perf_analyzer checks them): every successful request adds one to
``success``, ``queue`` and each ``compute_*`` count, and is charged its whole batch's compute time;
``execution_count`` counts executions, ``inference_count`` batch elements. ``last_inference`` moves with
executions only (Triton's ``UpdateInferBatchStats``): a failure the scheduler or an ensemble reports, or a
cache hit, leaves it where it was.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from serving_pod.core.latency_metrics import LatencyRecorder


class Duration:
    """A count and cumulative nanoseconds (Triton's ``StatisticDuration``)."""

    __slots__ = ("count", "ns")

    def __init__(self) -> None:
        self.count = 0
        self.ns = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


class BatchStats:
    __slots__ = ("compute_input", "compute_infer", "compute_output")

    def __init__(self) -> None:
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()


class StepCompute:
    """The compute times of one ensemble request's steps, summed: what the ensemble is charged as its
    ``compute_input`` / ``compute_infer`` / ``compute_output`` (Triton's per-request secondary aggregator, which
    each step's request is charged into as into its own model's statistics; ``schedulers/ensemble.py`` says
    what its steps add)."""

    __slots__ = ("input_ns", "infer_ns", "output_ns")

    def __init__(self) -> None:
        self.input_ns = 0
        self.infer_ns = 0
        self.output_ns = 0

    def add(self, input_ns: int, infer_ns: int, output_ns: int) -> None:
        self.input_ns += input_ns
        self.infer_ns += infer_ns
        self.output_ns += output_ns


#: Triton's failure reasons (label of ``nv_inference_request_failure``).
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


class Microseconds:
    """The ``nv_*_duration_us`` counters: Triton's metric reporter adds each request's durations in whole
    microseconds (truncated one by one, so the sums fall below the nanosecond totals divided by 1000), and only for
    requests that succeeded (a failed request adds nothing to them)."""

    __slots__ = ("request", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit", "cache_miss")

    def __init__(self) -> None:
        self.request = self.queue = self.compute_input = self.compute_infer = self.compute_output = 0
        self.cache_hit = self.cache_miss = 0


class ModelStats:
    """Statistics of one model version."""

    __slots__ = (
        "name", "version", "success", "fail", "queue", "compute_input", "compute_infer",
        "compute_output", "cache_hit", "cache_miss", "inference_count", "execution_count",
        "last_inference_ms", "batch_stats", "failures", "pending", "load_duration_s", "latency",
        "micros",
    )

    def __init__(self, name: str, version: str) -> None:
        self.name = name
        self.version = version
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.cache_hit = Duration()
        self.cache_miss = Duration()
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.batch_stats: dict[int, BatchStats] = {}
        self.failures: dict[str, int] = dict.fromkeys(FAILURE_REASONS, 0)
        self.pending = 0
        self.load_duration_s = 0.0
        #: summaries and histogram when ``--metrics-config`` turns them on (``core.latency_metrics``)
        self.latency: LatencyRecorder | None = None
        self.micros = Microseconds()

    def record_execution(
        self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int, inferences: int | None = None
    ) -> None:
        """One execution of ``batch_size`` elements by an instance (or one successful ensemble request);
        ``inferences``: the elements of its successful requests (all by default), the only ones Triton counts in
        ``inference_count``."""
        self.last_inference_ms = time.time_ns() // 1_000_000
        self.execution_count += 1
        self.inference_count += batch_size if inferences is None else inferences
        stats = self.batch_stats.get(batch_size)
        if stats is None:
            stats = self.batch_stats[batch_size] = BatchStats()
        stats.compute_input.add(input_ns)
        stats.compute_infer.add(infer_ns)
        stats.compute_output.add(output_ns)

    def record_success(
        self, request_ns: int, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """One successful request, charged its batch's whole compute time."""
        self.record_successes((request_ns,), (queue_ns,), input_ns, infer_ns, output_ns)

    def record_successes(
        self, request_ns: Sequence[int], queue_ns: Sequence[int], input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """The successful requests of one execution (their request and queue times), each charged the whole
        compute time: what ``record_success`` for each would record."""
        count = len(request_ns)
        self.success.add(sum(request_ns), count)
        self.queue.add(sum(queue_ns), count)
        self.compute_input.add(input_ns * count, count)
        self.compute_infer.add(infer_ns * count, count)
        self.compute_output.add(output_ns * count, count)
        micros = self.micros
        micros.request += sum(ns // 1000 for ns in request_ns)
        micros.queue += sum(ns // 1000 for ns in queue_ns)
        micros.compute_input += input_ns // 1000 * count
        micros.compute_infer += infer_ns // 1000 * count
        micros.compute_output += output_ns // 1000 * count
        latency = self.latency
        if latency is not None:
            for request, queued in zip(request_ns, queue_ns):
                latency.success(request, queued, input_ns, infer_ns, output_ns)

    def record_cache_hit(self, request_ns: int, lookup_ns: int) -> None:
        self.success.add(request_ns)
        self.queue.add(0)
        self.cache_hit.add(lookup_ns)
        self.micros.request += request_ns // 1000
        self.micros.cache_hit += lookup_ns // 1000
        if self.latency is not None:
            self.latency.cache_hit(0, lookup_ns)

    def record_cache_miss(self, ns: int) -> None:
        """Lookup and insertion time of a request the cache did not have."""
        self.cache_miss.add(ns)
        self.micros.cache_miss += ns // 1000
        if self.latency is not None:
            self.latency.cache_miss(ns)

    def record_failure(self, request_ns: int, reason: str = "BACKEND") -> None:
        self.fail.add(request_ns)
        self.failures[reason if reason in self.failures else "OTHER"] += 1

    def as_dict(self) -> dict[str, Any]:
        """Triton's ``model_stats[]`` entry (HTTP JSON shape; gRPC builds the same fields)."""
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_dict(),
                "fail": self.fail.as_dict(),
                "queue": self.queue.as_dict(),
                "compute_input": self.compute_input.as_dict(),
                "compute_infer": self.compute_infer.as_dict(),
                "compute_output": self.compute_output.as_dict(),
                "cache_hit": self.cache_hit.as_dict(),
                "cache_miss": self.cache_miss.as_dict(),
            },
            "response_stats": {},
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": stats.compute_input.as_dict(),
                    "compute_infer": stats.compute_infer.as_dict(),
                    "compute_output": stats.compute_output.as_dict(),
                }
                for size, stats in sorted(self.batch_stats.items())
            ],
            "memory_usage": [],
        }
