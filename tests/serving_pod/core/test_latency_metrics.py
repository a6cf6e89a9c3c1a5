"""Latency summaries and the first-response histogram: settings, window, sampling, buckets."""

from __future__ import annotations

import math
import random

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core import latency_metrics as lm
from serving_pod.core.errors import ModelLoadError
from serving_pod.core.latency_metrics import (
    DEFAULT_QUANTILES,
    Histogram,
    LatencyMetricsSettings,
    LatencyRecorder,
    WindowSummary,
    first_response_buckets,
    parse_metrics_config,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_defaults_are_tritonservers():
    settings, warnings = parse_metrics_config([])
    assert settings == LatencyMetricsSettings(True, False, False, DEFAULT_QUANTILES)
    assert not settings.per_request and warnings == []


def test_switches_and_quantiles_parse_as_triton_does():
    settings, warnings = parse_metrics_config([
        ("counter_latencies", "false"), ("summary_latencies", "true"), ("histogram_latencies", "true"),
        ("summary_quantiles", "0.5:0.05,0.99:0.001"),
    ])
    assert settings == LatencyMetricsSettings(False, True, True, ((0.5, 0.05), (0.99, 0.001)))
    assert settings.per_request and warnings == []


@pytest.mark.parametrize(("pairs", "expected", "warning"), [
    # only the exact words switch (Triton compares strings): anything else keeps the default, with a warning
    ([("counter_latencies", "False")], LatencyMetricsSettings(), "neither 'true' nor 'false', so counter_latencies is true"),
    ([("summary_latencies", "1")], LatencyMetricsSettings(), "so summary_latencies is false"),
    ([("summary_intervals", "5")], LatencyMetricsSettings(), "summary_intervals=5: unknown setting, ignored"),
    # a pair that does not parse is skipped; no valid pair keeps the defaults
    ([("summary_quantiles", "0.5:0.05,0.9")], LatencyMetricsSettings(summary_quantiles=((0.5, 0.05),)),
     "invalid option [0.9]. No ':' delimiter found"),
    ([("summary_quantiles", "x:0.1")], LatencyMetricsSettings(), "invalid option [x:0.1]: not two numbers"),
    ([("summary_quantiles", "1.5:0.1")], LatencyMetricsSettings(), "the quantile must be in [0, 1] and the error not negative"),
])
def test_bad_settings_are_ignored_with_a_warning(pairs, expected, warning):
    settings, warnings = parse_metrics_config(pairs)
    assert settings == expected
    assert len(warnings) == 1 and warning in warnings[0]


def test_quantiles_are_exact_nearest_rank_below_the_cap():
    summary = WindowSummary(Clock())
    assert all(math.isnan(v) for v in summary.quantiles([0.5, 0.99]))  # nothing observed yet
    values = list(range(1, 101))
    random.Random(3).shuffle(values)
    for value in values:
        summary.observe(value)
    assert summary.quantiles([0.0, 0.5, 0.9, 0.95, 0.99, 0.999, 1.0]) == [1, 50, 90, 95, 99, 100, 100]
    assert (summary.count, summary.total) == (100, 5050)


def test_quantiles_cover_the_last_48_to_60_seconds_while_count_and_sum_cover_all():
    clock = Clock()
    summary = WindowSummary(clock)
    summary.observe(1000)  # opens the age bucket starting at t=1000
    clock.now += 50
    summary.observe(1)  # bucket starting at t=1048
    assert summary.quantiles([0.5, 1.0]) == [1, 1000]
    clock.now += 9.9  # t=1059.9: the first bucket is 59.9 s old, still in the window
    assert summary.quantiles([1.0]) == [1000]
    clock.now += 0.1  # t=1060: it leaves the window
    assert summary.quantiles([0.0, 1.0]) == [1, 1]
    clock.now += 60
    assert math.isnan(summary.quantiles([0.5])[0])
    assert (summary.count, summary.total) == (2, 1001)


def test_memory_stays_bounded_and_sampled_quantiles_stay_close(monkeypatch):
    monkeypatch.setattr(lm, "SAMPLE_CAP", 4096)
    summary = WindowSummary(Clock(), seed=7)
    values = list(range(100_000))
    random.Random(11).shuffle(values)
    for value in values:
        summary.observe(value)
    assert summary.kept() == 4096  # the reservoir, not the 100000 values
    for q, got in zip((0.5, 0.9, 0.99), summary.quantiles([0.5, 0.9, 0.99])):
        # a uniform sample of 4096: rank standard error <= 0.8%; 3% is four of them
        assert abs(got / 100_000 - q) < 0.03
    assert summary.count == 100_000 and summary.total == sum(values)


def test_sampled_buckets_are_weighted_by_what_they_saw(monkeypatch):
    """A busy bucket (sampled) and a quiet one (exact) weigh by their observation counts, not sample sizes."""
    monkeypatch.setattr(lm, "SAMPLE_CAP", 100)
    clock = Clock()
    summary = WindowSummary(clock, seed=1)
    for _ in range(10_000):
        summary.observe(5)  # 10000 observations of 5, kept as 100 samples
    clock.now += 13
    for _ in range(100):
        summary.observe(900)  # 100 observations of 900
    # 900 is 1% of the window: the median is 5, and only the top 1% is 900
    assert summary.quantiles([0.5, 0.98, 0.995]) == [5, 5, 900]


def test_histogram_counts_are_cumulative_with_le_semantics():
    histogram = Histogram([500, 100, 2000, 5000])
    for value in (0, 100, 101, 6000):
        histogram.observe(value)
    assert histogram.cumulative() == [(100, 2), (500, 3), (2000, 3), (5000, 3), (math.inf, 4)]
    assert (histogram.count, histogram.total) == (4, 6201)


def test_recorder_observes_microseconds_and_whole_milliseconds():
    settings = LatencyMetricsSettings(summary_latencies=True, histogram_latencies=True)
    recorder = LatencyRecorder(settings, clock=Clock())
    recorder.success(5_999, 2_000, 1_000, 1_500, 999)
    recorder.responded(2_999_999)  # 2.999999 ms counts as 2: Triton divides whole nanoseconds
    assert {k: s.total for k, s in recorder.summaries.items()} == {
        "request": 5, "queue": 2, "compute_input": 1, "compute_infer": 1, "compute_output": 0}
    assert recorder.first_response is not None and recorder.first_response.total == 2
    # a model with the response cache: cache summaries instead of the request one (Triton's DLIS-4762)
    cached = LatencyRecorder(settings, cache_enabled=True, clock=Clock())
    assert set(cached.summaries) == {"cache_hit", "cache_miss", "queue", "compute_input", "compute_infer",
                                     "compute_output"}
    cached.cache_hit(0, 3_000)
    cached.cache_miss(7_000)
    assert (cached.summaries["cache_hit"].total, cached.summaries["cache_miss"].total) == (3, 7)
    # histogram only: no summaries at all
    only = LatencyRecorder(LatencyMetricsSettings(histogram_latencies=True))
    only.success(1, 1, 1, 1, 1)
    assert only.summaries == {}


def test_model_metrics_sets_the_buckets(caplog):
    config = text_format.Parse("""
        name: "m"
        model_metrics { metric_control [
          { metric_identifier { family: "nv_inference_first_response_histogram_ms" }
            histogram_options { buckets: [ 1, 2, 4, 8 ] } },
          { metric_identifier { family: "nv_other" } histogram_options { buckets: [ 3 ] } }
        ] }""", mc.ModelConfig())
    assert first_response_buckets(config) == (1, 2, 4, 8)
    assert "metric family 'nv_other' in 'metric_identifier' is not a customizable metric" in caplog.text
    assert first_response_buckets(mc.ModelConfig(name="plain")) == (100, 500, 2000, 5000)


@pytest.mark.parametrize("bound", ["nan", "inf", "-inf"])
def test_model_metrics_buckets_must_be_finite(bound):
    config = text_format.Parse(f"""
        name: "m"
        model_metrics {{ metric_control [ {{ metric_identifier {{ family: "nv_inference_first_response_histogram_ms" }}
                                           histogram_options {{ buckets: [ 1, {bound} ] }} }} ] }}""", mc.ModelConfig())
    with pytest.raises(ModelLoadError, match="model 'm': model_metrics buckets of 'nv_inference_first_response_histogram_ms' "
                                              "must be finite numbers"):
        first_response_buckets(config)


def test_quantiles_follow_new_observations_after_a_query():
    """A closed bucket is sorted once and kept; the open one is read afresh at every query."""
    clock = Clock()
    summary = WindowSummary(clock)
    for value in (30, 10, 20):
        summary.observe(value)
    clock.now += 13  # the first bucket closes at the next observation
    summary.observe(40)
    assert summary.quantiles([0.0, 0.5, 1.0]) == [10, 20, 40]
    for value in (50, 60, 70, 80):
        summary.observe(value)
    assert summary.quantiles([0.0, 0.5, 1.0]) == [10, 40, 80]
    assert summary.kept() == 8
