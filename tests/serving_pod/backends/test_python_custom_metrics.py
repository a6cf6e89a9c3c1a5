"""Custom metrics of python models (``pb_utils.MetricFamily``) on the server's ``/metrics``.

``py_custom_metrics`` (data/) defines a counter, a gauge and a histogram family labelled with its
model name; it runs once in the server process and once isolated in its own process, so both
paths reach the same endpoint. The scrape is parsed with prometheus_client's parser; the raw
lines are checked against the text Triton 2.51 prints for the same calls.
"""

from __future__ import annotations

import gc
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from serving_pod.backends import pb_request, pb_utils
from serving_pod.core.custom_metrics import CustomMetrics
from support.python_models import install_python_model

MODELS = {"metrics_local": False, "metrics_isolated": True}
CUSTOM = ("custom_inputs_seen", "custom_last_sum", "custom_input_values")


def _start(threaded_server: Any, tmp_path: Any, names: tuple[str, ...]) -> Any:
    for name in names:
        install_python_model(tmp_path, "py_custom_metrics", name, isolated=MODELS[name])
    return threaded_server([tmp_path], model_control_mode="explicit", load_models=names)


def _infer(client: Any, model: str, values: list[float], misuse: str = "") -> float:
    import tritonclient.http as httpclient

    tensor = httpclient.InferInput("X", [len(values)], "FP32")
    tensor.set_data_from_numpy(np.array(values, np.float32))
    parameters = {"misuse": misuse} if misuse else None
    return float(client.infer(model, [tensor], parameters=parameters).as_numpy("SEEN")[0])


def _scrape(server: Any) -> tuple[str, dict[str, Any]]:
    """Raw text, and family name -> (type, help, {(sample name, sorted labels): value})."""
    text = httpx.get(server.metrics_url, timeout=10).text
    families = {}
    for family in text_string_to_metric_families(text):
        samples = {}
        for sample in family.samples:
            name = sample.name[:-6] if family.type == "counter" and sample.name.endswith("_total") else sample.name
            samples[(name, tuple(sorted(sample.labels.items())))] = sample.value
        families[family.name] = (family.type, family.documentation, samples)
    return text, families


def _series(model: str) -> dict[tuple[str, tuple], float]:
    """What two requests, X = [1, 2, 3] then [4, 0.5], leave in the three families."""
    labels = (("model", model), ("version", "1"))
    histogram = {("custom_input_values_bucket", tuple(sorted(labels + (("le", le),)))): count
                 for le, count in (("1", 2), ("2.5", 3), ("5", 5), ("+Inf", 5))}
    return {
        ("custom_inputs_seen", labels): 5,
        ("custom_last_sum", labels): 4.5,
        ("custom_input_values_count", labels): 5,
        ("custom_input_values_sum", labels): 10.5,
        **histogram,
    }


def test_custom_metrics_are_exported_and_leave_with_their_model(threaded_server, tmp_path) -> None:
    server = _start(threaded_server, tmp_path, tuple(MODELS))
    client = server.client("http")
    for model in MODELS:
        assert _infer(client, model, [1, 2, 3]) == 3  # Metric.value() inside the model
        assert _infer(client, model, [4, 0.5]) == 5

    raw, families = _scrape(server)
    assert families["custom_inputs_seen"][:2] == ("counter", "Input elements seen")
    assert families["custom_last_sum"][:2] == ("gauge", "Sum of the last request's input")
    assert families["custom_input_values"][:2] == ("histogram", "Input values")
    # one family per name, the series of both models in it (Triton merges families by name)
    found = {key: value for name in CUSTOM for key, value in families[name][2].items()}
    assert found == {**_series("metrics_local"), **_series("metrics_isolated")}
    # Triton's exact text: no "_total", labels sorted, "le" last and printed as C++ prints doubles
    assert '\ncustom_inputs_seen{model="metrics_isolated",version="1"} 5\n' in raw
    assert '\ncustom_input_values_bucket{model="metrics_local",version="1",le="1"} 2\n' in raw
    assert '\ncustom_input_values_sum{model="metrics_local",version="1"} 10.5\n' in raw

    client.unload_model("metrics_isolated")  # its process exits: its series go, the others stay
    _, families = _scrape(server)
    assert {key: value for name in CUSTOM for key, value in families[name][2].items()} == _series("metrics_local")

    client.unload_model("metrics_local")
    raw, families = _scrape(server)
    assert not set(CUSTOM) & set(families) and "custom_" not in raw

    client.load_model("metrics_local")  # a reload starts from zero
    _, families = _scrape(server)
    assert families["custom_inputs_seen"][2] == {("custom_inputs_seen", (("model", "metrics_local"), ("version", "1"))): 0}


