"""``--http-workers``: extra HTTP protocol processes share the one engine (one set of statistics, one model
control), every route works through them, their requests are traced with the HTTP_* timestamps as the server's own
are, and they go away with the server."""

from __future__ import annotations

import concurrent.futures
import signal
import subprocess
import sys
import time

import httpx
import pytest

from support.server import free_ports, test_model_config, wait_ready, write_model


def _spawn(repository, *flags: str) -> tuple[subprocess.Popen, int]:
    """``ferry-server --http-workers=3`` on free ports with model ``m``, once ready."""
    write_model(repository, "m", test_model_config("m"))
    http, grpc_port, metrics = free_ports(3)
    process = subprocess.Popen(
        [sys.executable, "-m", "serving_pod", f"--model-repository={repository}", f"--http-port={http}",
         f"--grpc-port={grpc_port}", f"--metrics-port={metrics}", "--http-address=127.0.0.1",
         "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1", "--http-workers=3", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    wait_ready(http, process)
    return process, http


@pytest.fixture
def server(tmp_path):
    process, http = _spawn(tmp_path, "--model-control-mode=explicit", "--load-model=m",
                           "--http-max-input-size=100000")
    yield process, http
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


def _workers_of(process: subprocess.Popen) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(process.pid), "-f", "serving_pod.http.workers"],
                         capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def test_requests_through_every_worker_reach_one_engine(server):
    process, http = server
    assert len(_workers_of(process)) == 2
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}

    def one(_: int) -> list:
        # a fresh connection each time, so the kernel spreads them over the accepting processes
        with httpx.Client() as client:
            response = client.post(f"http://127.0.0.1:{http}/v2/models/m/infer", json=body, timeout=30)
        assert response.status_code == 200, response.text
        return response.json()["outputs"][0]["data"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(200)))
    assert all(r == [1, 2, 3, 4] for r in results)
    stats = httpx.get(f"http://127.0.0.1:{http}/v2/models/m/stats", timeout=10).json()["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 200  # one engine counted every request
    # errors, other routes and model control work through the workers too
    bad = httpx.post(f"http://127.0.0.1:{http}/v2/models/absent/infer", json=body, timeout=10)
    assert bad.status_code == 404 and "Request for unknown model: 'absent' is not found" in bad.json()["error"]
    assert httpx.post(f"http://127.0.0.1:{http}/v2/models/m/infer", content=b"{" + b" " * 200000 + b"}",
                      timeout=10).status_code == 400
    assert httpx.post(f"http://127.0.0.1:{http}/v2/repository/models/m/unload", timeout=10).status_code == 200
    for _ in range(10):  # whichever process answers, the model is gone everywhere
        assert httpx.get(f"http://127.0.0.1:{http}/v2/models/m/ready", timeout=10).status_code == 400


def test_workers_exit_with_the_server(server):
    process, http = server
    workers = _workers_of(process)
    assert workers
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(subprocess.run(["kill", "-0", str(p)], capture_output=True).returncode == 0 for p in workers):
        time.sleep(0.1)
    assert not any(subprocess.run(["kill", "-0", str(p)], capture_output=True).returncode == 0 for p in workers)


def test_http_workers_flag_validation():
    result = subprocess.run([sys.executable, "-m", "serving_pod", "--http-workers=0"], capture_output=True, text=True, timeout=180)
    assert result.returncode == 2 and "value must be >= 1" in result.stderr


def test_wire_form_round_trips_requests_and_responses():
    import numpy as np

    from serving_pod.core.types import InferRequest, InferResponse, RequestedOutput, Tensor
    from serving_pod.http import workers

    request = InferRequest(
        "m", "2",
        [Tensor("INPUT0", "FP32", np.arange(6, dtype=np.float32).reshape(2, 3), {"binary_data_size": 24}),
         Tensor("TEXT", "BYTES", np.array([[b"a", b"\x00bc"]], dtype=np.object_))],
        [RequestedOutput("OUTPUT0", {"binary_data": True, "class_count": 2})], "req-1", {"priority": 3},
    )
    back = workers.request_from_wire(pickle_round(workers.request_to_wire(request)))
    assert (back.model_name, back.model_version, back.id, back.parameters) == ("m", "2", "req-1", {"priority": 3})
    assert back.inputs[0].data.dtype == np.float32 and back.inputs[0].data.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert back.inputs[0].parameters == {"binary_data_size": 24}
    assert back.inputs[1].data.tolist() == [[b"a", b"\x00bc"]] and back.inputs[1].datatype == "BYTES"
    assert [(o.name, o.parameters) for o in back.outputs] == [("OUTPUT0", {"binary_data": True, "class_count": 2})]
    assert workers.request_from_wire(pickle_round(workers.request_to_wire(
        InferRequest("m", "", [Tensor("X", "INT64", np.zeros((0, 4), np.int64))])))).outputs is None

    response = InferResponse("m", "2", [Tensor("OUT", "UINT8", np.array([1, 255], np.uint8))], "req-1",
                             {"sequence_end": True}, final=False)
    again = workers.response_from_wire(pickle_round(workers.response_to_wire(response)))
    assert again.outputs[0].data.dtype == np.uint8 and again.outputs[0].data.tolist() == [1, 255]
    assert (again.id, again.parameters, again.final) == ("req-1", {"sequence_end": True}, False)


def pickle_round(value):
    import pickle

    return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def test_restricted_api_holds_on_every_worker(tmp_path):
    process, http = _spawn(tmp_path, "--http-restricted-api=inference:infer-key=secret")
    try:
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
        url = f"http://127.0.0.1:{http}/v2/models/m/infer"
        for _ in range(30):  # fresh connections: the kernel spreads them over the three processes
            with httpx.Client() as client:
                refused = client.post(url, json=body, timeout=30)
            assert refused.status_code == 403
            assert refused.json()["error"] == "This API is restricted, expecting header 'infer-key'"
            with httpx.Client() as client:
                allowed = client.post(url, json=body, headers={"infer-key": "secret"}, timeout=30)
            assert allowed.status_code == 200 and allowed.json()["outputs"][0]["data"] == [1, 2, 3, 4]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


def test_http_limits_hold_on_every_worker(tmp_path):
    # before the workers ran the server's protocol, a worker took headers of any size
    process, http = _spawn(tmp_path, "--http-max-header-size=4096")
    try:
        for _ in range(30):  # fresh connections: the kernel spreads them over the three processes
            with httpx.Client() as client:
                response = client.get(f"http://127.0.0.1:{http}/v2/health/live", headers={"X-Big": "a" * 8000},
                                      timeout=30)
            assert response.status_code == 431
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


def test_header_forward_pattern_holds_on_every_worker(tmp_path):
    # a forwarded header named like a reserved parameter is refused: so each process must know the pattern
    process, http = _spawn(tmp_path, "--http-header-forward-pattern=^timeout$")
    try:
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
        for _ in range(30):  # fresh connections: the kernel spreads them over the three processes
            with httpx.Client() as client:
                response = client.post(f"http://127.0.0.1:{http}/v2/models/m/infer", json=body,
                                       headers={"timeout": "5"}, timeout=30)
            assert response.status_code == 400
            assert response.json()["error"] == "Header 'timeout' is reserved for Triton usage and cannot be forwarded."
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


HTTP_ORDER = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "HTTP_SEND_START", "HTTP_SEND_END"]


