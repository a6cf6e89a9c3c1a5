"""Prometheus metrics with Triton's exact ``nv_*`` names, read from the engine's statistics at scrape time.

A custom collector on its own ``CollectorRegistry`` (built in the composition root): nothing is
updated on the request path, so metrics cost nothing per request and always agree with the
statistics extension. CPU metrics come from psutil; GPU metrics from nvidia-ml-py (NVML) when a
GPU is present, else they are absent and the reason is logged once. The response cache's
server-wide families (``nv_cache_util`` ...) come from ``cache.ResponseCache``'s totals when
``--cache-config`` made a cache. The metric families models
register (python ``pb_utils.MetricFamily``, kept in ``core.custom_metrics``) follow the ``nv_*``
ones, under the names, help texts, kinds and labels the models gave.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from serving_pod.cache import cache_for
from serving_pod.core.custom_metrics import COUNTER, GAUGE, HISTOGRAM
from serving_pod.core.latency_metrics import (
    FIRST_RESPONSE_HELP, FIRST_RESPONSE_HISTOGRAM, SUMMARY_FAMILIES, WindowSummary,
)

log = logging.getLogger("ferry.metrics")

_LABELS = ["model", "version"]


class CounterFamily(Metric):
    """A counter exposed under its exact name (prometheus-client would append ``_total``; Triton does not)."""

    def __init__(self, name: str, documentation: str, labels: list[str] | None = None, value: float | None = None) -> None:
        super().__init__(name, documentation, "counter")
        self._label_names = labels or []
        if value is not None:
            self.add_sample(name, {}, value)

    def add_metric(self, labels: list[str], value: float) -> None:
        self.add_sample(self.name, dict(zip(self._label_names, labels)), value)


class InferenceCollector:
    """Per-model counters from ``ModelStats`` of every ready version."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        # Triton's order: prometheus-cpp prints every counter family before the gauges (pending, load)
        families: dict[str, Any] = {  # CounterFamily and GaugeMetricFamily: both take add_metric(labels, value)
            "success": CounterFamily("nv_inference_request_success", "Number of successful inference requests, all batch sizes", labels=_LABELS),
            "failure": CounterFamily("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", labels=_LABELS + ["reason"]),
            "count": CounterFamily("nv_inference_count", "Number of inferences performed (does not include cached requests)", labels=_LABELS),
            "exec": CounterFamily("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)", labels=_LABELS),
            "request_us": CounterFamily("nv_inference_request_duration_us", "Cumulative inference request duration in microseconds (includes cached requests)", labels=_LABELS),
            "queue_us": CounterFamily("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds (includes cached requests)", labels=_LABELS),
            "input_us": CounterFamily("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds (does not include cached requests)", labels=_LABELS),
            "infer_us": CounterFamily("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds (does not include cached requests)", labels=_LABELS),
            "output_us": CounterFamily("nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds (does not include cached requests)", labels=_LABELS),
            "cache_hits": CounterFamily("nv_cache_num_hits_per_model", "Number of cache hits per model", labels=_LABELS),
            "cache_hit_us": CounterFamily("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds", labels=_LABELS),
            "cache_misses": CounterFamily("nv_cache_num_misses_per_model", "Number of cache misses per model", labels=_LABELS),
            "cache_miss_us": CounterFamily("nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds", labels=_LABELS),
            "pending": GaugeMetricFamily("nv_inference_pending_request_count", "Instantaneous number of pending requests awaiting execution per-model.", labels=_LABELS),
            "load": GaugeMetricFamily("nv_model_load_duration_secs", "Model load time in seconds", labels=_LABELS),
        }
        settings = self.engine.options.latency_metrics
        if not settings.counter_latencies:  # Triton then creates neither the latency nor the cache counters
            for key in _LATENCY_COUNTERS:
                del families[key]
        summaries = {key: Metric(name, text, "summary") for key, name, text in SUMMARY_FAMILIES} \
            if settings.summary_latencies else {}
        first_response = Metric(FIRST_RESPONSE_HISTOGRAM, FIRST_RESPONSE_HELP, "histogram") \
            if settings.histogram_latencies else None
        for model in self.engine.registry.ready_models():
            stats = model.stats
            labels = [stats.name, stats.version]
            families["success"].add_metric(labels, stats.success.count)
            for reason, count in stats.failures.items():
                families["failure"].add_metric(labels + [reason], count)
            families["count"].add_metric(labels, stats.inference_count)
            families["exec"].add_metric(labels, stats.execution_count)
            families["pending"].add_metric(labels, model.scheduler.pending())
            families["load"].add_metric(labels, stats.load_duration_s)
            if settings.counter_latencies:
                micros = stats.micros  # successes only, truncated request by request (``Microseconds``)
                families["request_us"].add_metric(labels, micros.request)
                families["queue_us"].add_metric(labels, micros.queue)
                families["input_us"].add_metric(labels, micros.compute_input)
                families["infer_us"].add_metric(labels, micros.compute_infer)
                families["output_us"].add_metric(labels, micros.compute_output)
                if model.config.response_cache.enable:
                    families["cache_hits"].add_metric(labels, stats.cache_hit.count)
                    families["cache_misses"].add_metric(labels, stats.cache_miss.count)
                    families["cache_hit_us"].add_metric(labels, micros.cache_hit)
                    families["cache_miss_us"].add_metric(labels, micros.cache_miss)
            latency = stats.latency
            if latency is None:
                continue
            plain = {"model": stats.name, "version": stats.version}
            for key, summary in latency.summaries.items():
                _add_summary(summaries[key], plain, summary, latency.quantiles)
            if first_response is not None and latency.first_response is not None:
                histogram = latency.first_response
                _add_histogram(first_response, plain, histogram.count, histogram.total, histogram.cumulative())
        yield from families.values()
        yield from summaries.values()
        if first_response is not None:
            yield first_response


