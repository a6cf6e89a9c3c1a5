"""Metrics: the scrape parses with prometheus_client's parser, names are Triton's, and counters move with traffic."""

from __future__ import annotations

import time

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from support.server import test_model_config, write_model


def _scrape(server) -> dict[tuple[str, tuple], float]:
    text = httpx.get(server.metrics_url, timeout=10).text
    samples: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name[:-6] if sample.name.endswith("_total") else sample.name
            samples[(name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def _model(name: str, version: str = "1") -> tuple:
    return (("model", name), ("version", version))


def test_scrape_has_triton_names_and_counters_move(threaded_server, tmp_path):
    write_model(tmp_path, "counted", test_model_config("counted", extra='parameters { key: "fail_on_value" value { string_value: "7" } }'))
    server = threaded_server([tmp_path])
    raw = httpx.get(server.metrics_url, timeout=10).text
    # Triton's exact names: no "_total" suffix on the exposition lines
    assert "\nnv_inference_request_success{" in raw and "nv_inference_request_success_total" not in raw
    assert "# TYPE nv_inference_queue_duration_us counter" in raw
    before = _scrape(server)
    assert before[("nv_inference_request_success", _model("counted"))] == 0
    assert ("nv_cpu_utilization", ()) in before and before[("nv_cpu_memory_total_bytes", ())] > 0
    assert ("nv_model_load_duration_secs", _model("counted")) in before

    client = server.client("http")
    import tritonclient.http as httpclient

    for batch in (1, 3):
        tensor = httpclient.InferInput("INPUT0", [batch, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((batch, 4), np.float32))
        client.infer("counted", [tensor])
    bad = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    bad.set_data_from_numpy(np.full((1, 4), 7, np.float32))
    with pytest.raises(InferenceServerException):
        client.infer("counted", [bad])
    shape_error = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    shape_error.set_data_from_numpy(np.ones((1, 3), np.float32))
    with pytest.raises(InferenceServerException):
        client.infer("counted", [shape_error])

    after = _scrape(server)
    labels = _model("counted")
    assert after[("nv_inference_request_success", labels)] == 2
    assert after[("nv_inference_count", labels)] == 4  # 1 + 3: as in Triton, the failed execution's request is not counted
    assert after[("nv_inference_exec_count", labels)] == 3
    assert after[("nv_inference_request_failure", tuple(sorted(labels + (("reason", "BACKEND"),))))] == 1
    # the shape error is refused before the model's scheduler: as in tritonserver, no statistic counts it
    assert after[("nv_inference_request_failure", tuple(sorted(labels + (("reason", "REJECTED"),))))] == 0
    for name in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
        assert after[(f"nv_inference_{name}_duration_us", labels)] >= before[(f"nv_inference_{name}_duration_us", labels)]
    assert after[("nv_inference_request_duration_us", labels)] > 0
    assert after[("nv_inference_pending_request_count", labels)] == 0


def test_gpu_metrics_absent_without_gpu(threaded_server, tmp_path):
    write_model(tmp_path, "m", test_model_config("m"))
    server = threaded_server([tmp_path])
    raw = httpx.get(server.metrics_url, timeout=10).text
    try:
        import pynvml

        pynvml.nvmlInit()
        has_gpu = pynvml.nvmlDeviceGetCount() > 0
    except Exception:
        has_gpu = False
    assert ("nv_gpu_utilization" in raw) == has_gpu


def _nvml_gpus():  # type: ignore[no-untyped-def]
    pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (pip install ferry[gpu])")
    try:
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        pytest.skip(f"NVML does not answer here: {exc}")
    if not count:
        pytest.skip("NVML sees no GPU")
    return pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]


@pytest.mark.gpu
def test_gpu_metrics_are_nvmls_figures_per_gpu_uuid(threaded_server, tmp_path):
    """Triton's six GPU families, one series per GPU labelled with NVML's UUID; --allow-gpu-metrics=false drops them."""
    pynvml, handles = _nvml_gpus()
    started = time.monotonic()
    server = threaded_server([tmp_path])
    first = _families(server)
    time.sleep(1.0)
    second = _families(server)
    uptime = time.monotonic() - started
    for handle in handles:
        uuid = pynvml.nvmlDeviceGetUUID(handle)
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid

        def value(families, name):  # type: ignore[no-untyped-def]
            samples = [s for s in families[name].samples if s.labels == {"gpu_uuid": uuid}]
            assert len(samples) == 1, (name, families[name].samples)
            return samples[0].value

        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        assert value(second, "nv_gpu_memory_total_bytes") == memory.total
        assert 0 < value(second, "nv_gpu_memory_used_bytes") <= memory.total
        assert value(second, "nv_gpu_power_limit") == pynvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000.0
        assert 0 < value(second, "nv_gpu_power_usage") <= value(second, "nv_gpu_power_limit") * 1.5
        assert 0.0 <= value(second, "nv_gpu_utilization") <= 1.0
        # joules since the server started: growing, and no more than the power limit allows in that time
        assert first["nv_energy_consumption"].type == "counter"
        assert 0 <= value(first, "nv_energy_consumption") < value(second, "nv_energy_consumption")
        assert value(second, "nv_energy_consumption") <= value(second, "nv_gpu_power_limit") * uptime
    off = threaded_server([tmp_path], allow_gpu_metrics=False)
    assert not [name for name in _families(off) if name.startswith(("nv_gpu_", "nv_energy_"))]


def test_scrape_text_is_tritons_label_order_and_pinned_memory_families(threaded_server, tmp_path):
    """Triton 2.51's CPU-only scrape, line for line: labels sorted by name (``reason`` between ``model`` and
    ``version``), and the pinned memory pool gauges after the per-model families, before the CPU ones."""
    write_model(tmp_path, "m", test_model_config("m"))
    raw = httpx.get(threaded_server([tmp_path]).metrics_url, timeout=10).text
    assert '\nnv_inference_request_failure{model="m",reason="BACKEND",version="1"} 0\n' in raw
    for name, help_text in (("total", "Pinned memory pool total memory size, in bytes"),
                            ("used", "Pinned memory pool used memory size, in bytes")):
        assert (f"# HELP nv_pinned_memory_pool_{name}_bytes {help_text}\n# TYPE nv_pinned_memory_pool_{name}_bytes gauge\n"
                f"nv_pinned_memory_pool_{name}_bytes 0\n") in raw
    types = [line.split()[2] for line in raw.splitlines() if line.startswith("# TYPE")]
    assert types.index("nv_inference_pending_request_count") < types.index("nv_pinned_memory_pool_total_bytes") \
        < types.index("nv_cpu_utilization")


def test_quantile_and_le_come_after_the_sorted_labels():
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

    from serving_pod.metrics import render

    class One:
        def collect(self):  # type: ignore[no-untyped-def]
            metric = Metric("nv_x_summary_us", "x", "summary")
            metric.add_sample("nv_x_summary_us", {"version": "1", "quantile": "0.5", "model": "m"}, 1.0)
            yield metric

    registry = CollectorRegistry(auto_describe=False)
    registry.register(One())
    assert 'nv_x_summary_us{model="m",version="1",quantile="0.5"} 1\n' in render(registry).decode()


def test_families_without_series_are_left_out(threaded_server, tmp_path):
    """prometheus-cpp drops a family with no series: Triton has no per-model families before a model loads,
    and no per-model cache families when no model enables the cache."""
    empty = tmp_path / "empty"
    empty.mkdir()
    raw = httpx.get(threaded_server([empty]).metrics_url, timeout=10).text
    assert "nv_inference_request_success" not in raw and "nv_inference_pending_request_count" not in raw
    assert "# TYPE nv_cpu_utilization gauge" in raw
    write_model(tmp_path / "repo", "m", test_model_config("m"))
    raw = httpx.get(threaded_server([tmp_path / "repo"]).metrics_url, timeout=10).text
    assert "# TYPE nv_inference_request_success counter" in raw and "nv_cache_" not in raw


#: tritonserver 2.51's metrics endpoint, recorded live (``/tmp`` sweep, CPU-only): (method, path) -> (status,
#: content type, body, or True for a scrape); ``/other`` and ``/`` are Ferry's own (module docstring of
#: ``serving_pod.server.metrics_app``: Triton answers them 200 with an empty body)
TRITON_METRICS_ENDPOINT = {
    ("GET", "/metrics"): (200, "text/plain; charset=utf-8", True),
    ("GET", "/metrics/"): (200, "text/plain; charset=utf-8", True),
    ("GET", "/metrics?name=x"): (200, "text/plain; charset=utf-8", True),
    ("POST", "/metrics"): (405, "text/plain", '{"error":"Method Not Allowed"}'),
    ("PUT", "/metrics"): (405, "text/plain", '{"error":"Method Not Allowed"}'),
    ("HEAD", "/metrics"): (405, "text/plain", ""),
    ("GET", "/other"): (404, "text/plain", ""),
    ("GET", "/"): (404, "text/plain", ""),
}


def _endpoint_answers(metrics_url: str) -> dict[tuple[str, str], tuple[int, str, object]]:
    answers = {}
    for method, path in TRITON_METRICS_ENDPOINT:
        response = httpx.request(method, metrics_url.replace("/metrics", path), timeout=10)
        scrape = "# TYPE nv_cpu_utilization gauge" in response.text
        answers[method, path] = (response.status_code, response.headers["content-type"], scrape or response.text)
    return answers


def test_metrics_endpoint_answers_as_tritons(threaded_server, tmp_path):
    """The scrape at ``/metrics`` and ``/metrics/`` typed as tritonserver types it, other methods 405 (Ferry served
    every method, typed the scrape ``text/plain; version=0.0.4; charset=utf-8`` and answered 404 at ``/metrics/``)."""
    server = threaded_server([tmp_path])
    assert _endpoint_answers(server.metrics_url) == TRITON_METRICS_ENDPOINT


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same recorded answers
def test_nvidia_tritons_metrics_endpoint_as_recorded(tmp_path):
    from support.triton import running_triton

    with running_triton(tmp_path, []) as (_, _, metrics):
        answers = _endpoint_answers(f"http://127.0.0.1:{metrics}/metrics")
    ours = {key: value for key, value in TRITON_METRICS_ENDPOINT.items() if key[1] not in ("/other", "/")}
    assert {key: answers[key] for key in ours} == ours
    assert answers["GET", "/other"] == answers["GET", "/"] == (200, "text/plain; charset=utf-8", "")


def _families(server) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(httpx.get(server.metrics_url, timeout=10).text)}


def _infer(server, protocol: str, model: str, value: float) -> None:
    module = server.module(protocol)
    tensor = module.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.full((1, 4), value, np.float32))
    server.client(protocol).infer(model, [tensor])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_summaries_and_first_response_histogram_with_metrics_config(threaded_server, tmp_path, protocol):
    """``summary_latencies=true`` / ``histogram_latencies=true``: Triton's summaries, fed per request; no
    first-response histogram for a model that is not decoupled (test_metrics_triton.py has a decoupled one's)."""
    from serving_pod.core.latency_metrics import LatencyMetricsSettings

    write_model(tmp_path, "timed", test_model_config("timed", extra="""
        parameters { key: "fail_on_value" value { string_value: "7" } }
        model_metrics { metric_control [ { metric_identifier { family: "nv_inference_first_response_histogram_ms" }
                                          histogram_options { buckets: [ 1000, 60000 ] } } ] }"""))
    settings = LatencyMetricsSettings(summary_latencies=True, histogram_latencies=True,
                                      summary_quantiles=((0.5, 0.05), (0.9, 0.01), (0.99, 0.001)))
    server = threaded_server([tmp_path], latency_metrics=settings)
    raw = httpx.get(server.metrics_url, timeout=10).text
    assert "# TYPE nv_inference_request_summary_us summary" in raw
    for _ in range(6):
        _infer(server, protocol, "timed", 1.0)
    with pytest.raises(InferenceServerException):  # fails in the model: a response (an error), no success
        _infer(server, protocol, "timed", 7.0)
    module = server.module(protocol)
    wrong = module.InferInput("INPUT0", [1, 3], "FP32")
    wrong.set_data_from_numpy(np.ones((1, 3), np.float32))
    with pytest.raises(InferenceServerException):  # refused before the model: no response from it at all
        server.client(protocol).infer("timed", [wrong])

    samples = _scrape(server)
    labels = _model("timed")
    for name in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
        family = f"nv_inference_{name}_summary_us"
        assert samples[(f"{family}_count", labels)] == 6, family  # successes only, as Triton's stats
        # the counter floors the total, the summary each observation: apart by less than one per request
        counter = samples[(f"nv_inference_{name}_duration_us", labels)]
        assert 0 <= counter - samples[(f"{family}_sum", labels)] < 7 or name == "request", family
        quantiles = [samples[(family, tuple(sorted(labels + (("quantile", q),))))] for q in ("0.5", "0.9", "0.99")]
        assert quantiles == sorted(quantiles) and all(v >= 0 for v in quantiles), family
    # the request counter also holds failures' time; the summary only successes'
    assert samples[("nv_inference_request_summary_us_sum", labels)] <= samples[("nv_inference_request_duration_us", labels)]
    assert samples[("nv_inference_request_summary_us", tuple(sorted(labels + (("quantile", "0.99"),))))] > 0
    assert not any(name.startswith("nv_inference_first_response_histogram_ms") for name, _ in samples)
    assert ("nv_cache_hit_summary_per_model_count", labels) not in samples  # no cache on this model


