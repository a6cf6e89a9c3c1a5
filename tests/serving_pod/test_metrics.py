"""Metrics: the scrape parses with prometheus_client's parser, names are Triton's, and counters move with traffic."""

from __future__ import annotations

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
    assert after[("nv_inference_count", labels)] == 5  # 1 + 3 + the failed execution's 1
    assert after[("nv_inference_exec_count", labels)] == 3
    assert after[("nv_inference_request_failure", tuple(sorted(labels + (("reason", "BACKEND"),))))] == 1
    assert after[("nv_inference_request_failure", tuple(sorted(labels + (("reason", "REJECTED"),))))] == 1
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


def test_metrics_endpoint_404_elsewhere(threaded_server, tmp_path):
    server = threaded_server([tmp_path])
    response = httpx.get(server.metrics_url.replace("/metrics", "/other"), timeout=10)
    assert response.status_code == 404