#: the families ``counter_latencies=false`` removes
_LATENCY_COUNTERS = ("request_us", "queue_us", "input_us", "infer_us", "output_us",
                     "cache_hits", "cache_misses", "cache_hit_us", "cache_miss_us")


def _add_summary(metric: Metric, labels: dict[str, str], summary: WindowSummary, quantiles: tuple[float, ...]) -> None:
    """prometheus-cpp's order: count, sum, then one sample per quantile."""
    metric.add_sample(f"{metric.name}_count", labels, summary.count)
    metric.add_sample(f"{metric.name}_sum", labels, summary.total)
    for quantile, value in zip(quantiles, summary.quantiles(quantiles)):
        metric.add_sample(metric.name, {**labels, "quantile": _number(quantile)}, value)


def _add_histogram(metric: Metric, labels: dict[str, str], count: int, total: float,
                   buckets: list[tuple[float, int]]) -> None:
    """prometheus-cpp's order: count, sum, then the cumulative buckets."""
    metric.add_sample(f"{metric.name}_count", labels, count)
    metric.add_sample(f"{metric.name}_sum", labels, total)
    for bound, running in buckets:
        metric.add_sample(f"{metric.name}_bucket", {**labels, "le": _number(bound)}, running)


class ResponseCacheCollector:
    """The server-wide ``nv_cache_*`` gauges of Triton's local response cache, only when ``--cache-config`` made one.

    Triton's local cache exports its running totals as gauges (not counters), copied from a polling thread, so
    its scrape can lag a request; Ferry reads the cache's own totals (``cache.ResponseCache``) at scrape time.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        cache = cache_for(self.engine)
        if cache is None:
            return
        yield GaugeMetricFamily("nv_cache_util", "Cache utilization [0.0 - 1.0]", value=cache.utilization())
        yield GaugeMetricFamily("nv_cache_num_entries", "Number of responses stored in response cache", value=len(cache))
        yield GaugeMetricFamily("nv_cache_num_hits", "Number of cache hits in response cache", value=cache.hits)
        yield GaugeMetricFamily("nv_cache_num_misses", "Number of cache misses in response cache", value=cache.misses)
        yield GaugeMetricFamily("nv_cache_num_lookups", "Number of cache lookups in response cache", value=cache.lookups)
        yield GaugeMetricFamily("nv_cache_num_evictions", "Number of cache evictions in response cache", value=cache.evictions)
        yield GaugeMetricFamily("nv_cache_lookup_duration", "Total cache lookup duration (hit and miss), in microseconds",
                                value=cache.lookup_ns // 1000)
        yield GaugeMetricFamily("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds",
                                value=cache.insert_ns // 1000)


class CustomMetricsCollector:
    """Families models registered (``engine.custom_metrics``), exported as Triton exports them."""

    _TYPES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}

    def __init__(self, store: Any) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        for family in self.store.families():
            metric = Metric(family.name, family.description, self._TYPES[family.kind])
            for labels, value, buckets, total in family.series:
                plain = dict(labels)
                if family.kind != HISTOGRAM:
                    metric.add_sample(family.name, plain, value)
                    continue
                _add_histogram(metric, plain, buckets[-1][1], total, buckets)
            yield metric


class PinnedMemoryCollector:
    """``nv_pinned_memory_pool_{total,used}_bytes``, which Triton exports on every server, CPU-only ones too.

    Ferry keeps no pinned host memory pool (``--pinned-memory-pool-byte-size`` has no effect), so both read 0.
    Triton 2.51 reads 0 until its first metrics poll, then the configured pool size (256 MiB by default) as the
    total, even on a CPU-only host where it holds no pool; Ferry keeps to what it holds.
    """

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("nv_pinned_memory_pool_total_bytes", "Pinned memory pool total memory size, in bytes", value=0)
        yield GaugeMetricFamily("nv_pinned_memory_pool_used_bytes", "Pinned memory pool used memory size, in bytes", value=0)


class CpuCollector:
    """``nv_cpu_utilization`` and ``nv_cpu_memory_{total,used}_bytes`` (psutil)."""

    def __init__(self) -> None:
        import psutil

        self.psutil = psutil
        psutil.cpu_percent(None)  # prime the utilization window

    def collect(self) -> Iterator[Metric]:
        memory = self.psutil.virtual_memory()
        yield GaugeMetricFamily("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", value=self.psutil.cpu_percent(None) / 100.0)
        yield GaugeMetricFamily("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", value=memory.total)
        yield GaugeMetricFamily("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", value=memory.total - memory.available)


class GpuCollector:
    """Triton's GPU metrics through NVML, one series per GPU labelled ``gpu_uuid``.

    As in Triton, ``nv_energy_consumption`` counts from the server's start (NVML's total since the driver
    loaded, less its value when this collector was made), and each field is read on its own: one a GPU does
    not support (power on some boards) leaves the others.
    """

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self.uuids = [_text(nvml.nvmlDeviceGetUUID(h)) for h in self.handles]
        self.energy_start = [self._read(nvml.nvmlDeviceGetTotalEnergyConsumption, h, "energy") for h in self.handles]

    def _read(self, query: Callable[[Any], Any], handle: Any, what: str) -> Any:
        try:
            return query(handle)
        except self.nvml.NVMLError as exc:  # a GPU that stops answering must not break the scrape
            log.debug("NVML %s query failed: %s", what, exc)
            return None

    def collect(self) -> Iterator[Metric]:
        nvml, read = self.nvml, self._read
        util = GaugeMetricFamily("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", labels=["gpu_uuid"])
        total = GaugeMetricFamily("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", labels=["gpu_uuid"])
        used = GaugeMetricFamily("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", labels=["gpu_uuid"])
        power = GaugeMetricFamily("nv_gpu_power_usage", "GPU power usage in watts", labels=["gpu_uuid"])
        limit = GaugeMetricFamily("nv_gpu_power_limit", "GPU power management limit in watts", labels=["gpu_uuid"])
        energy = CounterFamily("nv_energy_consumption", "GPU energy consumption in joules since the Triton Server started", labels=["gpu_uuid"])
        for index, (handle, uuid) in enumerate(zip(self.handles, self.uuids)):
            rates = read(nvml.nvmlDeviceGetUtilizationRates, handle, "utilization")
            if rates is not None:
                util.add_metric([uuid], rates.gpu / 100.0)
            memory = read(nvml.nvmlDeviceGetMemoryInfo, handle, "memory")
            if memory is not None:
                total.add_metric([uuid], memory.total)
                used.add_metric([uuid], memory.used)
            milliwatts = read(nvml.nvmlDeviceGetPowerUsage, handle, "power")
            if milliwatts is not None:
                power.add_metric([uuid], milliwatts / 1000.0)
            milliwatts = read(nvml.nvmlDeviceGetPowerManagementLimit, handle, "power limit")
            if milliwatts is not None:
                limit.add_metric([uuid], milliwatts / 1000.0)
            millijoules, start = read(nvml.nvmlDeviceGetTotalEnergyConsumption, handle, "energy"), self.energy_start[index]
            if millijoules is not None:
                if start is None:
                    start = self.energy_start[index] = millijoules
                energy.add_metric([uuid], (millijoules - start) / 1000.0)
        yield from (util, total, used, power, limit, energy)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def open_nvml() -> tuple[Any, str]:
    """The initialized ``pynvml`` module, or None and the reason GPU metrics are off."""
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install ferry[gpu])"
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            return None, "NVML found no GPU"
    except pynvml.NVMLError as exc:
        return None, f"NVML is not available: {exc}"
    return pynvml, ""


def build_registry(engine: Any, *, gpu_metrics: bool = True, cpu_metrics: bool = True) -> CollectorRegistry:
    """The server's own metrics registry (never the global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(InferenceCollector(engine))
    registry.register(PinnedMemoryCollector())  # Triton's order: after the per-model families, before CPU
    if cpu_metrics:
        registry.register(CpuCollector())
    if gpu_metrics:
        nvml, reason = open_nvml()
        if nvml is not None:
            registry.register(GpuCollector(nvml))
        else:
            log.info("GPU metrics disabled: %s", reason)
    # Triton's order: the cache registers its families after the server's own, before any a model registers
    registry.register(ResponseCacheCollector(engine))
    custom = getattr(engine, "custom_metrics", None)
    if custom is not None:
        registry.register(CustomMetricsCollector(custom))
    return registry


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    # help texts may come from models (custom metrics); the text format escapes only these two
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if value != value:  # models may set a gauge to NaN or infinity: the text format has names for them
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 2**63:
        return str(int(value))
    return repr(float(value))


def _label_order(label: tuple[str, Any]) -> tuple[bool, str]:
    """prometheus-cpp's order: a series' labels sorted by name (a std::map), then ``le`` or ``quantile``."""
    return label[0] in ("le", "quantile"), label[0]


def render(registry: CollectorRegistry) -> bytes:
    """Prometheus text format with names exactly as Triton exposes them (no ``_total`` suffix)."""
    lines: list[str] = []
    for metric in registry.collect():
        if not metric.samples:  # prometheus-cpp leaves out a family with no series (cache families without a cache)
            continue
        lines.append(f"# HELP {metric.name} {_escape_help(metric.documentation)}")
        lines.append(f"# TYPE {metric.name} {metric.type}")
        for sample in metric.samples:
            if sample.labels:
                labels = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(sample.labels.items(), key=_label_order))
                lines.append(f"{sample.name}{{{labels}}} {_number(sample.value)}")
            else:
                lines.append(f"{sample.name} {_number(sample.value)}")
    return ("\n".join(lines) + "\n").encode()