def test_counter_latencies_false_drops_the_duration_counters(threaded_server, tmp_path):
    from serving_pod.core.latency_metrics import LatencyMetricsSettings

    write_model(tmp_path, "plain", test_model_config("plain"))
    server = threaded_server([tmp_path], latency_metrics=LatencyMetricsSettings(counter_latencies=False))
    _infer(server, "http", "plain", 1.0)
    families = _families(server)
    assert "nv_inference_request_duration_us" not in families and "nv_inference_queue_duration_us" not in families
    assert _scrape(server)[("nv_inference_request_success", _model("plain"))] == 1
    assert not any(name.endswith("_summary_us") or "histogram" in name for name in families)


def test_default_metrics_have_no_summaries_or_histograms(threaded_server, tmp_path):
    write_model(tmp_path, "plain", test_model_config("plain"))
    server = threaded_server([tmp_path])
    _infer(server, "http", "plain", 1.0)
    families = _families(server)
    assert "nv_inference_request_duration_us" in families
    assert not any("summary" in name or "first_response" in name for name in families)
    assert server.engine.registry.get("plain", "").stats.latency is None  # nothing per request either


def _triton_families(repository, flags: list[str]) -> dict[str, object]:
    """Start NVIDIA Triton 2.51 on ``repository`` with ``flags``, send 3 requests, return its scrape."""
    import tritonclient.http as httpclient

    from support.triton import running_triton

    with running_triton(repository, ["double_py"], *flags) as (http, _, metrics):
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
        tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
        for _ in range(3):
            client.infer("double_py", [tensor])
        client.close()
        text = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=10).text
    return {family.name: family for family in text_string_to_metric_families(text)}


