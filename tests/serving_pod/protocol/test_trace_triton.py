"""Trace extension next to NVIDIA Triton 2.51: the trace file's records and the trace settings API.

The same requests and settings go to Triton (CPU, python backend; ``support.triton``) and to Ferry serving the
same python models. Trace files are compared by structure, never by time: per trace its identity record, the
names of its timestamps (as a multiset: Triton writes them in its threads' order), its tensor records and which
trace is whose parent. Triton writes its file on a graceful exit only, so it is stopped with SIGINT here.

The front ends' timestamps (HTTP_RECV_*/HTTP_SEND_* on the direct and the ASGI path, GRPC_WAITREAD_*/GRPC_SEND_*
on ModelInfer and ModelStreamInfer, one GRPC_SEND pair per streamed response, over both gRPC front ends) are
compared by their order in time around REQUEST_START (``frontend``): where each of them falls against the
engine's other timestamps follows Triton's threads (its COMPUTE_END and REQUEST_END often come after the send).

Differences kept on purpose (see ``serving_pod.trace``): a count that reaches 0 leaves Ferry's traces in
``<file>`` where Triton moves them to ``<file>.0`` (every file is read); the count error over gRPC lacks the
space tritonserver puts after "got:".
"""

from __future__ import annotations

import collections
import contextlib
import json
import queue
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from support.python_models import ADD_SUB_CONFIG, ADD_SUB_ENSEMBLE, ADD_SUB_MODEL, COUNT_CONFIG, COUNT_MODEL
from support.server import (
    ServerThread,
    free_ports,
    kill_process_group,
    make_options,
    wait_ready,
    write_model,
)
from support.triton import triton_args, triton_or_skip, triton_repositories

from serving_pod.core.errors import InvalidArgumentError
from serving_pod.trace import Tracer
from serving_pod.trace_config import TraceConfig, parse_trace_config

ADD_SUB = (ADD_SUB_CONFIG, ADD_SUB_MODEL)

#: echoes FP32, BYTES and BOOL inputs: how each datatype's data is written
ECHO = ('''
name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "F" data_type: TYPE_FP32 dims: [ 5 ] }, { name: "S" data_type: TYPE_STRING dims: [ 2 ] },
        { name: "B" data_type: TYPE_BOOL dims: [ 2 ] } ]
output [ { name: "F_OUT" data_type: TYPE_FP32 dims: [ 5 ] } ]
''', '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("F_OUT", pb_utils.get_input_tensor_by_name(r, "F").as_numpy())])
                for r in requests]
