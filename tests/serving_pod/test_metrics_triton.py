"""``/metrics`` side by side with NVIDIA Triton 2.51: the same models and requests, the same families and counts.

The python models of ``data/metrics`` get the same request sequence on Ferry and on Triton (skipped with the
installer's reason where it cannot be had): successes, a model that raises (``BACKEND``), an error response (a
success, as Triton counts it), a shape refused before the scheduler and a batch over ``max_batch_size`` (counted
nowhere), a queue-full refusal (counted nowhere), queue timeouts (``REJECTED``), an ensemble whose second step
fails (``OTHER``, twice per request as in Triton), a decoupled model over a gRPC stream (one success per request,
whatever its responses), two versions. Every ``nv_inference_*`` family must have the same type, help text and
series, and the same value where it is a count (not a duration); Triton's are recorded here (``FAMILIES``,
``COUNTS``, ``FAILURES``, ``TRITON_QUANTILES``, ``TRITON_OPERATED``, ``TRITON_CUSTOM_LINES``): Ferry runs against
them by default, Triton in slow tests. Custom metrics of a python
model (``pb_utils.MetricFamily``) must read and print the same, and misuse must get the same messages.

Kept different on purpose, where Triton 2.51 is junk:

- ``--metrics-config=counter_latencies=false``: Triton stops counting successes, failures, inferences and
  executions too (they stay 0); Ferry drops only the duration counters and keeps counting.
- Unloading a version: Triton removes its series but its four ``nv_inference_request_failure`` ones, which stay
  forever (and a reload goes on from the old failures while successes restart at 0); Ferry removes them all.
  Triton also keeps a python model's custom families after it is unloaded; Ferry removes them with the model.
- Custom metrics: a call Triton's core refuses often aborts the whole Triton server (a
  ``boost::interprocess::lock_exception`` in the python backend): always for ``Metric.increment(-1)`` of a counter,
  ``observe`` on a gauge, an invalid or ``__``-reserved label name and an empty family name, at random for the
  others, so their messages are checked against the text Triton gave where it survived (``REFUSED``). Ferry fails
  only that call, with the same message. Triton takes a NaN or infinite histogram bound and a histogram label named
  ``le``, and prints lines a Prometheus server cannot parse; Ferry refuses them. Triton prints a help text raw (a
  newline or a backslash breaks the scrape); Ferry escapes it. A family deleted before its metrics makes their later
  use fail in Triton; in Ferry a metric keeps its family alive. A model family named as one of the server's own
  (``nv_inference_count``) shares the server's series in Triton (the model can count into ``nv_inference_count``);
  Ferry refuses the name (printed twice it broke the scrape).
- ``nv_pinned_memory_pool_total_bytes``: Triton reports ``--pinned-memory-pool-byte-size`` (256 MiB by default)
  from its first metrics poll on, also on a CPU-only host where it holds no pool; Ferry holds none and says 0.
- ``summary_quantiles``: Triton exports a quantile over 1 (``1.5:0.01``) and reads ``0.5:0.05:1`` as
  ``0.5:0.05``; Ferry skips such a pair with a warning (an error over 1 it takes, as Triton).
- Not in 2.51, from later Tritons: ``nv_model_load_duration_secs``, and ``histogram_latencies=true`` (2.51 ignores
  it). Ferry keeps the first-response histogram of later Tritons: for decoupled models only.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.traffic import int32_rows as _rows
from support.traffic import post_infer as _post
from support.traffic import stream_answers as _stream
from support.server import ServerThread, make_options

from serving_pod.core.latency_metrics import parse_metrics_config

DATA = Path(__file__).resolve().parent / "data" / "metrics"
MODELS = ("flaky", "queued", "timed", "dec", "ident", "ens", "ver")
FLAGS = ("--metrics-config=summary_latencies=true", "--metrics-config=histogram_latencies=true")
HISTOGRAM = "nv_inference_first_response_histogram_ms"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("metrics_triton") / "models"
    shutil.copytree(DATA, repo, ignore=shutil.ignore_patterns("__pycache__"))
    (repo / "ens" / "1").mkdir()  # an ensemble's version folder is empty (git keeps no empty folder)
    return repo


@contextlib.contextmanager
def _ferry(repository: Path, models: tuple[str, ...], flags: tuple[str, ...] = ()) -> Iterator[tuple[int, int, int]]:
    """Ferry with ``flags`` (``--metrics-config`` ones) serving ``models``; its (http, grpc, metrics) ports."""
    settings, warnings = parse_metrics_config(flag.split("=", 1)[1].split("=", 1) for flag in flags)  # type: ignore[misc]
    assert warnings == []
    thread = ServerThread(make_options([repository], model_control_mode="explicit", load_models=models,
                                       latency_metrics=settings))
    handle = thread.start()
    try:
        yield handle.server.http_port, handle.server.grpc_port, handle.server.metrics_port
    finally:
        thread.stop()


def _triton(repository: Path, models: tuple[str, ...], flags: tuple[str, ...] = ()) -> Any:
    from support.triton import running_triton

    return running_triton(repository, models, *flags)


def _traffic(http: int, grpc: int) -> list[int]:
    """The request sequence of the module docstring; the HTTP status codes and the stream's answer count."""
    codes = [
        _post(http, "flaky", _rows([0, 0])),
        _post(http, "flaky", _rows([0, 0], [0, 0], [0, 0])),
        _post(http, "flaky", _rows([0, 1])),                            # raises: BACKEND
        _post(http, "flaky", _rows([0, 2])),                            # an error response (500): a success
        _post(http, "flaky", _rows([0, 0], [0, 0], shape=[1, 4])),      # wrong shape: refused before the model
        _post(http, "flaky", _rows(*[[0, 0]] * 9)),                     # over max_batch_size
        _post(http, "ens", _rows([0, 0], [0, 0])),
        _post(http, "ens", _rows([0, 1])),                              # second step raises: OTHER (twice)
        _post(http, "ver/versions/1", _rows([0, 0])),
        _post(http, "ver/versions/2", _rows([0, 0])),
        _post(http, "ver", _rows([0, 0])),
    ]
    with ThreadPoolExecutor(4) as pool:
        busy = pool.submit(_post, http, "queued", _rows([1500, 0]))     # holds the one instance
        time.sleep(0.5)
        queued = pool.submit(_post, http, "queued", _rows([0, 0]))      # fills the queue (max_queue_size 1)
        time.sleep(0.3)
        codes += [_post(http, "queued", _rows([0, 0])), _post(http, "queued", _rows([0, 0]))]  # queue full
        codes += [busy.result(), queued.result()]
        busy = pool.submit(_post, http, "timed", _rows([1000, 0]))
        time.sleep(0.3)
        late = [pool.submit(_post, http, "timed", _rows([0, 0])) for _ in range(2)]  # wait over 100 ms: REJECTED
        codes += [busy.result()] + [future.result() for future in late]
    codes.append(_stream(grpc, "dec", (3, 0, -1, -2, 1), 7))  # -1: an error, -2: a response and an error
    return codes