MISUSE = {
    "negative": "Failed to increment metric value: Failed to process the request for model '{}', message: "
                "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values.",
    "observe_gauge": "Failed to observe metric value: Failed to process the request for model '{}', message: "
                     "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe",
    "labels": "Error when creating Metric: Failed to process the request for model '{}', message: Invalid label name",
    "kind": "Error when creating MetricFamily: Failed to process the request for model '{}', message: "
            "Family name already exists with different type",
}


@pytest.mark.parametrize("model", list(MODELS))
def test_misuse_fails_the_request_with_triton_message_and_the_server_keeps_serving(
    threaded_server, tmp_path, model: str
) -> None:
    server = _start(threaded_server, tmp_path, (model,))
    client = server.client("http")
    assert _infer(client, model, [1, 2]) == 2
    for misuse, message in MISUSE.items():
        with pytest.raises(InferenceServerException) as failure:
            _infer(client, model, [7], misuse=misuse)
        assert f"TritonModelException: {message.format(f'{model}_0')}" in str(failure.value)
    assert _infer(client, model, [1, 2, 3]) == 5  # nothing the failed requests tried was counted
    _, families = _scrape(server)
    labels = (("model", model), ("version", "1"))
    assert families["custom_inputs_seen"][:2] == ("counter", "Input elements seen")
    assert families["custom_inputs_seen"][2] == {("custom_inputs_seen", labels): 5}
    assert families["custom_last_sum"][2] == {("custom_last_sum", labels): 6}


def _in_model_thread(owner: str, store: CustomMetrics, code: Any) -> Any:
    """Run ``code`` on a fresh thread bound as a model instance's thread (the binding dies with it)."""

    def run() -> Any:
        pb_request.bind_thread(SimpleNamespace(custom_metrics=store), "", owner)
        return code()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()


def test_families_merge_by_name_and_go_with_their_objects_or_their_owner() -> None:
    store = CustomMetrics()

    def first_owner() -> Any:
        family = pb_utils.MetricFamily("shared_total", "first help", pb_utils.MetricFamily.COUNTER)
        family.Metric(labels={"k": "v"}).increment(2)
        with pytest.raises(pb_utils.TritonModelException, match="^Error when creating MetricFamily: "
                           "Family name already exists with different type$"):
            pb_utils.MetricFamily("shared_total", "other", pb_utils.MetricFamily.GAUGE)
        with pytest.raises(pb_utils.TritonModelException, match="^Failed to create metric. Missing required buckets.$"):
            pb_utils.MetricFamily("hist", "h", pb_utils.MetricFamily.HISTOGRAM).Metric(labels={})
        histogram = pb_utils.MetricFamily("hist", "h", pb_utils.MetricFamily.HISTOGRAM).Metric(buckets=[1.0])
        with pytest.raises(pb_utils.TritonModelException, match="^Failed to get metric value: "
                           "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value$"):
            histogram.value()
        return family

    def second_owner() -> tuple[Any, Any]:
        family = pb_utils.MetricFamily("shared_total", "second help", pb_utils.MetricFamily.COUNTER)
        metric = family.Metric(labels={"k": "v"})
        metric.increment(3)
        return metric, metric.value()

    kept = _in_model_thread("owner-a", store, first_owner)
    metric, value = _in_model_thread("owner-b", store, second_owner)
    assert value == 5  # same name and labels: one series
    [family] = store.families()
    assert (family.name, family.description, family.series[0][:2]) == ("shared_total", "first help", ((("k", "v"),), 5))

    store.release("owner-a")  # owner-a's model unloaded: owner-b still uses the series
    assert [view.series[0][1] for view in store.families()] == [5]
    del metric
    gc.collect()  # owner-b dropped its family object: the series goes with the last user
    assert store.families() == []
    with pytest.raises(pb_utils.TritonModelException, match="'MetricFamily' has been deleted"):
        kept.Metric(labels={"k": "v"})


def test_model_given_help_labels_and_non_finite_values_keep_the_scrape_parseable() -> None:
    from prometheus_client import CollectorRegistry

    from serving_pod.metrics import CustomMetricsCollector, render

    store = CustomMetrics()
    gauge = store.new_family("odd_gauge", 'two\nlines, a \\ and "quotes"', 1, "m")
    for labels, value in (({"path": 'C:\\dir\n"x"'}, float("nan")), ({"path": "up"}, float("inf")), ({}, -2.5)):
        store.update(store.new_metric(gauge, labels), "set", value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CustomMetricsCollector(store))
    [family] = text_string_to_metric_families(render(registry).decode())
    assert family.documentation == 'two\nlines, a \\ and "quotes"'
    values = {tuple(sample.labels.items()): sample.value for sample in family.samples}
    assert values[()] == -2.5 and values[(("path", "up"),)] == float("inf")
    assert np.isnan(values[(("path", 'C:\\dir\n"x"'),)])
