"""Custom metric families registered by models: Triton's ``TRITONSERVER_MetricFamily`` API, server side.

The engine owns one ``CustomMetrics`` store (``Engine.custom_metrics``). The python backend's
``pb_utils.MetricFamily`` / ``Metric`` (``backends.pb_metrics``) create and update entries in it,
directly in the server process or, for an isolated model, over its IPC channel; the metrics
endpoint exports it beside the ``nv_*`` families (``metrics.CustomMetricsCollector``).

Semantics are Triton's (prometheus-cpp underneath): a second family with an existing name and
the same kind shares the first one's series, a name taken by another kind is refused; a metric
whose labels match an existing series of its family shares that series. Every family handle has
an owner (a model instance): a series lives while a metric handle uses it, a family while one of
its handles is open, and ``release(owner)`` (the instance is unloaded) closes the owner's
handles, so its series leave ``/metrics``. Families without series are not exported.

Unlike Triton, a model cannot take the name of one of the server's own families (``SERVER_FAMILIES``):
Triton 2.51 hands the model its own ``nv_inference_count`` (the model then counts into the server's
series), where Ferry would print the name twice and break the whole scrape; the name is refused instead.
For the same reason a histogram's bounds must be finite and its labels cannot include ``le``.

Messages are the core's (the python backend adds Triton's prefixes). Handles are plain ints, so
an isolated model's process can hold them.
"""

from __future__ import annotations

import collections
import itertools
import math
import re
import threading
from dataclasses import dataclass, field

from serving_pod.core.errors import InvalidArgumentError

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
KINDS = {COUNTER: "COUNTER", GAUGE: "GAUGE", HISTOGRAM: "HISTOGRAM"}
OPERATIONS = ("increment", "set", "observe", "value")

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_DELETED = (
    "Invalid metric operation as the corresponding 'MetricFamily' has been deleted. The "
    "'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects have been deleted."
)


#: every family the server exports itself (``metrics``, ``core.latency_metrics``), whatever its options
SERVER_FAMILIES = frozenset({
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count", "nv_inference_exec_count",
    "nv_inference_request_duration_us", "nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us", "nv_inference_compute_output_duration_us",
    "nv_inference_pending_request_count", "nv_model_load_duration_secs",
    "nv_cache_num_hits_per_model", "nv_cache_hit_duration_per_model", "nv_cache_num_misses_per_model",
    "nv_cache_miss_duration_per_model",
    "nv_inference_request_summary_us", "nv_inference_queue_summary_us", "nv_inference_compute_input_summary_us",
    "nv_inference_compute_infer_summary_us", "nv_inference_compute_output_summary_us",
    "nv_cache_hit_summary_per_model", "nv_cache_miss_summary_per_model", "nv_inference_first_response_histogram_ms",
    "nv_cache_util", "nv_cache_num_entries", "nv_cache_num_hits", "nv_cache_num_misses", "nv_cache_num_lookups",
    "nv_cache_num_evictions", "nv_cache_lookup_duration", "nv_cache_insertion_duration",
    "nv_pinned_memory_pool_total_bytes", "nv_pinned_memory_pool_used_bytes",
    "nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes",
    "nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage",
    "nv_gpu_power_limit", "nv_energy_consumption",
})


class MetricError(InvalidArgumentError):
    """A refused metric call, with the core's wording."""


def check_operation(kind: int, operation: str, value: float = 0.0) -> None:
    """Refuse what a kind does not support, before anything changes (Triton's messages)."""
    unsupported = {
        "increment": kind == HISTOGRAM,
        "set": kind != GAUGE,
        "observe": kind != HISTOGRAM,
        "value": kind == HISTOGRAM,
    }.get(operation)
    if unsupported is None:
        raise MetricError(f"Unknown metric operation '{operation}'")
    if unsupported:
        raise MetricError(f"TRITONSERVER_METRIC_KIND_{KINDS[kind]} does not support {operation.capitalize()}")
    if operation == "increment" and kind == COUNTER and value < 0:
        raise MetricError(
            "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values."
        )


def label_key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """Labels checked as the core checks them, sorted by name (prometheus-cpp prints them so)."""
    for name, value in labels.items():
        if not isinstance(name, str) or not _LABEL_NAME.match(name) or name.startswith("__"):
            raise MetricError("Invalid label name")
        if not isinstance(value, str):
            raise MetricError("attempt to access JSON non-string as string")
    return tuple(sorted(labels.items()))


@dataclass(eq=False, slots=True)
class Series:
    """One labelled time series; histograms keep per-bucket counts (the last one is +Inf)."""

    labels: tuple[tuple[str, str], ...]
    buckets: tuple[float, ...] = ()
    value: float = 0.0
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    users: int = 0


@dataclass(eq=False, slots=True)
class Family:
    name: str
    description: str
    kind: int
    series: dict[tuple[tuple[str, str], ...], Series] = field(default_factory=dict)
    handles: int = 0