def _scrape(metrics: int) -> dict[str, Any]:
    text = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=10).text
    return {family.name: family for family in text_string_to_metric_families(text)}


def _deterministic(family: Any) -> tuple[str, str, list[tuple[str, tuple, Any]]]:
    """Type, help and series of a family, with the value where it is a count (durations read as None)."""
    timed = family.name.endswith(("_us", "_ms"))
    samples = []
    for sample in family.samples:
        value = sample.value if not timed or sample.name.endswith("_count") else None
        samples.append((sample.name, tuple(sorted(sample.labels.items())), value))
    return family.type, family.documentation, sorted(samples, key=repr)


#: Triton 2.51's status codes for ``_traffic`` (index 4, the wrong shape, is left out when Triton is compared: it
#: has been seen to answer it 500 where Ferry answers 400; not a metrics matter)
CODES = [200, 200, 500, 500, 400, 400, 200, 500, 200, 200, 200, 503, 503, 200, 200, 200, 503, 503, 7]
#: the series of every ``nv_inference_*`` family after ``_traffic``, in Triton 2.51: (model, version)
SERIES = (("dec", "1"), ("ens", "1"), ("flaky", "1"), ("ident", "1"), ("queued", "1"), ("timed", "1"), ("ver", "1"),
          ("ver", "2"))
