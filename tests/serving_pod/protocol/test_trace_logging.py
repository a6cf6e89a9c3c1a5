"""Trace and logging extensions over HTTP and gRPC: settings round-trip, trace JSON, read-only file paths."""

from __future__ import annotations

import json
import logging
import time

import httpx
import numpy as np
import pytest
from support.server import test_model_config, write_model
from tritonclient.utils import InferenceServerException

from serving_pod.logging_settings import LogSettings
from serving_pod.trace import Tracer
from serving_pod.trace_config import TraceConfig, parse_trace_config

PROTOCOLS = ["http", "grpc"]


@pytest.fixture
def trace_file(tmp_path):
    return tmp_path / "out" / "trace.json"


@pytest.fixture
def server(threaded_server, tmp_path, trace_file):
    repo = tmp_path / "repo"
    write_model(repo, "idt", test_model_config("idt"))
    write_model(repo, "other", test_model_config("other"))
    trace_file.parent.mkdir()
    return threaded_server([repo], trace=TraceConfig(file=str(trace_file)), log_file=str(tmp_path / "server.log"))


def _infer(server, protocol, model="idt", count=1):
    client, module = server.client(protocol), server.module(protocol)
    infer_input = module.InferInput("INPUT0", [1, 4], "FP32")
    infer_input.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    for _ in range(count):
        client.infer(model, [infer_input], request_id="r1")


def traces_of(path) -> dict[int, dict]:
    """Triton's trace file grouped by trace id: the identity fields, ``timestamps`` ({name, ns} in file order),
    ``names`` (their names) and ``tensors`` ((activity, tensor) pairs)."""
    traces: dict[int, dict] = {}
    for record in json.loads(path.read_text()):
        trace = traces.setdefault(record["id"], {"timestamps": [], "tensors": []})
        if "timestamps" in record:
            trace["timestamps"] += record["timestamps"]
        elif "activity" in record:
            trace["tensors"].append((record["activity"], record["tensor"]))
        else:
            assert not trace.keys() & record.keys() - {"id"}, record  # one identity record per trace
            trace.update(record)
    for trace in traces.values():
        trace["names"] = [t["name"] for t in trace["timestamps"]]
    return traces


#: the front end's timestamps before the engine's (the request read) and after them (the response sent)
FRONTEND = {"http": (["HTTP_RECV_START", "HTTP_RECV_END"], ["HTTP_SEND_START", "HTTP_SEND_END"]),
            "grpc": (["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"], ["GRPC_SEND_START", "GRPC_SEND_END"])}