@dataclass(frozen=True, slots=True)
class FamilyView:
    """A consistent copy of one family for the exporter; ``series`` holds (labels, value, counts, sum)."""

    name: str
    description: str
    kind: int
    series: tuple[tuple[tuple[tuple[str, str], ...], float, tuple[tuple[float, int], ...], float], ...]


@dataclass(slots=True)
class _FamilyHandle:
    family: Family
    owner: str
    metrics: list[int] = field(default_factory=list)


class CustomMetrics:
    """Thread-safe store of custom families, series and the handles models hold on them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._families: dict[str, Family] = {}
        self._family_handles: dict[int, _FamilyHandle] = {}
        self._metric_handles: dict[int, tuple[Family, Series]] = {}
        #: family handles whose python objects were collected; closed under the lock later
        self._doomed: collections.deque[int] = collections.deque()

    def new_family(self, name: str, description: str, kind: int, owner: str = "") -> int:
        if kind not in KINDS:
            raise MetricError("Unsupported kind passed to MetricFamily constructor.")
        if not isinstance(name, str) or not _METRIC_NAME.match(name):
            raise MetricError("Invalid metric name")
        if name in SERVER_FAMILIES:
            raise MetricError(f"Family name already exists: '{name}' is one of the server's own metric families")
        with self._lock:
            self._reap()
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = Family(name, str(description), kind)
            elif family.kind != kind:
                raise MetricError("Family name already exists with different type")
            family.handles += 1
            handle = next(self._ids)
            self._family_handles[handle] = _FamilyHandle(family, owner)
            return handle

    def new_metric(self, family_handle: int, labels: dict[str, str], buckets: list[float] | None = None) -> int:
        key = label_key(labels)
        bounds = tuple(float(b) for b in buckets or ())
        if any(a >= b for a, b in itertools.pairwise(bounds)):  # Triton refuses [1, 1] too
            raise MetricError("Bucket Boundaries must be strictly sorted")
        if not all(map(math.isfinite, bounds)):  # Triton prints le="Nan" and a second +Inf bucket
            raise MetricError("Bucket Boundaries must be finite numbers")
        with self._lock:
            self._reap()
            owner = self._family_handles.get(family_handle)
            if owner is None:
                raise MetricError(_DELETED)
            family = owner.family
            if family.kind == HISTOGRAM and "le" in labels:  # Triton prints the label twice on every bucket
                raise MetricError("Invalid label name: 'le' is the histogram's bucket label")
            series = family.series.get(key)
            if series is None:
                counts = [0] * (len(bounds) + 1) if family.kind == HISTOGRAM else []
                series = family.series[key] = Series(key, bounds, counts=counts)
            series.users += 1
            handle = next(self._ids)
            self._metric_handles[handle] = (family, series)
            owner.metrics.append(handle)
            return handle

    def update(self, metric_handle: int, operation: str, value: float) -> None:
        """``increment``, ``set`` or ``observe`` one series."""
        with self._lock:
            family, series = self._metric(metric_handle)
            check_operation(family.kind, operation, value)
            if operation == "increment":
                series.value += value
            elif operation == "set":
                series.value = value
            else:
                index = next((i for i, bound in enumerate(series.buckets) if value <= bound), len(series.buckets))
                series.counts[index] += 1
                series.total += value

    def value(self, metric_handle: int) -> float:
        with self._lock:
            family, series = self._metric(metric_handle)
            check_operation(family.kind, "value")
            return series.value

    def _metric(self, handle: int) -> tuple[Family, Series]:
        if self._doomed:
            self._reap()
        entry = self._metric_handles.get(handle)
        if entry is None:
            raise MetricError(_DELETED)
        return entry

    def delete_family(self, family_handle: int) -> None:
        with self._lock:
            self._close(family_handle)

    def delete_family_later(self, family_handle: int) -> None:
        """For ``__del__``: takes no lock (a collection may run while this thread holds it)."""
        self._doomed.append(family_handle)

    def release(self, owner: str) -> None:
        """Close every family handle ``owner`` holds (its model instance was unloaded)."""
        with self._lock:
            for handle in [h for h, entry in self._family_handles.items() if entry.owner == owner]:
                self._close(handle)

    def families(self) -> list[FamilyView]:
        """Families with at least one series, copied under the lock, sorted by name."""
        with self._lock:
            self._reap()
            return [
                FamilyView(family.name, family.description, family.kind, tuple(
                    (s.labels, s.value, tuple(zip(s.buckets + (float("inf"),), itertools.accumulate(s.counts))), s.total)
                    for s in family.series.values()
                ))
                for family in sorted(self._families.values(), key=lambda f: f.name)
                if family.series
            ]

    def _reap(self) -> None:
        while self._doomed:
            self._close(self._doomed.popleft())

    def _close(self, family_handle: int) -> None:
        entry = self._family_handles.pop(family_handle, None)
        if entry is None:
            return
        family = entry.family
        for handle in entry.metrics:
            _, series = self._metric_handles.pop(handle)
            series.users -= 1
            if series.users == 0:
                family.series.pop(series.labels, None)
        family.handles -= 1
        if family.handles == 0 and self._families.get(family.name) is family:
            del self._families[family.name]