#: Triton 2.51's counts per series of ``SERIES`` after ``_traffic``: every summary's ``_count`` is the successes
COUNTS = {
    "nv_inference_request_success": (4, 1, 4, 2, 2, 1, 1, 2),
    "nv_inference_count": (4, 2, 7, 3, 2, 1, 1, 2),
    "nv_inference_exec_count": (5, 1, 6, 2, 2, 1, 1, 2),
    "nv_inference_pending_request_count": (0,) * 8,
}
#: Triton 2.51's failures after ``_traffic`` (every other (series, reason) reads 0)
FAILURES = {("dec", "1", "BACKEND"): 1, ("ens", "1", "OTHER"): 2, ("flaky", "1", "BACKEND"): 2,
            ("timed", "1", "REJECTED"): 2}
REASONS = ("BACKEND", "CANCELED", "OTHER", "REJECTED")
QUANTILES = ("0.5", "0.9", "0.95", "0.99", "0.999")
_NOT_CACHED, _CACHED = "(does not include cached requests)", "(includes cached requests)"
#: the ``nv_inference_*`` families Triton 2.51 exports with ``FLAGS``: (type, help)
FAMILIES = {
    "nv_inference_compute_infer_duration_us":
        ("counter", f"Cumulative compute inference duration in microseconds {_NOT_CACHED}"),
    "nv_inference_compute_infer_summary_us":
        ("summary", f"Cumulative compute inference duration in microseconds {_NOT_CACHED}"),
    "nv_inference_compute_input_duration_us":
        ("counter", f"Cumulative compute input duration in microseconds {_NOT_CACHED}"),
    "nv_inference_compute_input_summary_us":
        ("summary", f"Cumulative compute input duration in microseconds {_NOT_CACHED}"),
    "nv_inference_compute_output_duration_us":
        ("counter", f"Cumulative inference compute output duration in microseconds {_NOT_CACHED}"),
    "nv_inference_compute_output_summary_us":
        ("summary", f"Cumulative inference compute output duration in microseconds {_NOT_CACHED}"),
    "nv_inference_count": ("counter", f"Number of inferences performed {_NOT_CACHED}"),
    "nv_inference_exec_count": ("counter", f"Number of model executions performed {_NOT_CACHED}"),
    "nv_inference_pending_request_count":
        ("gauge", "Instantaneous number of pending requests awaiting execution per-model."),
    "nv_inference_queue_duration_us": ("counter", f"Cumulative inference queuing duration in microseconds {_CACHED}"),
    "nv_inference_queue_summary_us": ("summary", f"Summary of inference queuing duration in microseconds {_CACHED}"),
    "nv_inference_request_duration_us":
        ("counter", f"Cumulative inference request duration in microseconds {_CACHED}"),
    "nv_inference_request_failure": ("counter", "Number of failed inference requests, all batch sizes"),
    "nv_inference_request_success": ("counter", "Number of successful inference requests, all batch sizes"),
    "nv_inference_request_summary_us": ("summary", f"Summary of inference request duration in microseconds {_CACHED}"),
}


def _expected(name: str) -> tuple[str, str, list[tuple[str, tuple, Any]]]:
    """``_deterministic`` of family ``name`` as Triton 2.51 exports it after ``_traffic``."""
    kind, documentation = FAMILIES[name]
    samples: list[tuple[str, tuple, Any]] = []
    for index, (model, version) in enumerate(SERIES):
        labels = (("model", model), ("version", version))
        if kind == "summary":
            samples += [(name, (labels[0], ("quantile", q), labels[1]), None) for q in QUANTILES]
            samples += [(f"{name}_sum", labels, None),
                        (f"{name}_count", labels, COUNTS["nv_inference_request_success"][index])]
        elif name == "nv_inference_request_failure":
            samples += [(f"{name}_total", (labels[0], ("reason", reason), labels[1]),
                         FAILURES.get((model, version, reason), 0)) for reason in REASONS]
        else:
            counts = COUNTS.get(name)
            samples.append((name if kind == "gauge" else f"{name}_total", labels, counts[index] if counts else None))
    return kind, documentation, sorted(samples, key=repr)