''')

ENSEMBLE = ADD_SUB_ENSEMBLE

COUNTER = (COUNT_CONFIG, COUNT_MODEL)

MODELS = ["add_sub", "echo", "ens", "counter"]
#: timestamps the front ends write (module docstring)
FRONTEND = ("HTTP_", "GRPC_")


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("trace_repo")
    for name, (config, model) in (("add_sub", ADD_SUB), ("echo", ECHO), ("counter", COUNTER)):
        write_model(repo, name, config, {"1/model.py": model})
    write_model(repo, "ens", ENSEMBLE)
    return repo


@contextlib.contextmanager
def triton(repository: Path, *flags: str) -> Iterator[tuple[int, int]]:
    """Triton on ``repository`` with ``flags``; stopped with SIGINT so that it writes its trace file."""
    located = triton_or_skip()
    http, grpc, metrics = free_ports(3)
    args = triton_args(triton_repositories([repository]), MODELS, http_port=http, grpc_port=grpc,
                       metrics_port=metrics)
    proc = subprocess.Popen(located.command(*args, *flags, "--exit-timeout-secs=20"), env=located.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_ready(http, proc, timeout=90)
        yield http, grpc
    finally:
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        kill_process_group(proc)  # and any python backend stub left behind


@contextlib.contextmanager
def ferry(repository: Path, *flags: str, grpc_server: str = "native") -> Iterator[tuple[int, int]]:
    """Ferry with the same ``--trace-config`` flags; stopped (its trace file closed) on exit."""
    config = parse_trace_config([flag.removeprefix("--trace-config=") for flag in flags])
    thread = ServerThread(make_options([repository], trace=config, grpc_server=grpc_server))
    handle = thread.start()
    try:
        yield int(handle.http_url.rsplit(":", 1)[1]), int(handle.grpc_url.rsplit(":", 1)[1])
    finally:
        thread.stop()


def _add_sub_inputs(module: Any, names=("INPUT0", "INPUT1")) -> list[Any]:
    first = module.InferInput(names[0], [1, 4], "INT32")
    first.set_data_from_numpy(np.arange(4, dtype=np.int32).reshape(1, 4))
    second = module.InferInput(names[1], [1, 4], "INT32")
    second.set_data_from_numpy(np.ones((1, 4), dtype=np.int32))
    return [first, second]


def _echo_inputs() -> list[Any]:
    f = httpclient.InferInput("F", [5], "FP32")
    f.set_data_from_numpy(np.array([0.5, 1 / 3, 1e6, -2.25, 3], dtype=np.float32))
    s = httpclient.InferInput("S", [2], "BYTES")
    s.set_data_from_numpy(np.array([b"ab", b"c d"], dtype=np.object_))
    b = httpclient.InferInput("B", [2], "BOOL")
    b.set_data_from_numpy(np.array([True, False]))
    return [f, s, b]


def _workload(http: int, grpc: int) -> dict[str, Any]:
    """The same requests and setting updates for both servers; the settings answers seen on the way."""
    seen: dict[str, Any] = {}
    hc = httpclient.InferenceServerClient(f"localhost:{http}")
    gc = grpcclient.InferenceServerClient(f"localhost:{grpc}")
    try:
        seen["startup"] = _scrubbed(hc.get_trace_settings())
        hc.infer("add_sub", _add_sub_inputs(httpclient), request_id="h-add")
        gc.infer("add_sub", _add_sub_inputs(grpcclient), request_id="g-add")
        hc.infer("add_sub", _add_sub_inputs(httpclient))  # no request id: no "request_id" field
        hc.infer("ens", _add_sub_inputs(httpclient, ("A", "B")), request_id="h-ens")
        hc.infer("echo", _echo_inputs(), request_id="h-echo")
        n = grpcclient.InferInput("N", [1], "INT32")
        n.set_data_from_numpy(np.array([2], np.int32))
        responses: queue.Queue = queue.Queue()
        gc.start_stream(callback=lambda result, error: responses.put((result, error)))
        gc.async_stream_infer("counter", [n], request_id="g-dec")
        for _ in range(2):
            assert responses.get(timeout=60)[1] is None
        gc.async_stream_infer("add_sub", _add_sub_inputs(grpcclient), request_id="g-stream")
        assert responses.get(timeout=60)[1] is None
        gc.stop_stream()
        # a query string: Ferry's ASGI path (not the direct one), Triton's only one
        body = {"id": "h-asgi", "inputs": [{"name": name, "shape": [1, 4], "datatype": "INT32", "data": data}
                                           for name, data in (("INPUT0", [0, 1, 2, 3]), ("INPUT1", [1, 1, 1, 1]))]}
        answer = httpx.post(f"http://localhost:{http}/v2/models/add_sub/infer?ferry=asgi", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        # every 2nd request, counted from a new setting: r1 and r3
        hc.update_trace_settings(settings={"trace_rate": "2"})
        for i in range(4):
            hc.infer("add_sub", _add_sub_inputs(httpclient), request_id=f"r{i}")
        # the first two, then none
        hc.update_trace_settings(settings={"trace_rate": "1", "trace_count": "2"})
        for i in range(3):
            hc.infer("add_sub", _add_sub_inputs(httpclient), request_id=f"c{i}")
        seen["count_spent"] = hc.get_trace_settings()["trace_count"]
    finally:
        hc.close()
        gc.close()
    return seen


def traces_in(directory: Path) -> dict[tuple[str | None, str], dict[str, Any]]:
    """Every trace of ``directory``'s trace files, keyed by (request id, model), by structure only."""
    records = [r for path in sorted(directory.glob("trace.json*")) for r in json.loads(path.read_text())]
    by_id: dict[int, dict[str, Any]] = collections.defaultdict(lambda: {"names": [], "stamps": [], "tensors": []})
    for record in records:
        trace = by_id[record["id"]]
        if "timestamps" in record:
            trace["names"] += [t["name"] for t in record["timestamps"]]
            trace["stamps"] += [(t["ns"], t["name"]) for t in record["timestamps"]]
        elif "activity" in record:
            trace["tensors"].append((record["activity"], *record["tensor"].values()))
        else:
            assert "identity" not in trace, record
            trace["identity"] = record
    out = {}
    for trace in by_id.values():
        identity = dict(trace["identity"])
        parent = identity.pop("parent_id", None)
        identity.pop("id")
        if parent is not None:
            identity["parent"] = by_id[parent]["identity"]["model_name"]
        key = (identity.get("request_id"), identity["model_name"])
        assert key not in out, key
        in_time = [name for _, name in sorted(trace["stamps"], key=lambda stamp: stamp[0])]  # ties: file order
        out[key] = {"identity": identity, "names": collections.Counter(trace["names"]),
                    "frontend": [name for name in in_time if name.startswith(FRONTEND) or name == "REQUEST_START"],
                    "tensors": sorted(trace["tensors"])}
    return out


FLAGS = ("--trace-config=level=max", "--trace-config=level=TENSORS", "--trace-config=rate=1")


def _ferry_run(repository: Path, tmp_path: Path, grpc_server: str = "native") -> tuple[dict, dict]:
    (tmp_path / grpc_server).mkdir()
    with ferry(repository, f"--trace-config=triton,file={tmp_path / grpc_server / 'trace.json'}", *FLAGS,
               grpc_server=grpc_server) as ports:
        seen = _workload(*ports)
    return seen, traces_in(tmp_path / grpc_server)


ENGINE_NAMES = collections.Counter([
    "REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END",
    "INFER_RESPONSE_COMPLETE", "REQUEST_END"])
HTTP_NAMES = collections.Counter(["HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END"])
GRPC_NAMES = collections.Counter(["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END"])
EXPECTED_ADD_SUB_NAMES = ENGINE_NAMES + HTTP_NAMES
#: the front end's timestamps in time, around REQUEST_START (tritonserver 2.51's file)
HTTP_ORDER = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC_ORDER = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "REQUEST_START", "GRPC_SEND_START", "GRPC_SEND_END"]


@pytest.mark.parametrize("grpc_server", ["native", "grpcio"])
def test_trace_file_records(repository, tmp_path, grpc_server):
    """Ferry alone (always runs): Triton's record structure, as read from tritonserver 2.51."""
    seen, traces = _ferry_run(repository, tmp_path, grpc_server)
    assert seen["startup"]["trace_level"] == ["TIMESTAMPS", "TENSORS"]  # level=max ORed with TENSORS
    assert seen["count_spent"] == "0"
    assert set(traces) == {("h-add", "add_sub"), ("g-add", "add_sub"), (None, "add_sub"), ("h-ens", "ens"),
                           ("h-ens", "add_sub"), ("h-echo", "echo"), ("g-dec", "counter"), ("g-stream", "add_sub"),
                           ("h-asgi", "add_sub"), ("r1", "add_sub"), ("r3", "add_sub"), ("c0", "add_sub"),
                           ("c1", "add_sub")}
    assert traces[(None, "add_sub")]["identity"] == {"model_name": "add_sub", "model_version": 1}
    add = traces[("h-add", "add_sub")]
    assert add["names"] == EXPECTED_ADD_SUB_NAMES
    for key in (("h-add", "add_sub"), ("h-asgi", "add_sub"), ("h-ens", "ens"), ("c1", "add_sub")):
        assert traces[key]["frontend"] == HTTP_ORDER, key
    for key in (("g-add", "add_sub"), ("g-stream", "add_sub")):
        assert traces[key]["names"] == ENGINE_NAMES + GRPC_NAMES, key
        assert traces[key]["frontend"] == GRPC_ORDER, key
    # one GRPC_SEND pair per streamed response
    assert traces[("g-dec", "counter")]["frontend"] == GRPC_ORDER + ["GRPC_SEND_START", "GRPC_SEND_END"]
    assert traces[("h-ens", "add_sub")]["frontend"] == ["REQUEST_START"]  # a composing model's: no front end
    assert add["tensors"] == [
        ("TENSOR_BACKEND_OUTPUT", "OUTPUT0", "1,2,3,4", "1,4", "INT32"),
        ("TENSOR_BACKEND_OUTPUT", "OUTPUT1", "-1,0,1,2", "1,4", "INT32"),
        ("TENSOR_QUEUE_INPUT", "INPUT0", "0,1,2,3", "1,4", "INT32"),
        ("TENSOR_QUEUE_INPUT", "INPUT1", "1,1,1,1", "1,4", "INT32")]
    step = traces[("h-ens", "add_sub")]
    assert step["identity"] == {"model_name": "add_sub", "model_version": 1, "request_id": "h-ens", "parent": "ens"}
    assert step["names"] == ENGINE_NAMES - collections.Counter(["INFER_RESPONSE_COMPLETE"])
    assert "COMPUTE_START" not in traces[("h-ens", "ens")]["names"]
    echo = {t[1]: t[2] for t in traces[("h-echo", "echo")]["tensors"]}
    assert echo == {"F": "0.5,0.333333,1e+06,-2.25,3", "S": '"ab","c d"', "B": "1,0", "F_OUT": "0.5,0.333333,1e+06,-2.25,3"}
    outputs = [t for t in traces[("g-dec", "counter")]["tensors"] if t[0] == "TENSOR_BACKEND_OUTPUT"]
    assert outputs == [("TENSOR_BACKEND_OUTPUT", "I", "0", "1", "INT32"), ("TENSOR_BACKEND_OUTPUT", "I", "1", "1", "INT32")]


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_trace_file_records_match_triton(repository, tmp_path):
    """Both of Ferry's gRPC front ends against Triton's one."""
    triton_or_skip()
    (tmp_path / "triton").mkdir()
    with triton(repository, f"--trace-config=triton,file={tmp_path / 'triton' / 'trace.json'}", *FLAGS) as ports:
        triton_seen = _workload(*ports)
    expected = traces_in(tmp_path / "triton")
    for grpc_server in ("native", "grpcio"):
        seen, traces = _ferry_run(repository, tmp_path, grpc_server)
        assert seen == triton_seen
        assert traces.keys() == expected.keys()
        for key, trace in expected.items():
            assert traces[key] == trace, (grpc_server, key)


def _scrubbed(settings: Any) -> Any:
    """Settings with the trace file's path (each server has its own) as "<file>"."""
    if isinstance(settings, dict) and "trace_file" in settings:
        return {**settings, "trace_file": ["<file>"] if isinstance(settings["trace_file"], list) else "<file>"}
    return settings


def _http(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    response = httpx.request(method, f"http://localhost:{port}{path}", json=body, timeout=30)
    return response.status_code, _scrubbed(response.json())


def _grpc(port: int, model: str, changes: dict[str, Any] | None) -> tuple[str, Any]:
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc

    request = pb.TraceSettingRequest(model_name=model)
    for key, value in (changes or {}).items():
        request.settings[key].value.extend([] if value is None else value if isinstance(value, list) else [value])
    with grpc.insecure_channel(f"localhost:{port}") as channel:
        try:
            response = service_pb2_grpc.GRPCInferenceServiceStub(channel).TraceSetting(request, timeout=30)
        except grpc.RpcError as error:
            return error.code().name, error.details().replace(">= -1, got: ", ">= -1, got:")  # module docstring
    return "OK", _scrubbed({k: list(v.value) for k, v in response.settings.items()})


#: (model, changes) applied in turn; None: a GET (HTTP) or an empty request (gRPC)
SETTINGS = [
    ("", None),
    ("nope", None),
    ("", {"trace_rate": "0"}),  # allowed while tracing is off
    ("", {"trace_level": ["TIMESTAMPS"]}),  # refused: sample rate must be non-zero
    ("", {"trace_rate": "3"}),
    ("add_sub", {"trace_level": ["TIMESTAMPS"]}),
    ("", {"trace_rate": "5"}),
    ("add_sub", None),  # its rate follows the global one
    ("add_sub", {"trace_rate": "0"}),  # refused
    ("add_sub", {"trace_level": None}),  # no field of its own left: the global setting
    ("", {"trace_level": ["TIMESTAMPS"]}),
    ("add_sub", None),
    ("add_sub", {"trace_count": "3"}),
    ("", {"trace_level": ["OFF"], "trace_rate": "0"}),
    ("add_sub", None),  # OFF and 0 from the global setting, its own count
    ("", {"log_frequency": "4294967296"}),
    ("", {"trace_rate": "99999999999"}),
    ("", {"trace_count": "2147483648"}),
    ("", {"trace_count": "-2"}),
    ("", {"trace_file": None}),  # even null: the file is fixed
    ("add_sub", {"trace_level": None, "trace_count": None}),
    ("", {"trace_level": None, "trace_rate": None}),
    ("", {"trace_level": ["TIMESTAMPS"], "trace_count": "0"}),  # refused: a count of 0 samples nothing
    ("", {"trace_count": "0"}),  # allowed while tracing is off
    ("", {"trace_level": ["TIMESTAMPS"]}),  # refused: the count kept is 0 (as after perf_analyzer --trace-count)
    ("", {"trace_count": None}),
    ("", {"trace_level": ["TENSORS", "TIMESTAMPS"]}),  # answered in tritonserver's order, whatever the request's
    ("add_sub", {"trace_level": ["TENSORS", "TIMESTAMPS"], "trace_rate": "2"}),
    ("add_sub", {"trace_level": None, "trace_rate": None}),  # back to the state the gRPC pass starts from
    ("", {"trace_level": None}),
]


def _settings_answers(http: int, grpc: int) -> list[Any]:
    answers = []
    for protocol in ("http", "grpc"):
        for model, changes in SETTINGS:
            if protocol == "http":
                path = f"/v2/models/{model}/trace/setting" if model else "/v2/trace/setting"
                answers.append(_http(http, "GET" if changes is None else "POST", path, changes))
            else:
                answers.append(_grpc(grpc, model, changes))
    return answers


@pytest.fixture(scope="module")
def ferry_settings_answers(repository, tmp_path_factory) -> list[Any]:
    trace_file = tmp_path_factory.mktemp("ferry_settings") / "trace.json"
    with ferry(repository, f"--trace-config=triton,file={trace_file}") as ports:
        return _settings_answers(*ports)


def test_trace_settings_answers(ferry_settings_answers, tmp_path_factory):
    """Ferry alone: the answers tritonserver 2.51 gave to the same sequence."""
    answers = iter(ferry_settings_answers)
    for protocol in ("http", "grpc"):
        by_case = dict(zip(range(len(SETTINGS)), answers))
        refused = {i: a for i, a in by_case.items() if a[0] not in (200, "OK")}
        codes = {"http": (400, 501), "grpc": ("INVALID_ARGUMENT", "UNIMPLEMENTED")}[protocol]
        message = (lambda a: a[1]["error"]) if protocol == "http" else (lambda a: a[1])
        assert {i: message(a) for i, a in refused.items()} == {
            1: "Request for unknown model : nope",
            3: "Attempting to set invalid trace setting :sample rate must be non-zero",
            8: "Attempting to set invalid trace setting :sample rate must be non-zero",
            15: "Unable to parse 'log_frequency', value is out of range [ 0, 4294967295 ], got: 4294967296",
            16: "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 99999999999",
            17: "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: 2147483648",
            18: "Unable to parse 'trace_count'. Expecting value >= -1, got:-2",
            19: "trace file location can not be updated through network protocol",
            22: "Attempting to set invalid trace setting :",
            24: "Attempting to set invalid trace setting :",
        }, protocol
        assert refused[19][0] == codes[1] and refused[3][0] == codes[0]
        ok = {i: a[1] for i, a in by_case.items() if i not in refused}
        level, rate, count = (lambda s: s["trace_level"]), (lambda s: _one(s["trace_rate"])), \
            (lambda s: _one(s["trace_count"]))
        assert (level(ok[7]), rate(ok[7])) == (["TIMESTAMPS"], "5")
        assert (level(ok[9]), rate(ok[9])) == (["OFF"], "5")
        assert level(ok[11]) == ["TIMESTAMPS"]  # a model setting made again on the new global one
        assert (level(ok[14]), rate(ok[14]), count(ok[14])) == (["OFF"], "0", "3")
        assert (level(ok[21]), rate(ok[21])) == (["OFF"], "1000")
        assert (level(ok[23]), count(ok[23]), count(ok[25])) == (["OFF"], "0", "-1")
        assert level(ok[26]) == level(ok[27]) == ["TIMESTAMPS", "TENSORS"]


def _one(value: Any) -> str:
    return value[0] if isinstance(value, list) else value


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_trace_settings_answers_match_triton(ferry_settings_answers, repository, tmp_path):
    triton_or_skip()
    with triton(repository, f"--trace-config=triton,file={tmp_path / 'trace.json'}") as ports:
        expected = _settings_answers(*ports)
    assert ferry_settings_answers == expected


def test_a_setting_that_cannot_trace_is_refused_and_samples_nothing():
    """No trace file in triton mode: tracing cannot be enabled through the API (tritonserver's reason)."""
    tracer = Tracer(TraceConfig())
    with pytest.raises(InvalidArgumentError, match="Attempting to set invalid trace setting :trace file name is not given"):
        tracer.update("", {"trace_level": ["TIMESTAMPS"]})
    started = Tracer(TraceConfig(level=("TIMESTAMPS",), rate=1))  # accepted at startup, as tritonserver
    assert not started.enabled and started.start("m", "1", "", 1) is None


#: tritonserver 2.51's answer to GET /v2/trace/setting under ``--trace-config=mode=opentelemetry
#: --trace-config=level=TIMESTAMPS`` (gRPC: the same, each value in a list): its batch span processor settings too
TRITON_OPENTELEMETRY_SETTINGS = {
    "trace_level": ["TIMESTAMPS"], "trace_rate": "1000", "trace_count": "-1", "trace_mode": "opentelemetry",
    "bsp_max_export_batch_size": "512", "bsp_schedule_delay": "5000", "bsp_max_queue_size": "2048"}


def test_opentelemetry_settings_report_the_batch_span_processor(monkeypatch):
    """Ferry left out the ``bsp_*`` settings tritonserver reports in opentelemetry mode (defaults, OTEL_BSP_* or
    ``--trace-config opentelemetry,bsp_...``, read only in that mode and refused in tritonserver's words)."""
    for variable in ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_MAX_QUEUE_SIZE"):
        monkeypatch.delenv(variable, raising=False)
    flags = ["mode=opentelemetry", "level=TIMESTAMPS"]
    tracer = Tracer(parse_trace_config(flags), otel_tracer=object())
    assert tracer.settings("") == TRITON_OPENTELEMETRY_SETTINGS
    assert tracer.update("", {"trace_rate": "5"}) == {**TRITON_OPENTELEMETRY_SETTINGS, "trace_rate": "5"}
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4096")
    given = parse_trace_config([*flags, "opentelemetry,bsp_schedule_delay=100"]).as_dict()
    assert (given["bsp_schedule_delay"], given["bsp_max_queue_size"]) == ("100", "4096")
    with pytest.raises(ValueError, match='^Bad option: "--trace-config opentelemetry,bsp_max_export_batch_size". '
                                         'Invalid option value. Got many$'):
        parse_trace_config([*flags, "opentelemetry,bsp_max_export_batch_size=many"])
    assert "bsp_max_queue_size" not in parse_trace_config(["opentelemetry,bsp_max_queue_size=many"]).as_dict()


@pytest.mark.parametrize(("flags", "level"), [
    (["level=MIN"], ("TIMESTAMPS",)), (["level=max"], ("TIMESTAMPS",)), (["level=on"], ("TIMESTAMPS",)),
    (["level=TIMESTAMPS", "level=tensors"], ("TIMESTAMPS", "TENSORS")), (["level=false"], ("OFF",)),
])
def test_trace_config_levels_as_tritonserver_reads_them(flags, level):
    assert parse_trace_config(flags).level == level


def test_models_on_the_global_setting_share_its_sampling_counter():
    """tritonserver samples every N-th request of the setting, whatever its model: here the 2nd and 4th."""
    tracer = Tracer(TraceConfig(level=("TIMESTAMPS",), rate=2, file="unused"))
    sampled = [tracer.start(model, "1", "", 1) is not None for model in ("a", "b", "a", "b")]
    assert sampled == [False, True, False, True]
    tracer.update("a", {"trace_rate": "1"})  # a setting of its own, with its own counter
    assert tracer.start("a", "1", "", 1) is not None


def test_a_replaced_setting_saves_the_traces_it_holds(tmp_path):
    """With log_frequency, traces a setting collected go to <file>.<n> when an update replaces it (they were kept
    until exit)."""
    tracer = Tracer(TraceConfig(level=("TIMESTAMPS",), rate=1, log_frequency=3, file=str(tmp_path / "t.json")))
    tracer.finish(tracer.start("m", "1", "first", 1))
    tracer.update("", {"trace_rate": "2"})
    (record, *_) = json.loads((tmp_path / "t.json.0").read_text())
    assert record == {"id": 1, "model_name": "m", "model_version": 1, "request_id": "first"}