def _traces(path) -> dict[str, list[str]]:
    """request id -> its timestamps' names in time (the trace file's records, as in protocol/test_trace_triton.py)."""
    import json

    ids: dict[int, str] = {}
    stamps: dict[int, list[tuple[int, str]]] = {}
    for record in json.loads(path.read_text()):
        if "timestamps" in record:
            stamps.setdefault(record["id"], []).extend((t["ns"], t["name"]) for t in record["timestamps"])
        elif "model_name" in record:
            ids[record["id"]] = record.get("request_id", "")
    return {ids[key]: [name for _, name in sorted(stamps.get(key, []))] for key in ids}


def test_requests_through_workers_carry_the_http_timestamps(tmp_path):
    """Tracing turned on through the API: whichever process read a request, its trace has HTTP_RECV_* before and
    HTTP_SEND_* after the engine's timestamps, on the direct and the ASGI path; a refused request and the requests
    after tracing is turned off again are not traced."""
    trace_file = tmp_path / "trace.json"
    (tmp_path / "models").mkdir()
    process, http = _spawn(tmp_path / "models", f"--trace-config=triton,file={trace_file}",
                           "--trace-config=level=OFF", "--trace-config=rate=1")
    url = f"http://127.0.0.1:{http}/v2"
    try:
        assert len(_workers_of(process)) == 2

        def infer(request_id: str, query: str = "", name: str = "INPUT0") -> int:
            body = {"id": request_id, "inputs": [{"name": name, "shape": [1, 4], "datatype": "FP32",
                                                  "data": [1, 2, 3, 4]}]}
            with httpx.Client() as client:  # fresh connections: the kernel spreads them over the three processes
                return client.post(f"{url}/models/m/infer{query}", json=body, timeout=30).status_code

        with httpx.Client() as client:
            assert client.post(f"{url}/trace/setting", json={"trace_level": ["TIMESTAMPS"]},
                               timeout=30).status_code == 200
        assert [infer(f"d{i}") for i in range(16)] == [200] * 16
        assert [infer(f"a{i}", "?ferry=asgi") for i in range(8)] == [200] * 8
        assert infer("bad", name="NOPE") == 400
        with httpx.Client() as client:
            assert client.post(f"{url}/trace/setting", json={"trace_level": ["OFF"]}, timeout=30).status_code == 200
        assert [infer(f"off{i}") for i in range(6)] == [200] * 6
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    traces = _traces(trace_file)
    assert sorted(traces) == sorted([f"d{i}" for i in range(16)] + [f"a{i}" for i in range(8)])
    for request_id, names in traces.items():
        assert [name for name in names if name.startswith("HTTP_") or name == "REQUEST_START"] == HTTP_ORDER, \
            request_id
        assert names[-1] in ("HTTP_SEND_END", "REQUEST_END") and "REQUEST_END" in names, request_id


