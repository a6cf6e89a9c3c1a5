"""A request ``timeout`` while its sequence waits in the sequence batcher's backlog, beside NVIDIA Triton 2.51.

One python model (``seq_depth`` of tests/serving_pod/data/sequence with one slot: ``max_batch_size: 1``, one
instance, executions of ``DELAY_MS``) holds sequence A in its slot while B, C and D wait in the backlog. Triton
2.51 reads each request's ``timeout`` parameter (microseconds) while its sequence is backlogged: the earliest
deadline of the requests that reached the backlog bounds the wait; past it, every request of that sequence fails
UNAVAILABLE "timeout of the corresponding sequence has been expired" (over HTTP 503 ``text/plain``, sent from the
response callback), each counted a failure of reason ``REJECTED``, and the id is forgotten (a later request
without START is refused). A request of a sequence that holds a slot ignores its ``timeout``. Ferry ignored the
parameter in the sequence batcher: B and D waited and ran.

The case runs over HTTP (plain ``httpx``, to read the content type) and gRPC (tritonclient); Triton's outcomes,
statistics and metric deltas are recorded in ``EXPECTED`` (Ferry runs against them by default, a live Triton in
the slow test). Steps fall hundreds of milliseconds from any execution edge or deadline, so only outcomes are
compared.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

DATA = Path(__file__).resolve().parents[1] / "data" / "sequence" / "seq_depth"
MODEL = "seq_backlog_timeout"
DELAY_MS = 400
PROTOCOLS = ("http", "grpc")
EXPIRED = "timeout of the corresponding sequence has been expired"

#: (seconds from the start, sequence letter, INPUT, parameters); A holds the one slot until its END is taken at 0.5
STEPS: list[tuple[float, str, int, dict[str, Any]]] = [
    (0.0, "A", 1, {"sequence_start": True}),
    (0.1, "B", 2, {"sequence_start": True, "timeout": 100_000}),    # backlogged, expires at 0.2
    (0.15, "C", 3, {"sequence_start": True}),                       # backlogged, no deadline: takes A's slot
    (0.15, "D", 4, {"sequence_start": True}),                       # backlogged, no deadline yet
    (0.25, "D", 5, {"timeout": 50_000}),                            # D's backlog expires at 0.3: both requests fail
    (0.5, "A", 6, {"sequence_end": True}),
    (0.6, "C", 7, {"sequence_end": True, "timeout": 1}),            # C holds the slot now: the timeout is ignored
    (1.2, "B", 8, {"sequence_end": True}),                          # B was forgotten
    (1.3, "D", 9, {"sequence_start": True, "sequence_end": True}),  # a new sequence D
]
IDS = {"A": 11, "B": 12, "C": 13, "D": 14}


def _ok(sequence: str, value: int, start: int, end: int, protocol: str) -> tuple:
    return ("ok", [1, _id(sequence, protocol), value, start, end])


def _id(sequence: str, protocol: str) -> int:
    return IDS[sequence] + (0 if protocol == "http" else 100)


def _expected(protocol: str) -> dict[str, Any]:
    expired = (503, "text/plain", EXPIRED) if protocol == "http" else ("StatusCode.UNAVAILABLE", EXPIRED)
    no_start = (f"inference request for sequence {_id('B', protocol)} to model '{MODEL}' must specify the START "
                "flag on the first request of the sequence")
    return {
        "results": [
            _ok("A", 1, 1, 0, protocol), expired, _ok("C", 3, 1, 0, protocol), expired, expired,
            _ok("A", 6, 0, 1, protocol), _ok("C", 7, 0, 1, protocol),
            (400, "application/json", no_start) if protocol == "http" else ("StatusCode.INVALID_ARGUMENT", no_start),
            _ok("D", 9, 1, 1, protocol),
        ],
        "statistics": {"success": 5, "fail": 3, "queue": 5, "execution_count": 5, "inference_count": 5},
        "metrics": {"nv_inference_request_success": 5, "nv_inference_request_failure:REJECTED": 3,
                    "nv_inference_request_failure:BACKEND": 0, "nv_inference_request_failure:CANCELED": 0,
                    "nv_inference_request_failure:OTHER": 0, "nv_inference_exec_count": 5, "nv_inference_count": 5,
                    "nv_inference_pending_request_count": 0},
    }


#: Triton 2.51's answers (recorded live; ``test_nvidia_tritons_backlog_timeouts_as_recorded`` compares a live one)
EXPECTED = {protocol: _expected(protocol) for protocol in PROTOCOLS}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("sequence_backlog_timeout")
    shutil.copytree(DATA, repo / MODEL, ignore=shutil.ignore_patterns("__pycache__"))
    config = (DATA / "config.pbtxt").read_text().replace('name: "seq_depth"', f'name: "{MODEL}"')
    config = config.replace("max_batch_size: 4", "max_batch_size: 1").replace('"600"', f'"{DELAY_MS}"')
    (repo / MODEL / "config.pbtxt").write_text(config)
    return repo


def _send(ports: tuple[int, int, int], protocol: str, sequence: str, value: int, parameters: dict[str, Any]) -> tuple:
    parameters = {"sequence_id": _id(sequence, protocol), **parameters}
    if protocol == "http":
        body = {"inputs": [{"name": "INPUT", "datatype": "INT32", "shape": [1, 1], "data": [value]}],
                "parameters": parameters}
        answer = httpx.post(f"http://127.0.0.1:{ports[0]}/v2/models/{MODEL}/infer", json=body, timeout=60)
        if answer.status_code != 200:
            return (answer.status_code, answer.headers["content-type"], answer.json()["error"])
        report = json.loads(answer.json()["outputs"][0]["data"][0])
        return ("ok", report["batch"][report["position"]])
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports[1]}")
    tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.full([1, 1], value, np.int32))
    try:
        result = client.infer(MODEL, [tensor], **parameters)
    except InferenceServerException as error:
        return (str(error.status()), error.message())
    finally:
        client.close()
    report = json.loads(result.as_numpy("OUT").reshape(-1)[0])
    return ("ok", report["batch"][report["position"]])


def _counts(ports: tuple[int, int, int]) -> tuple[dict[str, int], dict[str, int]]:
    stats = httpx.get(f"http://127.0.0.1:{ports[0]}/v2/models/{MODEL}/stats", timeout=10).json()["model_stats"][0]
    statistics = {key: stats["inference_stats"][key]["count"] for key in ("success", "fail", "queue")}
    statistics.update(execution_count=stats["execution_count"], inference_count=stats["inference_count"])
    metrics = {}
    for line in httpx.get(f"http://127.0.0.1:{ports[2]}/metrics", timeout=10).text.splitlines():
        name = line.split("{")[0]
        if f'model="{MODEL}"' in line and not line.startswith("#") and not name.endswith(("_us", "_secs")):
            reason = re.search(r'reason="([^"]*)"', line)
            metrics[name + (f":{reason.group(1)}" if reason else "")] = int(float(line.rsplit(" ", 1)[1]))
    return statistics, metrics


def _case(ports: tuple[int, int, int], protocol: str) -> dict[str, Any]:
    before = _counts(ports)
    results: list[Any] = [None] * len(STEPS)
    t0 = time.monotonic()

    def one(index: int, offset_s: float, sequence: str, value: int, parameters: dict[str, Any]) -> None:
        time.sleep(max(0.0, t0 + offset_s - time.monotonic()))
        results[index] = _send(ports, protocol, sequence, value, parameters)

    threads = [threading.Thread(target=one, args=(index, *step)) for index, step in enumerate(STEPS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    after = _counts(ports)
    return {"results": results,
            "statistics": {key: after[0][key] - before[0][key] for key in after[0]},
            "metrics": {key: after[1][key] - before[1].get(key, 0) for key in after[1]}}


@pytest.fixture(scope="module")
def ferry(repository: Path) -> Iterator[tuple[int, int, int]]:
    from support.server import ServerThread, make_options

    thread = ServerThread(make_options([repository], model_control_mode="explicit", load_models=(MODEL,)))
    handle = thread.start()
    try:
        yield handle.server.http_port, handle.server.grpc_port, handle.server.metrics_port
    finally:
        thread.stop()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_backlog_timeouts_as_triton_answers_them(ferry: tuple[int, int, int], protocol: str) -> None:
    assert _case(ferry, protocol) == EXPECTED[protocol]


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same recorded answers
def test_nvidia_tritons_backlog_timeouts_as_recorded(repository: Path) -> None:
    from support.triton import running_triton

    with running_triton(repository, [MODEL]) as ports:
        outcomes = {protocol: _case(ports, protocol) for protocol in PROTOCOLS}
    assert outcomes == EXPECTED