def _traced(path, count: int) -> dict[int, dict]:
    """``traces_of(path)`` once it holds ``count`` traces: a trace is written after its response is sent, so the
    client may have the answer a moment before the file has the trace (at most a few seconds)."""
    deadline = time.monotonic() + 5
    while True:
        try:
            traces = traces_of(path) if path.exists() else {}
        except json.JSONDecodeError:  # caught while the server appends a trace
            traces = {}
        if len(traces) >= count or time.monotonic() > deadline:
            return traces
        time.sleep(0.01)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_refused_traced_requests_leave_no_trace_and_the_next_is_written(server, protocol, trace_file):
    """A request refused before its model runs (a wrong shape) while tracing is on answers its error and leaves no
    trace; the next one's trace has the front end's timestamps around the engine's."""
    client, module = server.client(protocol), server.module(protocol)
    client.update_trace_settings(model_name="idt", settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    wrong = module.InferInput("INPUT0", [1, 3], "FP32")
    wrong.set_data_from_numpy(np.ones((1, 3), dtype=np.float32))
    for _ in range(2):
        with pytest.raises(InferenceServerException, match="INPUT0"):
            client.infer("idt", [wrong], request_id="bad")
    _infer(server, protocol)
    (trace,) = _traced(trace_file, 1).values()
    received, sent = FRONTEND[protocol]
    assert trace["request_id"] == "r1"
    assert trace["names"][:3] == [*received, "REQUEST_START"] and trace["names"][-2:] == sent


def _settings(value, protocol):
    if protocol == "http":
        return value
    return {k: list(v.value) if k == "trace_level" else v.value[0] for k, v in value.settings.items()}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_trace_settings_and_trace_file(server, protocol, trace_file):
    client = server.client(protocol)
    initial = _settings(client.get_trace_settings(), protocol)
    assert initial["trace_level"] == ["OFF"] and initial["trace_rate"] == "1000"
    assert initial["trace_file"] == str(trace_file)
    _infer(server, protocol)
    assert not trace_file.exists()  # tracing is off

    updated = _settings(client.update_trace_settings(
        model_name="idt", settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "2"}), protocol)
    assert updated["trace_level"] == ["TIMESTAMPS"] and updated["trace_rate"] == "2"
    assert _settings(client.get_trace_settings(), protocol)["trace_level"] == ["OFF"]  # global unchanged
    _infer(server, protocol, count=4)
    _infer(server, protocol, model="other", count=2)  # not traced: its setting is the global OFF

    traces = _traced(trace_file, 2)  # every 2nd of 4 requests
    first, second = traces.values()
    received, sent = FRONTEND[protocol]
    assert first["names"] == [*received, "REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
                              "COMPUTE_OUTPUT_START", "COMPUTE_END", "INFER_RESPONSE_COMPLETE", "REQUEST_END",
                              *sent]
    ns = [t["ns"] for t in first["timestamps"]]
    assert ns == sorted(ns) and ns[0] > 0
    assert {t["model_name"] for t in traces.values()} == {"idt"} and first["model_version"] == 1
    assert first["request_id"] == "r1" and first["id"] != second["id"]

    # count limits the number of traces; a null value resets a model setting to the global one
    client.update_trace_settings(model_name="idt", settings={"trace_rate": "1", "trace_count": "1"})
    _infer(server, protocol, count=3)
    assert len(_traced(trace_file, 3)) == 3
    reset = _settings(client.update_trace_settings(model_name="idt", settings={"trace_level": None}), protocol)
    assert reset["trace_level"] == ["OFF"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_trace_file_cannot_be_moved_and_bad_values_are_refused(server, protocol, tmp_path):
    client = server.client(protocol)
    target = tmp_path / "evil.json"
    with pytest.raises(InferenceServerException, match="trace file location can not be updated"):
        client.update_trace_settings(settings={"trace_file": str(target)})
    with pytest.raises(InferenceServerException, match="Unable to parse 'trace_rate', got: fast"):
        client.update_trace_settings(settings={"trace_rate": "fast"})
    with pytest.raises(InferenceServerException, match="Expect only one trace level 'OFF'"):
        client.update_trace_settings(settings={"trace_level": ["OFF", "TIMESTAMPS"]})
    with pytest.raises(InferenceServerException, match="Request for unknown model : nope"):
        client.get_trace_settings(model_name="nope")
    _infer(server, protocol)
    assert not target.exists()


@pytest.mark.parametrize("value", [5, 1.5, {"TIMESTAMPS": 1}, ["TIMESTAMPS", 2]])
def test_http_trace_level_of_the_wrong_type_is_refused(server, value):
    """A JSON trace_level that is neither a string nor an array of strings: 400 (it was a 500 for a number)."""
    import httpx

    for path in ("/v2/trace/setting", "/v2/models/idt/trace/setting"):
        response = httpx.post(f"http://{server.http_url}{path}", json={"trace_level": value}, timeout=30)
        assert response.status_code == 400, response.text
        assert "Unable to parse 'trace_level': expected a string or an array of strings" in response.json()["error"]
    assert server.client("http").get_trace_settings()["trace_level"] == ["OFF"]


def _log(value, protocol):
    if protocol == "http":
        return value
    return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in value.settings.items()}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_log_settings_update_and_read_only_log_file(server, protocol, tmp_path):
    client = server.client(protocol)
    current = _log(client.get_log_settings(), protocol)
    assert current == {"log_file": str(tmp_path / "server.log"), "log_info": True, "log_warning": True,
                       "log_error": True, "log_verbose_level": 0, "log_format": "default"}
    new = _log(client.update_log_settings({"log_verbose_level": 1, "log_info": False, "log_format": "ISO8601"}),
               protocol)
    assert new["log_verbose_level"] == 1 and new["log_info"] is False and new["log_format"] == "ISO8601"
    assert logging.getLogger("ferry").level == logging.DEBUG
    target = tmp_path / "evil.log"
    with pytest.raises(InferenceServerException, match="log file location can not be updated through network protocol"):
        client.update_log_settings({"log_file": str(target), "log_info": True})
    assert _log(client.get_log_settings(), protocol)["log_info"] is False  # nothing applied from a refused update
    # tritonserver 2.51's words differ by protocol: HTTP 503 "--log_format", gRPC INVALID_ARGUMENT "log_format"
    flag = "--log_format" if protocol == "http" else "log_format"
    with pytest.raises(InferenceServerException, match=f"invalid argument for {flag}, got: xml") as info:
        client.update_log_settings({"log_format": "xml"})
    assert info.value.message() == f"invalid argument for {flag}, got: xml"
    assert str(info.value.status()) in ("503", "StatusCode.INVALID_ARGUMENT")
    client.update_log_settings({"log_verbose_level": 0, "log_info": True, "log_format": "default"})
    _infer(server, protocol)
    assert not target.exists()


