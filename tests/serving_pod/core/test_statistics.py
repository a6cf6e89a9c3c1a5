"""Model statistics (``core.statistics``): one execution's successes recorded at once equal each recorded alone."""

from __future__ import annotations

from serving_pod.core.latency_metrics import DEFAULT_QUANTILES, LatencyMetricsSettings, LatencyRecorder
from serving_pod.core.statistics import ModelStats

REQUEST_NS = [5_000, 7_500, 12_000]
QUEUE_NS = [1_000, 2_500, 6_000]


def _stats() -> ModelStats:
    stats = ModelStats("m", "1")
    stats.latency = LatencyRecorder(LatencyMetricsSettings(True, True, True, DEFAULT_QUANTILES), clock=lambda: 0.0)
    return stats


def _latency(stats: ModelStats) -> dict:
    recorder = stats.latency
    assert recorder is not None and recorder.first_response is not None
    summaries = {key: (s.count, s.total, s.quantiles([0.5, 0.9])) for key, s in recorder.summaries.items()}
    return {"summaries": summaries, "histogram": (recorder.first_response.counts, recorder.first_response.count)}


def test_an_executions_successes_recorded_at_once_equal_each_recorded_alone():
    one_by_one, at_once = _stats(), _stats()
    for request, queued in zip(REQUEST_NS, QUEUE_NS):
        one_by_one.record_success(request, queued, 100, 2_000, 300)
    at_once.record_successes(REQUEST_NS, QUEUE_NS, 100, 2_000, 300)
    first, second = one_by_one.as_dict(), at_once.as_dict()
    first.pop("last_inference"), second.pop("last_inference")
    assert first == second
    assert second["inference_stats"]["success"] == {"count": 3, "ns": sum(REQUEST_NS)}
    assert second["inference_stats"]["queue"] == {"count": 3, "ns": sum(QUEUE_NS)}
    assert second["inference_stats"]["compute_infer"] == {"count": 3, "ns": 6_000}
    assert _latency(one_by_one) == _latency(at_once)
    assert _latency(at_once)["summaries"]["request"][0] == 3


def test_last_inference_moves_with_executions_only():
    """tritonserver 2.51 sets ``last_inference`` when an execution is reported (``UpdateInferBatchStats``): a cache
    hit, a failure reported without an execution (a rejected or cancelled request, a failed ensemble request) and
    the successes themselves leave it; Ferry moved it on each of those."""
    stats = ModelStats("m", "1")
    stats.record_cache_hit(1_000, 100)
    stats.record_failure(1_000, "REJECTED")
    stats.record_successes([1_000], [100], 10, 20, 30)
    assert stats.last_inference_ms == 0
    stats.record_execution(1, 10, 20, 30)
    assert stats.last_inference_ms > 0
