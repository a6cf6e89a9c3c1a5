"""Triton's optional latency metrics: summaries and the first-response histogram, per model version.

``--metrics-config`` switches them as tritonserver does (``MetricReporterConfig::ParseConfig`` in Triton's
core): ``counter_latencies=false`` drops the cumulative ``nv_inference_*_duration_us`` counters (and the
cache counters), ``summary_latencies=true`` adds the ``nv_inference_*_summary_us`` summaries (and
``nv_cache_{hit,miss}_summary_per_model`` for models with the response cache), ``histogram_latencies=true``
adds ``nv_inference_first_response_histogram_ms`` for decoupled models only (Triton's core after 2.51 does
so "to reduce metric output"; 2.51 itself has no histogram), and ``summary_quantiles=<q>:<error>,...`` sets
the quantiles. Only the exact words ``true`` / ``false`` switch a setting, as in Triton. A model version
with nothing to record gets no ``LatencyRecorder`` (``recorder_for``), so its requests pay nothing.

Values are Triton's: summaries observe whole microseconds (``ns // 1000``) per request, the histogram whole
milliseconds from the request's arrival to its first response (success or error, after validation). Its
buckets are 100, 500, 2000 and 5000 ms unless the model config's ``model_metrics`` gives others for
``nv_inference_first_response_histogram_ms``.

Summary quantiles cover a sliding window as prometheus-cpp's do (60 s, five age buckets of 12 s: the oldest
live bucket holds the last 48 to 60 s); ``_count`` and ``_sum`` cover the whole life of the model version.
prometheus-cpp estimates quantiles with CKMS within the configured rank error; here each 12 s bucket keeps
the observed values themselves, so quantiles are exact (nearest rank) up to ``SAMPLE_CAP`` observations per
bucket and a uniform sample of them beyond (rank error about 1e-4 at the cap), which bounds memory at
``SAMPLE_CAP`` values per bucket. Observation costs an append on the event loop thread; quantiles are
computed at scrape time.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
import time
from array import array
from bisect import bisect_left
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

import numpy as np

from serving_pod.core.errors import ModelLoadError

log = logging.getLogger("ferry.metrics")

#: Triton's default ``summary_quantiles`` ({quantile, rank error} pairs)
DEFAULT_QUANTILES: tuple[tuple[float, float], ...] = (
    (0.5, 0.05), (0.9, 0.01), (0.95, 0.001), (0.99, 0.001), (0.999, 0.001),
)
FIRST_RESPONSE_HISTOGRAM = "nv_inference_first_response_histogram_ms"
#: Triton's default bucket bounds of the first-response histogram (milliseconds)
DEFAULT_FIRST_RESPONSE_BUCKETS: tuple[float, ...] = (100, 500, 2000, 5000)
#: prometheus-cpp's Summary defaults
MAX_AGE_S = 60.0
AGE_BUCKETS = 5
#: observed values kept per summary per age bucket; a uniform sample beyond
SAMPLE_CAP = 16384

#: (key in ``LatencyRecorder.summaries``, family name, help text) in Triton's order
SUMMARY_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("request", "nv_inference_request_summary_us",
     "Summary of inference request duration in microseconds (includes cached requests)"),
    ("queue", "nv_inference_queue_summary_us",
     "Summary of inference queuing duration in microseconds (includes cached requests)"),
    ("compute_input", "nv_inference_compute_input_summary_us",
     "Cumulative compute input duration in microseconds (does not include cached requests)"),
    ("compute_infer", "nv_inference_compute_infer_summary_us",
     "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    ("compute_output", "nv_inference_compute_output_summary_us",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
    ("cache_hit", "nv_cache_hit_summary_per_model", "Summary of cache hit counts/durations per model, in microseconds."),
    ("cache_miss", "nv_cache_miss_summary_per_model", "Summary of cache miss counts/durations per model, in microseconds."),
)
FIRST_RESPONSE_HELP = "Duration from request to first response in milliseconds"


@dataclass(frozen=True, slots=True)
class LatencyMetricsSettings:
    """The latency-metric switches of ``--metrics-config`` (tritonserver's defaults)."""

    counter_latencies: bool = True
    summary_latencies: bool = False
    histogram_latencies: bool = False
    summary_quantiles: tuple[tuple[float, float], ...] = DEFAULT_QUANTILES

    @property
    def per_request(self) -> bool:
        """Whether each model version needs a ``LatencyRecorder``."""
        return self.summary_latencies or self.histogram_latencies


def parse_metrics_config(pairs: Iterable[tuple[str, str]]) -> tuple[LatencyMetricsSettings, list[str]]:
    """Settings from ``--metrics-config`` (setting, value) pairs, and a warning for each one ignored.

    Like Triton: only ``false`` turns counters off and only ``true`` turns the others on; a quantile pair
    that does not parse is skipped with a warning, and a list with no valid pair keeps the defaults.
    """
    switches = {"counter_latencies": True, "summary_latencies": False, "histogram_latencies": False}
    quantiles = DEFAULT_QUANTILES
    warnings: list[str] = []
    for key, value in pairs:
        if key == "summary_quantiles":
            parsed, problems = parse_quantiles(value)
            warnings.extend(problems)
            if parsed:
                quantiles = parsed
        elif key not in switches:
            warnings.append(f"--metrics-config {key}={value}: unknown setting, ignored")
        else:
            # the default stays unless the value is exactly the other word
            switches[key] = value != "false" if key == "counter_latencies" else value == "true"
            if value not in ("true", "false"):
                warnings.append(f"--metrics-config {key}={value}: neither 'true' nor 'false', so {key} is "
                                f"{'true' if switches[key] else 'false'}")
    counters, summaries, histograms = switches.values()
    return LatencyMetricsSettings(counters, summaries, histograms, quantiles), warnings


def parse_quantiles(text: str) -> tuple[tuple[tuple[float, float], ...], list[str]]:
    """``"0.5:0.05,0.9:0.01"`` -> ((0.5, 0.05), (0.9, 0.01)) and a message per pair skipped."""
    pairs: list[tuple[float, float]] = []
    problems: list[str] = []
    for item in text.split(","):
        quantile, sep, error = item.partition(":")
        if not sep:
            problems.append(f"summary_quantiles: invalid option [{item}]. No ':' delimiter found. "
                            "Expected format is <quantile>:<error>")
            continue
        try:
            q, e = float(quantile), float(error)
        except ValueError:
            problems.append(f"summary_quantiles: invalid option [{item}]: not two numbers")
            continue
        # Triton takes any pair (a quantile of 1.5 is exported as such); an error over 1 only loosens its estimate,
        # and Ferry's quantiles are exact, so only the quantile and a negative error are refused
        if not (0.0 <= q <= 1.0 and e >= 0.0):
            problems.append(f"summary_quantiles: invalid option [{item}]: the quantile must be in [0, 1] and the "
                            "error not negative")
            continue
        pairs.append((q, e))
    return tuple(pairs), problems


class WindowSummary:
    """One summary: lifetime count and sum, quantiles over the last ``MAX_AGE_S`` (module docstring).

    ``observe`` reads the clock itself; ``LatencyRecorder`` reads it once per request instead and calls
    ``rotate_if_due`` then ``add`` on each of its summaries.
    """

    __slots__ = ("count", "total", "_clock", "_starts", "_values", "_seen", "_current", "_current_seen",
                 "_next_start", "_random")

    def __init__(self, clock: Callable[[], float] = time.monotonic, seed: int | None = None) -> None:
        self.count = 0
        self.total = 0.0
        self._clock = clock
        #: closed age buckets still in the window, oldest first: start time, kept values, observations seen
        self._starts: list[float] = []
        self._values: list[array | np.ndarray] = []  # a closed bucket's array, sorted at the first query after
        self._seen: list[int] = []
        #: the open bucket (its start is ``_next_start - width``)
        self._current = array("d")
        self._current_seen = 0
        self._next_start = -math.inf  # the first observation opens a bucket
        self._random = random.Random(seed)

    def observe(self, value: float) -> None:
        self.rotate_if_due(self._clock())
        self.add(value)

    def rotate_if_due(self, now: float) -> None:
        if now < self._next_start:
            return
        width = MAX_AGE_S / AGE_BUCKETS
        if self._next_start == -math.inf:
            start = now
        else:  # the open bucket closes; the new one starts on the grid of the first
            self._starts.append(self._next_start - width)
            self._values.append(self._current)
            self._seen.append(self._current_seen)
            start = self._next_start + width * ((now - self._next_start) // width)
        self._current = array("d")
        self._current_seen = 0
        self._next_start = start + width
        self._expire(now)

    def add(self, value: float) -> None:
        """One observation in the open bucket (``rotate_if_due`` called for the current time)."""
        self.count += 1
        self.total += value
        seen = self._current_seen = self._current_seen + 1
        if seen <= SAMPLE_CAP:
            self._current.append(value)
        else:  # reservoir sampling: every observation of the bucket is kept with the same chance
            slot = int(self._random.random() * seen)
            if slot < SAMPLE_CAP:
                self._current[slot] = value

    def _expire(self, now: float) -> None:
        while self._starts and self._starts[0] + MAX_AGE_S <= now:
            del self._starts[0], self._values[0], self._seen[0]

    @property
    def next_rotation(self) -> float:
        """When the open age bucket closes."""
        return self._next_start

    def kept(self) -> int:
        """Values held in memory (at most ``SAMPLE_CAP`` per age bucket)."""
        return sum(map(len, self._values)) + len(self._current)

    def quantiles(self, wanted: Iterable[float]) -> list[float]:
        """The value at each quantile over the window (nearest rank); NaN for an empty window.

        Runs on the event loop at scrape time, so it stays cheap: a closed bucket is sorted once (its values no
        longer change), the open one at each call; with every bucket kept whole (no sampling) the ranks index
        the merged values directly, else each value weighs what its bucket saw per value kept.
        """
        now = self._clock()
        self._expire(now)
        for index, values in enumerate(self._values):
            if isinstance(values, array):
                self._values[index] = np.sort(np.frombuffer(values, dtype=np.float64))
        parts = [(values, seen) for values, seen in zip(self._values, self._seen) if len(values)]
        if self._current and now < self._next_start + MAX_AGE_S - MAX_AGE_S / AGE_BUCKETS:  # open bucket in the window
            parts.append((np.sort(np.frombuffer(self._current, dtype=np.float64)), self._current_seen))
        wanted = list(wanted)
        if not parts:
            return [math.nan] * len(wanted)
        # (1 - 1e-12): 0.9 * 10 is 9.000000000000002, whose nearest rank is still the 9th
        if all(len(values) == seen for values, seen in parts):
            merged = np.sort(np.concatenate([values for values, _ in parts]))
            last = len(merged) - 1
            return [float(merged[min(max(math.ceil(q * len(merged) * (1 - 1e-12)) - 1, 0), last)]) for q in wanted]
        values = np.concatenate([values for values, _ in parts])
        weights = np.concatenate([np.full(len(v), seen / len(v)) for v, seen in parts])
        order = np.argsort(values, kind="stable")  # sorted runs: close to linear
        values = values[order]
        cumulative = np.cumsum(weights[order])
        total = cumulative[-1]
        last = len(values) - 1
        return [float(values[min(int(np.searchsorted(cumulative, q * total * (1 - 1e-12), side="left")), last)])
                for q in wanted]


class Histogram:
    """A cumulative histogram with fixed upper bounds (prometheus-cpp's ``Histogram``)."""

    __slots__ = ("bounds", "counts", "count", "total")

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(sorted(set(float(b) for b in bounds)))
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it) for every bound, then +Inf (as ``CustomMetrics.families`` does)."""
        return list(zip((*self.bounds, math.inf), itertools.accumulate(self.counts)))


class LatencyRecorder:
    """The summaries and histogram of one model version; ``ModelStats`` feeds it when it exists."""

    __slots__ = ("summaries", "first_response", "quantiles", "_clock", "_due", "_request", "_queue", "_input",
                 "_infer", "_output")

    def __init__(self, settings: LatencyMetricsSettings, *, cache_enabled: bool = False,
                 first_response_buckets: Iterable[float] = DEFAULT_FIRST_RESPONSE_BUCKETS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.quantiles = tuple(q for q, _ in settings.summary_quantiles)
        self.summaries: dict[str, WindowSummary] = {}
        if settings.summary_latencies:
            keys = ["queue", "compute_input", "compute_infer", "compute_output"]
            # Triton leaves the request summary out for a model with the response cache (its DLIS-4762)
            keys = (["cache_hit", "cache_miss"] + keys) if cache_enabled else (["request"] + keys)
            self.summaries = {key: WindowSummary(clock) for key in keys}
        self.first_response = Histogram(first_response_buckets) if settings.histogram_latencies else None
        self._clock = clock
        #: the soonest any summary's age bucket closes: one clock read per request, no per-summary checks
        self._due = -math.inf
        get = self.summaries.get
        self._request, self._queue, self._input = get("request"), get("queue"), get("compute_input")
        self._infer, self._output = get("compute_infer"), get("compute_output")

    def success(self, request_ns: int, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        summaries = self.summaries
        if not summaries:
            return
        now = self._clock()
        if now >= self._due:
            for summary in summaries.values():
                summary.rotate_if_due(now)
            self._due = min(summary.next_rotation for summary in summaries.values())
        if self._request is not None:
            self._request.add(request_ns // 1000)
        self._queue.add(queue_ns // 1000)  # type: ignore[union-attr]  # present whenever summaries are
        self._input.add(input_ns // 1000)  # type: ignore[union-attr]
        self._infer.add(infer_ns // 1000)  # type: ignore[union-attr]
        self._output.add(output_ns // 1000)  # type: ignore[union-attr]

    def cache_hit(self, queue_ns: int, lookup_ns: int) -> None:
        if self.summaries:
            self.summaries["queue"].observe(queue_ns // 1000)
            self.summaries["cache_hit"].observe(lookup_ns // 1000)

    def cache_miss(self, ns: int) -> None:
        summary = self.summaries.get("cache_miss")
        if summary is not None:
            summary.observe(ns // 1000)

    def responded(self, since_arrival_ns: int) -> None:
        """A request's first response, ``since_arrival_ns`` after it arrived."""
        if self.first_response is not None:
            self.first_response.observe(since_arrival_ns // 1_000_000)


def recorder_for(settings: LatencyMetricsSettings, config: Any) -> LatencyRecorder | None:
    """The recorder of one model version, or None when ``settings`` record nothing for it.

    The first-response histogram is kept for decoupled models only, as Triton's core does: a model that
    sends one response has it in ``nv_inference_request_duration_us`` already.
    """
    # the model's buckets are checked (a load error) whether or not the model gets a histogram
    buckets = first_response_buckets(config) if settings.histogram_latencies else ()
    histogram = settings.histogram_latencies and bool(config.model_transaction_policy.decoupled)
    if not (settings.summary_latencies or histogram):
        return None
    if not histogram:
        settings = replace(settings, histogram_latencies=False)
    return LatencyRecorder(settings, cache_enabled=config.response_cache.enable, first_response_buckets=buckets)


def first_response_buckets(config: Any) -> tuple[float, ...]:
    """The model config's ``model_metrics`` buckets for the first-response histogram, else Triton's defaults.

    Bounds are sorted and deduplicated (prometheus-cpp requires sorted ones); NaN or infinity is a load error.
    """
    buckets: tuple[float, ...] = DEFAULT_FIRST_RESPONSE_BUCKETS
    for control in config.model_metrics.metric_control:
        family = control.metric_identifier.family
        if family == FIRST_RESPONSE_HISTOGRAM:
            buckets = tuple(control.histogram_options.buckets)
            if not all(math.isfinite(bound) for bound in buckets):
                raise ModelLoadError(f"model '{config.name}': model_metrics buckets of '{family}' must be finite "
                                     f"numbers, got {list(buckets)}")
        else:
            log.warning("model '%s': metric family '%s' in 'metric_identifier' is not a customizable metric",
                        config.name, family)
    return buckets