def test_request_metrics_match_nvidia_tritons(repository: Path) -> None:
    """The traffic of Triton 2.51 on Ferry: Triton's ``nv_inference_*`` families, series and counts, and no
    first-response histogram for a model that is not decoupled (Ferry had one for every model)."""
    with _ferry(repository, MODELS, FLAGS) as (http, grpc, metrics):
        ferry_codes = _traffic(http, grpc)
        ferry = _scrape(metrics)

    assert ferry_codes == CODES
    histogram_models = {sample.labels["model"] for sample in ferry.pop(HISTOGRAM).samples}
    assert histogram_models == {"dec"}  # later Tritons: decoupled models only
    assert sorted(name for name in ferry if name.startswith("nv_inference_")) == sorted(FAMILIES)
    for name in FAMILIES:
        assert _deterministic(ferry[name]) == _expected(name), name

    def value(family: str, model: str, version: str = "1", **labels: str) -> float:
        wanted = {"model": model, "version": version, **labels}
        return next(s.value for s in ferry[family].samples if s.labels == wanted)

    success, failure = "nv_inference_request_success", "nv_inference_request_failure"
    assert [value(success, "flaky"), value(failure, "flaky", reason="BACKEND")] == [4, 2]  # direct: 3 and 1; through the ensemble: 1 and 1
    assert [value(success, "ens"), value(failure, "ens", reason="OTHER")] == [1, 2]
    assert [value(success, "queued"), value(failure, "queued", reason="REJECTED")] == [2, 0]  # queue full: nowhere
    assert [value(success, "timed"), value(failure, "timed", reason="REJECTED")] == [1, 2]
    assert [value(success, "dec"), value(failure, "dec", reason="BACKEND"), value("nv_inference_count", "dec")] == [4, 1, 4]
    assert [value(success, "ver", "1"), value(success, "ver", "2")] == [1, 2]


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_triton_request_metrics_as_recorded(repository: Path) -> None:
    with _triton(repository, MODELS, FLAGS) as (http, grpc, metrics):
        triton_codes = _traffic(http, grpc)
        time.sleep(0.2)
        triton = _scrape(metrics)
    assert [c for i, c in enumerate(triton_codes) if i != 4] == [c for i, c in enumerate(CODES) if i != 4]
    assert HISTOGRAM not in triton  # 2.51 has no histogram_latencies
    assert sorted(name for name in triton if name.startswith("nv_inference_")) == sorted(FAMILIES)
    for name in FAMILIES:
        assert _deterministic(triton[name]) == _expected(name), name


QUANTILE_FLAGS = ("--metrics-config=summary_latencies=true", "--metrics-config=summary_quantiles=0.25:2,0.75:0.01")
#: the queue summary's (sample name, quantile) with ``QUANTILE_FLAGS`` after one request, as Triton 2.51 exports it
#: (recorded from a live Triton; the slow ``test_nvidia_tritons_summary_quantiles_as_recorded`` compares a live one)
TRITON_QUANTILES = [("nv_inference_queue_summary_us", "0.25"), ("nv_inference_queue_summary_us", "0.75"),
                    ("nv_inference_queue_summary_us_count", None), ("nv_inference_queue_summary_us_sum", None)]


def _quantiles(server: Any, repository: Path) -> list[tuple[str, str | None]]:
    with server(repository, ("ident",), QUANTILE_FLAGS) as (http, _, metrics):
        assert _post(http, "ident", _rows([1, 2])) == 200
        family = _scrape(metrics)["nv_inference_queue_summary_us"]
    return sorted((s.name, s.labels.get("quantile")) for s in family.samples)