def test_installed_log_settings_write_to_the_log_file_and_filter_levels(tmp_path):
    log_file = tmp_path / "ferry.log"
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    settings = LogSettings(file=str(log_file))
    try:
        settings.install()
        logging.getLogger("ferry.test").info("hello info")
        settings.update({"log_info": False})
        logging.getLogger("ferry.test").info("hidden info")
        logging.getLogger("ferry.test").warning("a warning")
        settings.handler.flush()
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    text = log_file.read_text()
    assert "hello info" in text and "a warning" in text and "hidden info" not in text


def test_trace_config_flags_parse_like_tritonserver():
    config = parse_trace_config(["triton,file=/tmp/t.json", "level=TIMESTAMPS", "rate=5", "count=10",
                                 "log-frequency=2", "mode=triton"])
    assert config == TraceConfig(level=("TIMESTAMPS",), rate=5, count=10, log_frequency=2, file="/tmp/t.json")
    with pytest.raises(ValueError, match="invalid value for trace mode option"):
        parse_trace_config(["zipkin,url=x"])
    with pytest.raises(ValueError, match="option format is '<trace mode>,<setting>=<value>'. Got level"):
        parse_trace_config(["level"])


def test_log_frequency_rotates_trace_files(tmp_path):
    tracer = Tracer(TraceConfig(level=("TIMESTAMPS",), rate=1, log_frequency=2, file=str(tmp_path / "t.json")))
    for _ in range(5):
        tracer.finish(tracer.start("m", "1", "", 1))
    tracer.close()
    assert [len(traces_of(tmp_path / f"t.json.{i}")) for i in range(3)] == [2, 2, 1]


def test_opentelemetry_mode_exports_spans():
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = Tracer(TraceConfig(level=("TIMESTAMPS",), rate=1, mode="opentelemetry"),
                    otel_tracer=provider.get_tracer("test"))
    trace = tracer.start("idt", "1", "req", 123)
    trace.stamp("QUEUE_START")
    tracer.finish(trace)
    (span,) = exporter.get_finished_spans()
    assert span.name == "InferRequest" and span.attributes["triton.model_name"] == "idt"
    assert [e.name for e in span.events] == ["REQUEST_START", "QUEUE_START", "INFER_RESPONSE_COMPLETE", "REQUEST_END"]


def _grpc_stub(server):
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    channel = grpc.insecure_channel(server.grpc_url)
    return channel, service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _grpc_refused(server, method: str, request):
    import grpc

    channel, stub = _grpc_stub(server)
    with channel, pytest.raises(grpc.RpcError) as info:
        getattr(stub, method)(request, timeout=30)
    return info.value.code(), info.value.details()