def test_bridge_writes_a_worker_traced_request_once_both_sides_are_done(tmp_path):
    """The server's side of a traced request from a worker, in one process: its trace is written when the engine
    and the worker's ``SENT`` are both in, with the worker's timestamps; a ``SENT`` before the engine took the
    request leaves the engine to trace it alone, and a lost connection writes what it held."""
    import json
    import shutil
    from types import SimpleNamespace

    import numpy as np

    from serving_pod.core.types import InferRequest, Tensor
    from serving_pod.http import workers
    from serving_pod.trace import Tracer
    from serving_pod.trace_config import parse_trace_config

    path = tmp_path / "trace.json"
    tracer = Tracer(parse_trace_config([f"triton,file={path}", "level=TIMESTAMPS", "rate=1"]))
    bridge = workers.Bridge(None, SimpleNamespace(tracer=tracer))
    shutil.rmtree(bridge.directory)  # never started: only the tracing flag's file
    connection = workers._BridgeConnection(bridge)
    wire = workers.request_to_wire(InferRequest("m", "1", [Tensor("INPUT0", "FP32", np.zeros((1, 4), np.float32))]))
    received = [("HTTP_RECV_START", 10), ("HTTP_RECV_END", 20)]

    def admitted(key: int, request_id: str) -> InferRequest:
        request = connection._traced_request(key, wire, received)
        request.trace = tracer.start("m", "1", request_id, 30, request.trace)  # as the engine does
        return request

    def written() -> dict[str, list[tuple[str, int]]]:
        records = json.loads(path.read_text()) if path.exists() else []
        ids = {r["id"]: r.get("request_id") for r in records if "model_name" in r}
        return {ids[i]: [(t["name"], t["ns"]) for r in records if r["id"] == i and "timestamps" in r
                         for t in r["timestamps"]] for i in ids}

    first = admitted(1, "r1")
    tracer.finish(first.trace)
    assert written() == {}  # the worker has not written the answer yet
    connection.frame_received((1, workers.SENT, [(40, 50)]))
    stamps = written()["r1"]
    assert stamps[:3] == [*received, ("REQUEST_START", 30)] and stamps[-2:] == [("HTTP_SEND_START", 40),
                                                                                 ("HTTP_SEND_END", 50)]
    early = connection._traced_request(2, wire, received)
    connection.frame_received((2, workers.SENT, []))
    assert early.trace is None and connection.traced == {}
    held = admitted(3, "r3")
    tracer.finish(held.trace)
    connection.connection_lost(None)
    assert [name for name, _ in written()["r3"]][:3] == ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START"]
    tracer.close()