def test_summary_quantiles_match_nvidia_tritons(repository: Path) -> None:
    """``summary_quantiles`` with an error over 1: Triton takes the pair (the error only loosens its estimate); Ferry
    refused it and, with no pair left, exported its five default quantiles instead."""
    assert _quantiles(_ferry, repository) == TRITON_QUANTILES


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_tritons_summary_quantiles_as_recorded(repository: Path) -> None:
    assert _quantiles(_triton, repository) == TRITON_QUANTILES


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_first_response_histogram_only_for_decoupled_models(repository: Path, protocol: str) -> None:
    """``histogram_latencies=true``: the decoupled model's histogram counts each request's first response (an error
    one too), in the model's own buckets; a model with one response per request has none, and no recorder either
    (its requests pay nothing); ``summary_latencies`` still gives it summaries."""
    config = repository / "dec" / "config.pbtxt"
    original = config.read_text()
    config.write_text(original + """
model_metrics { metric_control [ { metric_identifier { family: "nv_inference_first_response_histogram_ms" }
                                   histogram_options { buckets: [ 1000, 60000 ] } } ] }
""")
    try:
        with _ferry(repository, ("dec", "ident"), ("--metrics-config=histogram_latencies=true",)) as (http, grpc, metrics):
            _identity(protocol, http, grpc)
            assert _stream(grpc, "dec", (2, -1, -2), 5) == 5
            families = _scrape(metrics)
        with _ferry(repository, ("ident",), FLAGS) as (http, grpc, metrics):
            _identity(protocol, http, grpc)
            summaries = _scrape(metrics)
    finally:
        config.write_text(original)
    samples = {(s.name, s.labels.get("le")): s.value for s in families[HISTOGRAM].samples}
    assert {s.labels["model"] for s in families[HISTOGRAM].samples} == {"dec"}
    # three requests answered (the one that raised too); sub-second, so every bucket holds all three
    assert samples == {(f"{HISTOGRAM}_count", None): 3, (f"{HISTOGRAM}_sum", None): pytest.approx(samples[(f"{HISTOGRAM}_sum", None)]),
                       (f"{HISTOGRAM}_bucket", "1000"): 3, (f"{HISTOGRAM}_bucket", "60000"): 3,
                       (f"{HISTOGRAM}_bucket", "+Inf"): 3}
    assert HISTOGRAM not in summaries
    count = [s.value for s in summaries["nv_inference_request_summary_us"].samples if s.name.endswith("_count")]
    assert count == [1]


def test_no_latency_recorder_for_a_model_with_nothing_to_record(repository: Path, threaded_server: Any) -> None:
    from serving_pod.core.latency_metrics import LatencyMetricsSettings

    server = threaded_server([repository], model_control_mode="explicit", load_models=("dec", "ident"),
                             latency_metrics=LatencyMetricsSettings(histogram_latencies=True))
    assert server.engine.registry.get("ident", "").stats.latency is None
    assert server.engine.registry.get("dec", "").stats.latency.first_response is not None


def _identity(protocol: str, http: int, grpc: int) -> None:
    if protocol == "http":
        assert _post(http, "ident", _rows([1, 2])) == 200
        return
    import tritonclient.grpc as grpcclient

    tensor = grpcclient.InferInput("X", [1, 2], "INT32")
    tensor.set_data_from_numpy(np.array([[1, 2]], np.int32))
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
    client.infer("ident", [tensor])
    client.close()


#: uses of the custom metrics API that Triton 2.51 answers reliably, in order (the module docstring lists others)
OPERATIONS = ("update", "histogram_without_buckets", "buckets_on_counter", "same_family_again", "second_series",
              "server_family", "update")

_PREFIX = "Failed to process the request for model 'custom_0', message: "
#: Triton 2.51's answers to calls its core refuses, as it gave them where it did not abort (module docstring)
REFUSED = {
    "set_counter": f"Failed to set metric value: {_PREFIX}TRITONSERVER_METRIC_KIND_COUNTER does not support Set",
    "histogram_value": f"Failed to get metric value: {_PREFIX}TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value",
    "histogram_increment":
        f"Failed to increment metric value: {_PREFIX}TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment",
    "unsorted_buckets": f"Error when creating Metric: {_PREFIX}Bucket Boundaries must be strictly sorted",
    "equal_buckets": f"Error when creating Metric: {_PREFIX}Bucket Boundaries must be strictly sorted",
    "label_value_not_string": f"Error when creating Metric: {_PREFIX}attempt to access JSON non-string as string",
    "invalid_name": f"Error when creating MetricFamily: {_PREFIX}Invalid metric name",
    "kind_clash": f"Error when creating MetricFamily: {_PREFIX}Family name already exists with different type",
}


def _operate(http: int, operations: tuple[str, ...]) -> list[str]:
    answers = []
    for op in operations:
        body = {"inputs": [{"name": "OP", "datatype": "BYTES", "shape": [1], "data": [op]}]}
        response = httpx.post(f"http://127.0.0.1:{http}/v2/models/custom/infer", json=body, timeout=60)
        assert response.status_code == 200, response.text
        answers.append(response.json()["outputs"][0]["data"][0])
    return answers