def _shape(family) -> tuple:
    """What a dashboard sees of a family: its type, help, and each sample's name and labels (not values)."""
    samples = sorted((s.name, tuple(sorted(s.labels.items()))) for s in family.samples)
    return family.type, family.documentation, samples


def _double_py_repository(path, extra_config: str = ""):  # type: ignore[no-untyped-def]
    """benchmarks/models/double_py copied into ``path``/repo, with ``extra_config`` added to its config."""
    import shutil
    from pathlib import Path

    repository = path / "repo"
    shutil.copytree(Path(__file__).resolve().parents[2] / "benchmarks" / "models" / "double_py",
                    repository / "double_py", ignore=shutil.ignore_patterns("__pycache__"))
    config = repository / "double_py" / "config.pbtxt"
    config.write_text(config.read_text() + extra_config)
    return repository


LATENCY_FLAGS = ["--metrics-config=summary_latencies=true", "--metrics-config=summary_quantiles=0.5:0.05,0.99:0.001"]

def _triton_latency_families() -> dict[str, tuple]:
    model, version = ("model", "double_py"), ("version", "1")

    def shape(name: str, kind: str, help_text: str) -> tuple:
        if kind == "summary":
            samples = [(name, (model, ("quantile", q), version)) for q in ("0.5", "0.99")]
            samples += [(f"{name}_count", (model, version)), (f"{name}_sum", (model, version))]
        elif name == "nv_inference_request_failure":
            reasons = ("BACKEND", "CANCELED", "OTHER", "REJECTED")
            samples = [(f"{name}_total", (model, ("reason", reason), version)) for reason in reasons]
        else:
            samples = [(f"{name}_total" if kind == "counter" else name, (model, version))]
        return kind, help_text, samples

    uncached, cached = " (does not include cached requests)", " (includes cached requests)"
    microseconds = "duration in microseconds"
    families = {  # name after nv_inference_ -> type, help
        "compute_infer_duration_us": ("counter", f"Cumulative compute inference {microseconds}{uncached}"),
        "compute_infer_summary_us": ("summary", f"Cumulative compute inference {microseconds}{uncached}"),
        "compute_input_duration_us": ("counter", f"Cumulative compute input {microseconds}{uncached}"),
        "compute_input_summary_us": ("summary", f"Cumulative compute input {microseconds}{uncached}"),
        "compute_output_duration_us": ("counter", f"Cumulative inference compute output {microseconds}{uncached}"),
        "compute_output_summary_us": ("summary", f"Cumulative inference compute output {microseconds}{uncached}"),
        "count": ("counter", f"Number of inferences performed{uncached}"),
        "exec_count": ("counter", f"Number of model executions performed{uncached}"),
        "pending_request_count": ("gauge", "Instantaneous number of pending requests awaiting execution per-model."),
        "queue_duration_us": ("counter", f"Cumulative inference queuing {microseconds}{cached}"),
        "queue_summary_us": ("summary", f"Summary of inference queuing {microseconds}{cached}"),
        "request_duration_us": ("counter", f"Cumulative inference request {microseconds}{cached}"),
        "request_failure": ("counter", "Number of failed inference requests, all batch sizes"),
        "request_success": ("counter", "Number of successful inference requests, all batch sizes"),
        "request_summary_us": ("summary", f"Summary of inference request {microseconds}{cached}"),
    }
    return {f"nv_inference_{name}": shape(f"nv_inference_{name}", kind, help_text)
            for name, (kind, help_text) in families.items()}