def test_grpc_trace_setting_with_several_values_refused(server):
    """Only trace_level takes a list: a second value was dropped silently (tritonserver 2.51 refuses it)."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    request = pb.TraceSettingRequest()
    request.settings["trace_rate"].value.extend(["1", "2"])
    assert _grpc_refused(server, "TraceSetting", request) == (
        grpc.StatusCode.INVALID_ARGUMENT, "expect only 1 value for 'trace_rate'")
    assert server.client("http").get_trace_settings()["trace_rate"] == "1000"


@pytest.mark.parametrize(("key", "kind", "value", "message"), [
    ("log_info", None, None, "expect boolean for 'log_info'"),  # no value at all was taken as "no change"
    ("log_verbose_level", "bool_param", True, "expect int32 for 'log_verbose_level'"),
    ("log_format", "bool_param", True, "expect string for 'log_format'"),  # was UNAVAILABLE
    ("log_format", "string_param", "xml", "invalid argument for log_format, got: xml"),  # was UNAVAILABLE
])
def test_grpc_log_settings_of_the_wrong_type(server, key, kind, value, message):
    """tritonserver 2.51's code and words over gRPC; nothing is applied."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    request = pb.LogSettingsRequest()
    request.settings["log_verbose_level"].uint32_param = 1
    if kind is None:
        request.settings[key].SetInParent()
    else:
        setattr(request.settings[key], kind, value)
    assert _grpc_refused(server, "LogSettings", request) == (grpc.StatusCode.INVALID_ARGUMENT, message)
    assert server.client("http").get_log_settings()["log_verbose_level"] == 0


def test_http_log_format_not_a_string_refused(server):
    response = httpx.post(f"http://{server.http_url}/v2/logging", json={"log_format": 1}, timeout=30)
    assert response.status_code == 400, response.text  # was 503 "invalid argument for --log_format, got: 1"
    assert response.json()["error"] == "expect string for 'log_format'"


@pytest.mark.parametrize("path", ["/v2/trace/setting", "/v2/models/idt/trace/setting"])
@pytest.mark.parametrize(("key", "value"), [("trace_rate", 5), ("trace_rate", True), ("trace_rate", 1.5),
                                            ("trace_count", 3), ("log_frequency", ["2"])])
def test_http_trace_setting_not_a_string_refused(server, path, key, value):
    """A number (or boolean, array) where tritonserver takes a string is refused and nothing changes. Triton 2.51
    answers 500 "attempt to access JSON non-string as string" (recorded live, global and model routes); Ferry's
    400 says which setting. Ferry took them, reading ``true`` and ``1.5`` as a rate of 1."""
    before = httpx.get(f"http://{server.http_url}{path}", timeout=30).json()
    response = httpx.post(f"http://{server.http_url}{path}", json={key: value}, timeout=30)
    assert (response.status_code, response.headers["content-type"], response.json()) == (
        400, "application/json", {"error": f"Unable to parse '{key}': expected a string, got {value!r}"})
    assert httpx.get(f"http://{server.http_url}{path}", timeout=30).json() == before


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cleared_global_trace_setting_returns_to_its_startup_value(server, protocol):
    """A null (HTTP) or empty (gRPC) global setting resets it, as tritonserver does; it was ignored."""
    client = server.client(protocol)
    assert _settings(client.update_trace_settings(settings={"trace_rate": "7"}), protocol)["trace_rate"] == "7"
    cleared = _settings(client.update_trace_settings(settings={"trace_rate": None}), protocol)
    assert cleared["trace_rate"] == "1000"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_trace_settings_of_a_model_not_loaded_are_refused(threaded_server, tmp_path, protocol):
    """A model the repository holds that is not loaded, or was unloaded, gets Triton 2.51's refusal of an unknown
    model (400 / INVALID_ARGUMENT 'Request for unknown model : <m>': it asks whether the model is ready; recorded
    live over gRPC); Ferry answered the settings of any model it had ever seen."""
    repo = tmp_path / "repo"
    write_model(repo, "idt", test_model_config("idt"))
    write_model(repo, "other", test_model_config("other"))
    server = threaded_server([repo], model_control_mode="explicit", load_models=("idt",))
    client = server.client(protocol)
    assert client.get_trace_settings(model_name="idt")  # a loaded model: its settings
    client.unload_model("idt")
    for model in ("other", "idt"):
        with pytest.raises(InferenceServerException) as info:
            client.get_trace_settings(model_name=model)
        assert (str(info.value.status()), info.value.message()) == (
            {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}[protocol], f"Request for unknown model : {model}")