def _custom_text(metrics: int) -> tuple[list[str], str]:
    """The custom families' lines, series sorted within each family (prometheus-cpp prints them in hash order),
    and the whole scrape."""
    text = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=10).text
    families: dict[str, list[str]] = {}
    for line in text.splitlines():
        name = line.split()[2] if line.startswith("#") else line.split("{")[0].split()[0]
        family = name.removesuffix("_count").removesuffix("_sum").removesuffix("_bucket")
        if family.startswith("custom_"):
            families.setdefault(family, []).append(line)
    return [line for family in sorted(families) for line in
            [l for l in families[family] if l.startswith("#")] + sorted(l for l in families[family] if not l.startswith("#"))], text


#: Triton 2.51's answers to ``OPERATIONS`` and its custom lines after them (``_custom_text``), recorded from a live
#: Triton; the slow ``test_nvidia_tritons_custom_metrics_as_recorded`` compares a live one with them
TRITON_OPERATED: list[str] = [
    "2.0 -2.25", "TritonModelException: Failed to create metric. Missing required buckets.",
    "TritonModelException: Failed to create metric. Unexpected buckets found.", "42.0", "ok", "ok", "4.0 -2.25"]
TRITON_CUSTOM_LINES: list[str] = [
    '# HELP custom_counter A counter \\ with "quotes"', "# TYPE custom_counter counter", "custom_counter 1",
    'custom_counter{a="x\\"y\\\\z\\nw",b="2"} 4',
    "# HELP custom_gauge A gauge", "# TYPE custom_gauge gauge", 'custom_gauge{model="custom"} -2.25',
    'custom_gauge{x="y"} +Inf',
    "# HELP custom_histogram A histogram", "# TYPE custom_histogram histogram",
    'custom_histogram_bucket{k="v",le="+Inf"} 8', 'custom_histogram_bucket{k="v",le="1"} 4',
    'custom_histogram_bucket{k="v",le="2.5"} 4', 'custom_histogram_bucket{k="v",le="5"} 6',
    'custom_histogram_count{k="v"} 8', 'custom_histogram_sum{k="v"} 26.2']
_RAW_HELP = '# HELP custom_counter A counter \\ with "quotes"'  # Triton prints the backslash raw


def test_custom_metrics_match_nvidia_tritons_but_server_family_names(repository: Path) -> None:
    """The same calls of a python model as on Triton 2.51 (``TRITON_OPERATED``, ``TRITON_CUSTOM_LINES``): the same
    values read, the same messages, the same custom lines on ``/metrics`` (a help text with a backslash: Triton prints
    it raw, Ferry escapes it). A family named ``nv_inference_count``: Triton hands the model its own (the model
    counts 100 inferences into it); Ferry printed the family twice, which breaks the scrape, and now refuses the
    name."""
    with _ferry(repository, ("custom",)) as (http, _, metrics):
        ferry = _operate(http, OPERATIONS), *_custom_text(metrics)
        refused = _operate(http, tuple(REFUSED))
        assert _operate(http, ("update",)) == ["6.0 -2.25"]  # the model goes on
    clash = OPERATIONS.index("server_family")
    assert ferry[0][:clash] + ferry[0][clash + 1:] == TRITON_OPERATED[:clash] + TRITON_OPERATED[clash + 1:]
    assert ferry[0][:2] == ["2.0 -2.25", "TritonModelException: Failed to create metric. Missing required buckets."]
    assert ferry[0][clash] == (
        f"TritonModelException: Error when creating MetricFamily: {_PREFIX}Family name already exists: "
        "'nv_inference_count' is one of the server's own metric families")
    assert ferry[2].count("# TYPE nv_inference_count counter") == 1
    assert 'nv_inference_count{model="custom",version="1"} 7\n' in ferry[2]

    assert _RAW_HELP.replace("\\", "\\\\") in ferry[1]
    assert [line for line in ferry[1] if not line.startswith("# HELP custom_counter")] == \
        [line for line in TRITON_CUSTOM_LINES if not line.startswith("# HELP custom_counter")]
    assert 'custom_gauge{x="y"} +Inf' in ferry[1] and 'custom_histogram_bucket{k="v",le="2.5"} 4' in ferry[1]
    assert refused == [f"TritonModelException: {message}" for message in REFUSED.values()]


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_tritons_custom_metrics_as_recorded(repository: Path) -> None:
    with _triton(repository, ("custom",)) as (http, _, metrics):
        triton = _operate(http, OPERATIONS), *_custom_text(metrics)
    assert triton[0][OPERATIONS.index("server_family")] == "ok"
    assert 'nv_inference_count{model="custom",version="1"} 107\n' in triton[2]
    assert _RAW_HELP in triton[1]
    assert (triton[0], triton[1]) == (TRITON_OPERATED, TRITON_CUSTOM_LINES)