#: Triton 2.51's per-model ``nv_inference_*`` families (``_shape``) after 3 requests to double_py with
#: ``LATENCY_FLAGS``, recorded from a live Triton; the slow ``test_nvidia_tritons_latency_metric_families_as_recorded``
#: compares a live one with them
TRITON_LATENCY_FAMILIES: dict[str, tuple] = _triton_latency_families()


def test_latency_metric_families_match_nvidia_tritons(threaded_server, tmp_path):
    """The same ``--metrics-config`` and model as Triton 2.51 (``TRITON_LATENCY_FAMILIES``): identical per-model
    families."""
    from serving_pod.core.latency_metrics import parse_metrics_config

    repository = _double_py_repository(tmp_path)
    settings, warnings = parse_metrics_config(flag.split("=", 1)[1].split("=", 1) for flag in LATENCY_FLAGS)
    assert warnings == []
    server = threaded_server([repository], latency_metrics=settings)
    for _ in range(3):
        module = server.module("http")
        tensor = module.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
        server.client("http").infer("double_py", [tensor])
    ferry = _families(server)
    assert sorted(name for name in ferry if name.startswith("nv_inference_")) == sorted(TRITON_LATENCY_FAMILIES)
    for name, shape in TRITON_LATENCY_FAMILIES.items():
        assert _shape(ferry[name]) == shape, name


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_tritons_latency_metric_families_as_recorded(tmp_path):
    triton = _triton_families(_double_py_repository(tmp_path), LATENCY_FLAGS)
    per_model = sorted(name for name in triton if name.startswith("nv_inference_"))
    assert [name for name in per_model if name.endswith("_summary_us")] == sorted(
        f"nv_inference_{n}_summary_us" for n in ("request", "queue", "compute_input", "compute_infer", "compute_output"))
    assert per_model == sorted(TRITON_LATENCY_FAMILIES)
    for name in per_model:
        assert _shape(triton[name]) == TRITON_LATENCY_FAMILIES[name], name