HUGE = 2**40  # elements a 100-byte request may claim


def test_a_huge_claimed_shape_is_refused_through_the_workers_as_over_grpc(tmp_path):
    """A request whose shape claims 2**40 elements it does not carry (one string; or data in a region never
    registered) is refused through the workers as by the server itself and over gRPC: 400 / INVALID_ARGUMENT with
    Triton's count, 404 / NOT_FOUND for the region. A worker pickled the data placeholder of that shape to hand
    the request over: MemoryError, answered 500 "Internal Server Error" (2**30 strings: gigabytes per request)."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc

    write_model(tmp_path, "text", test_model_config("text", "TYPE_STRING", "[ -1 ]", max_batch_size=0))
    process, http = _spawn(tmp_path, "--model-control-mode=explicit", "--load-model=text", "--allow-client-shm=true")
    grpc_port = int(next(arg for arg in process.args if arg.startswith("--grpc-port=")).split("=")[1])
    region = {"shared_memory_region": "nope", "shared_memory_byte_size": 64}
    cases = {  # (the input's JSON, the same as gRPC parameters) -> (HTTP status, gRPC code, message)
        "one string": (({"data": ["a"]}, {}), (400, "INVALID_ARGUMENT", (
            f"[request id: <id_unknown>] expected {HUGE} string elements for inference input 'INPUT0' for model "
            "'text', got 1"))),
        "a region never registered": (({"parameters": region}, region),
                                      (404, "NOT_FOUND", "Unable to find shared memory region: 'nope'")),
    }
    try:
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            for (fields, parameters), (status, code, message) in cases.values():
                body = {"inputs": [{"name": "INPUT0", "shape": [HUGE], "datatype": "BYTES", **fields}]}
                for _ in range(6):  # fresh connections: the kernel spreads them over the accepting processes
                    response = httpx.post(f"http://127.0.0.1:{http}/v2/models/text/infer", json=body, timeout=30)
                    assert response.status_code == status, response.text
                    assert response.json() == {"error": message}
                request = pb.ModelInferRequest(model_name="text")
                tensor = request.inputs.add(name="INPUT0", datatype="BYTES", shape=[HUGE])
                for key, value in parameters.items():
                    setattr(tensor.parameters[key], "string_param" if isinstance(value, str) else "int64_param", value)
                if not parameters:
                    tensor.contents.bytes_contents.append(b"a")
                with pytest.raises(grpc.RpcError) as info:
                    stub.ModelInfer(request, timeout=30)
                assert (info.value.code().name, info.value.details()) == (code, message)
        body = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]}
        response = httpx.post(f"http://127.0.0.1:{http}/v2/models/text/infer", json=body, timeout=30)
        assert response.json()["outputs"][0]["data"] == ["a", "b"]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