def test_histograms_that_would_break_the_scrape_are_refused(repository: Path) -> None:
    """Triton 2.51 takes a NaN bound (printed ``le="Nan"``), an infinite one (a second ``le="+Inf"`` line) and a
    label named ``le`` (printed twice on each bucket line); Ferry took them too, and now refuses each call."""
    with _ferry(repository, ("custom",)) as (http, _, metrics):
        answers = _operate(http, ("nan_bucket", "inf_bucket", "le_label", "update"))
        lines, _ = _custom_text(metrics)
    finite = f"TritonModelException: Error when creating Metric: {_PREFIX}Bucket Boundaries must be finite numbers"
    label = f"TritonModelException: Error when creating Metric: {_PREFIX}Invalid label name: 'le' is the histogram's bucket label"
    assert answers == [finite, finite, label, "2.0 -2.25"]
    assert [line for line in lines if "custom_histogram_bucket" in line] == [
        'custom_histogram_bucket{k="v",le="+Inf"} 4', 'custom_histogram_bucket{k="v",le="1"} 2',
        'custom_histogram_bucket{k="v",le="2.5"} 2', 'custom_histogram_bucket{k="v",le="5"} 3']


def test_server_families_are_all_reserved(repository: Path) -> None:
    """Every family Ferry exports itself, with every option on, is one a model may not take."""
    from types import SimpleNamespace

    from serving_pod.core.custom_metrics import SERVER_FAMILIES
    from serving_pod.metrics import GpuCollector

    config = repository / "flaky" / "config.pbtxt"
    original = config.read_text()
    config.write_text(original + "response_cache { enable: true }\n")
    try:
        thread = ServerThread(make_options([repository], model_control_mode="explicit", load_models=("flaky", "dec"),
                                           latency_metrics=parse_metrics_config([("summary_latencies", "true"),
                                                                                 ("histogram_latencies", "true")])[0],
                                           cache_config={"local": {"size": "1048576"}}))
        handle = thread.start()
        try:
            assert _post(handle.server.http_port, "flaky", _rows([0, 0])) == 200
            assert _stream(handle.server.grpc_port, "dec", (1,), 1) == 1
            exported = set(_scrape(handle.server.metrics_port))
        finally:
            thread.stop()
    finally:
        config.write_text(original)

    class Nvml:  # one GPU answering every query
        NVMLError = RuntimeError
        nvmlDeviceGetCount = staticmethod(lambda: 1)
        nvmlDeviceGetHandleByIndex = staticmethod(lambda index: index)
        nvmlDeviceGetUUID = staticmethod(lambda handle: "GPU-0")
        nvmlDeviceGetTotalEnergyConsumption = staticmethod(lambda handle: 1000)
        nvmlDeviceGetUtilizationRates = staticmethod(lambda handle: SimpleNamespace(gpu=50))
        nvmlDeviceGetMemoryInfo = staticmethod(lambda handle: SimpleNamespace(total=2, used=1))
        nvmlDeviceGetPowerUsage = staticmethod(lambda handle: 1000)
        nvmlDeviceGetPowerManagementLimit = staticmethod(lambda handle: 2000)

    exported |= {metric.name for metric in GpuCollector(Nvml()).collect()}
    assert "nv_cache_util" in exported and "nv_cache_miss_summary_per_model" in exported and HISTOGRAM in exported
    assert exported - SERVER_FAMILIES == set()