def test_non_finite_histogram_buckets_fail_the_load_with_the_reason(threaded_server, tmp_path):
    from serving_pod.core.latency_metrics import LatencyMetricsSettings

    write_model(tmp_path, "bad", test_model_config("bad", extra="""
        model_metrics { metric_control [ { metric_identifier { family: "nv_inference_first_response_histogram_ms" }
                                          histogram_options { buckets: [ 1, inf ] } } ] }"""))
    write_model(tmp_path, "good", test_model_config("good"))
    server = threaded_server([tmp_path], latency_metrics=LatencyMetricsSettings(histogram_latencies=True),
                             strict_readiness=False)
    index = {m["name"]: m for m in httpx.post(f"http://{server.http_url}/v2/repository/index", timeout=10).json()}
    assert index["bad"]["state"] == "UNAVAILABLE" and "must be finite numbers" in index["bad"]["reason"]
    assert index["good"]["state"] == "READY"  # the other model and the server go on
    _infer(server, "http", "good", 1.0)


#: Triton 2.51's server-wide response cache families (its local cache registers them), in its scrape order
_CACHE_FAMILIES = {
    "nv_cache_util": "Cache utilization [0.0 - 1.0]",
    "nv_cache_num_entries": "Number of responses stored in response cache",
    "nv_cache_num_hits": "Number of cache hits in response cache",
    "nv_cache_num_misses": "Number of cache misses in response cache",
    "nv_cache_num_lookups": "Number of cache lookups in response cache",
    "nv_cache_num_evictions": "Number of cache evictions in response cache",
    "nv_cache_lookup_duration": "Total cache lookup duration (hit and miss), in microseconds",
    "nv_cache_insertion_duration": "Total cache insertion duration, in microseconds",
}


def _cache_values(text: str) -> dict[str, float]:
    return {family.name: family.samples[0].value for family in text_string_to_metric_families(text)
            if family.name in _CACHE_FAMILIES}


def test_response_cache_families_are_tritons_and_move_as_its_do(threaded_server, tmp_path):
    """``--cache-config``: the server-wide ``nv_cache_*`` gauges, after the CPU ones, zero before any request (util:
    the segment header's share), counting over all models; lookups = hits + misses, evictions as the LRU fills,
    util = bytes used / size."""
    from serving_pod.cache import SEGMENT_HEADER_BYTES, allocation_bytes, entry_bytes
    from serving_pod.core.types import Tensor

    cache = "response_cache { enable: true }"
    write_model(tmp_path, "small", test_model_config("small", extra=cache))
    write_model(tmp_path, "wide", test_model_config("wide", dims="[ 128 ]", extra=cache))
    entry = allocation_bytes(entry_bytes([Tensor("OUTPUT0", "FP32", np.zeros((1, 4), np.float32))]))
    size = SEGMENT_HEADER_BYTES + 3 * entry + 50  # three small answers fit, a wide one (512 bytes) never does
    server = threaded_server([tmp_path], cache_config={"local": {"size": str(size)}})
    raw = httpx.get(server.metrics_url, timeout=10).text
    for name, help_text in _CACHE_FAMILIES.items():  # util: the segment's header is in use from the start
        value = repr(SEGMENT_HEADER_BYTES / size) if name == "nv_cache_util" else "0"
        assert f"# HELP {name} {help_text}\n# TYPE {name} gauge\n{name} {value}\n" in raw
    types = [line.split()[2] for line in raw.splitlines() if line.startswith("# TYPE")]
    start = types.index("nv_cache_util")
    assert types[start:start + len(_CACHE_FAMILIES)] == list(_CACHE_FAMILIES)
    assert types.index("nv_cpu_memory_used_bytes") < start

    for value in (1.0, 1.0, 2.0, 3.0):  # miss, hit, miss, miss: full
        _infer(server, "http", "small", value)
    values = _cache_values(httpx.get(server.metrics_url, timeout=10).text)
    assert values["nv_cache_util"] == pytest.approx((SEGMENT_HEADER_BYTES + 3 * entry) / size)
    assert [values[f"nv_cache_num_{n}"] for n in ("entries", "hits", "misses", "lookups", "evictions")] == [3, 1, 3, 4, 0]
    assert values["nv_cache_insertion_duration"] >= 1  # three copies into the cache take microseconds
    lookup_us = values["nv_cache_lookup_duration"]

    _infer(server, "http", "small", 4.0)  # evicts 2.0 (1.0 was used since)
    _infer(server, "http", "small", 2.0)  # gone: a miss, evicts 3.0
    _infer(server, "http", "small", 1.0)  # still there
    wide = server.module("http").InferInput("INPUT0", [1, 128], "FP32")
    wide.set_data_from_numpy(np.ones((1, 128), np.float32))
    server.client("http").infer("wide", [wide])  # another model, same cache: a miss, too large to keep
    values = _cache_values(httpx.get(server.metrics_url, timeout=10).text)
    assert [values[f"nv_cache_num_{n}"] for n in ("entries", "hits", "misses", "lookups", "evictions")] == [3, 2, 6, 8, 2]
    assert values["nv_cache_util"] == pytest.approx((SEGMENT_HEADER_BYTES + 3 * entry) / size)
    assert values["nv_cache_lookup_duration"] >= lookup_us
    per_model = _scrape(server)
    assert per_model[("nv_cache_num_misses_per_model", _model("wide"))] == 1

    write_model(tmp_path / "off", "small", test_model_config("small", extra=cache))
    raw = httpx.get(threaded_server([tmp_path / "off"]).metrics_url, timeout=10).text
    assert "nv_cache_num_hits_per_model" in raw and "nv_cache_util" not in raw  # no cache configured: none


def _scrape_until(url: str, done) -> str:  # type: ignore[no-untyped-def]
    """Triton's cache copies its totals into the gauges from a polling thread: wait for ``done(values)``."""
    deadline = time.monotonic() + 15
    while True:
        text = httpx.get(url, timeout=10).text
        if done(_cache_values(text)) or time.monotonic() > deadline:
            return text
        time.sleep(0.1)


_CACHE_SIZE, _CACHE_REQUESTS = 1 << 20, (1.0, 1.0, 2.0)  # miss, hit, miss
_CACHE_COUNTS = [f"nv_cache_num_{n}" for n in ("entries", "hits", "misses", "lookups", "evictions")]

_TRITON_CACHE_SCRAPE_ORDER = [
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count", "nv_inference_exec_count",
    "nv_inference_request_duration_us", "nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us", "nv_inference_compute_output_duration_us", "nv_cache_num_hits_per_model",
    "nv_cache_hit_duration_per_model", "nv_cache_num_misses_per_model", "nv_cache_miss_duration_per_model",
    "nv_inference_pending_request_count", "nv_pinned_memory_pool_total_bytes", "nv_pinned_memory_pool_used_bytes",
    "nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes", *_CACHE_FAMILIES]
#: Triton 2.51's scrape before and after ``_CACHE_REQUESTS`` to double_py with a local cache of ``_CACHE_SIZE``
#: bytes: (every family's name in scrape order, ``_CACHE_COUNTS``' values). Recorded from a live Triton; the slow
#: ``test_nvidia_tritons_response_cache_families_as_recorded`` compares a live one with them.
TRITON_CACHE_SCRAPES: list[tuple[list[str], list[float]]] = [(_TRITON_CACHE_SCRAPE_ORDER, [0, 0, 0, 0, 0]),
                                                              (_TRITON_CACHE_SCRAPE_ORDER, [2, 1, 2, 3, 0])]
#: ``_shape`` of Triton 2.51's ``_CACHE_FAMILIES`` (recorded with ``TRITON_CACHE_SCRAPES``): unlabelled gauges
TRITON_CACHE_SHAPES = {name: ("gauge", help_text, [(name, ())]) for name, help_text in _CACHE_FAMILIES.items()}


def _cache_scrapes(client, module, url: str) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """The scrape before and after ``_CACHE_REQUESTS``."""
    before = httpx.get(url, timeout=10).text
    for value in _CACHE_REQUESTS:
        tensor = module.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.full((1, 16), value, np.float32))
        client.infer("double_py", [tensor])
    return before, _scrape_until(url, lambda values: values.get("nv_cache_num_lookups") == len(_CACHE_REQUESTS))


def _cache_scrape_summary(text: str) -> tuple[list[str], list[float]]:
    values = _cache_values(text)
    return [f.name for f in text_string_to_metric_families(text)], [values[n] for n in _CACHE_COUNTS]


def test_response_cache_families_match_nvidia_tritons(threaded_server, tmp_path):
    """The same cache, model and requests as on Triton 2.51 (``TRITON_CACHE_SCRAPES``): the same families (names,
    help, types, labels), in the same place of the scrape, with the same counts before and after."""
    repository = _double_py_repository(tmp_path, "\nresponse_cache { enable: true }\n")
    server = threaded_server([repository], cache_config={"local": {"size": str(_CACHE_SIZE)}})
    ferry = _cache_scrapes(server.client("http"), server.module("http"), server.metrics_url)
    for (their_names, their_counts), ferry_text in zip(TRITON_CACHE_SCRAPES, ferry, strict=True):
        ours = {f.name: f for f in text_string_to_metric_families(ferry_text)}
        assert [name for name in their_names if name.startswith("nv_cache_")] == \
            [name for name in ours if name.startswith("nv_cache_")]
        assert [name for name in their_names if name in ours] == [name for name in ours if name in their_names]
        for name in _CACHE_FAMILIES:
            assert _shape(ours[name]) == TRITON_CACHE_SHAPES[name], name
        assert [_cache_values(ferry_text)[n] for n in _CACHE_COUNTS] == their_counts
    assert [_cache_values(ferry[1])[n] for n in _CACHE_COUNTS] == [2, 1, 2, 3, 0]
    assert 0 < _cache_values(ferry[1])["nv_cache_util"] < 1


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_tritons_response_cache_families_as_recorded(tmp_path):
    from pathlib import Path

    import tritonclient.http as httpclient

    from support.triton import running_triton, triton_or_skip

    # bin/tritonserver -> caches/local/libtritoncache_local.so, which Triton looks for in /opt/tritonserver otherwise
    caches = Path(triton_or_skip().command()[0]).parents[1] / "caches"
    repository = _double_py_repository(tmp_path, "\nresponse_cache { enable: true }\n")
    with running_triton(repository, ["double_py"], f"--cache-config=local,size={_CACHE_SIZE}",
                        f"--cache-directory={caches}") as (http, _, metrics):
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
        triton = _cache_scrapes(client, httpclient, f"http://127.0.0.1:{metrics}/metrics")
        client.close()
    assert [_cache_scrape_summary(text) for text in triton] == TRITON_CACHE_SCRAPES
    for text in triton:
        theirs = {f.name: f for f in text_string_to_metric_families(text)}
        for name in _CACHE_FAMILIES:
            assert _shape(theirs[name]) == TRITON_CACHE_SHAPES[name], name
    assert 0 < _cache_values(triton[1])["nv_cache_util"] < 1


FLAKY_CONFIG = """
name: "flaky"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 2 ] } ]
"""

FLAKY_MODEL = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            time.sleep(abs(int(x[0])) / 1000.0)
            if x[1]:
                raise pb_utils.TritonModelException("raised")
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return out
'''

_DURATIONS = ("request", "queue", "compute_input", "compute_infer", "compute_output")


def _durations(http_port: int, metrics_port: int) -> tuple[dict[str, int], dict[str, int]]:
    """The flaky model's ``nv_inference_*_duration_us`` counters and its statistics' nanoseconds (of successes)."""
    text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
    counters = {}
    for line in text.splitlines():
        for name in _DURATIONS:
            if line.startswith(f"nv_inference_{name}_duration_us{{") and 'model="flaky"' in line:
                counters[name] = int(float(line.rsplit(" ", 1)[1]))
    stats = httpx.get(f"http://127.0.0.1:{http_port}/v2/models/flaky/stats", timeout=10).json()
    inference = stats["model_stats"][0]["inference_stats"]
    nanoseconds = {name: inference["success" if name == "request" else name]["ns"] for name in _DURATIONS}
    return counters, nanoseconds


def _duration_traffic(http_port: int, metrics_port: int) -> list[tuple[dict[str, int], dict[str, int]]]:
    def infer(sleep_ms: int, fail: int) -> int:
        body = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [2], "data": [sleep_ms, fail]}]}
        return httpx.post(f"http://127.0.0.1:{http_port}/v2/models/flaky/infer", json=body, timeout=30).status_code

    assert infer(20, 0) == 200
    seen = [_durations(http_port, metrics_port)]
    assert infer(30, 1) == 500  # the model raised: a failed request
    seen.append(_durations(http_port, metrics_port))
    assert all(infer(0, 0) == 200 for _ in range(30))
    seen.append(_durations(http_port, metrics_port))
    return seen


def _check_durations(seen: list[tuple[dict[str, int], dict[str, int]]]) -> None:
    (first, _), (after_failure, _), (last, nanoseconds) = seen
    assert first["request"] >= 20_000
    assert after_failure == first  # a failed request adds to no duration counter (its time is in 'fail' only)
    for name in _DURATIONS:
        # each request's duration truncated to whole microseconds on its own: 31 requests lose up to 31 us, and
        # at least a few (a sum truncated once loses under 1 us)
        assert nanoseconds[name] // 1000 - 31 <= last[name] <= nanoseconds[name] // 1000
    assert sum(nanoseconds[name] // 1000 - last[name] for name in _DURATIONS) >= 5


def _flaky_repository(tmp_path):
    write_model(tmp_path, "flaky", FLAKY_CONFIG, {"1/model.py": FLAKY_MODEL})
    return tmp_path


def test_duration_counters_are_successes_truncated_request_by_request(tmp_path):
    """As Triton 2.51: ``nv_inference_request_duration_us`` and the queue and compute counters add each successful
    request's time in whole microseconds; a failed request adds nothing (Ferry added its time, and truncated sums)."""
    from support.server import ServerThread, make_options

    thread = ServerThread(make_options([_flaky_repository(tmp_path)], model_control_mode="explicit",
                                       load_models=("flaky",)))
    handle = thread.start()
    try:
        seen = _duration_traffic(handle.server.http_port, handle.server.metrics_port)
    finally:
        thread.stop()
    _check_durations(seen)


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half above runs by default
def test_triton_duration_counters_are_successes_truncated_request_by_request(tmp_path):
    """Side by side: Triton 2.51 behaves as the test above expects (skipped where it cannot be had)."""
    from support.triton import running_triton

    with running_triton(_flaky_repository(tmp_path), ("flaky",)) as (http, _, metrics):
        seen = _duration_traffic(http, metrics)
    _check_durations(seen)
