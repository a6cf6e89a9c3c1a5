"""Requests whose client goes away, per scheduler, side by side with tritonserver 2.51: what runs and what counts.

One python model with one instance, served three ways: ``plain`` (default scheduler), ``dyn`` (dynamic batcher)
and ``seq`` (sequence batcher). A request whose first value is negative holds the instance until the test opens
a gate (a file) or sees its own ``request.is_cancelled()``; the model writes a line as each request starts and
ends (``end <value> <is_cancelled>``), so which requests ran, and what they saw, is read back without timing.
A case holds the instance with one request, then a second one waits behind it and its client goes away (a gRPC
deadline, a gRPC cancel, the stream closed, an HTTP connection closed), or the holding request's own client goes
away while it executes and a next request follows. Compared: the replies, the model's lines, what the case added
to the model's statistics (success, fail, queue counts, execution and inference counts) and to the metrics
``nv_inference_request_success``, ``nv_inference_request_failure`` (per reason), ``nv_inference_count`` and
``nv_inference_exec_count``. Ferry's half runs against the expected answers always; Triton's under ``-m slow``.

Seen in both: a request cancelled while it executes runs to its end, its model sees ``is_cancelled()`` true, it
counts a success, and the instance takes the next request at once. An HTTP client that closes its connection is
seen by neither server: its request runs and counts a success. Triton's sequence batcher drops a queued request
whose client went away (one failure, reason ``CANCELED``) and ends its sequence: the requests queued behind it
fail CANCELLED (each counted so), a later request of its id needs START. Differences fixed here: Ferry's default
scheduler dropped a waiting request whose client went away and counted it nowhere (neither success nor failure),
and so did its sequence batcher, which also went on with the sequence.

Kept different on purpose: Triton 2.51's default scheduler and dynamic batcher still run a waiting request whose
gRPC client went away (its model sees ``is_cancelled()`` true from the start) and count a success; Ferry drops it
unrun and counts one failure of reason ``CANCELED`` in every scheduler (the ensemble's too), so every accepted
request counts exactly once, as a success or a failure, and no instance is spent on work nobody will read while
other requests wait. Triton's error for a request cancelled with its sequence has no words (HTTP 400 ``{"error":
""}``, gRPC CANCELLED with an empty message); Ferry's, with the same codes, says why.

The servers are given a moment (``_GRACE_S``) to see a client go away before the gate opens: on localhost the
reset arrives in well under a millisecond.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from support.server import ServerThread, make_options, write_model

#: logs ``start <value>`` and ``end <value> <is_cancelled>``; a negative value holds the instance until the gate
#: file exists or the request is cancelled
MODEL_PY = '''
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.gate = parameters["gate"]["string_value"]
        self.log = parameters["log"]["string_value"]

    def _write(self, line):
        with open(self.log, "a") as log:
            log.write(line + "\\n")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            value = int(x.flat[0])
            self._write(f"start {value}")
            cancelled = request.is_cancelled()
            while value < 0 and not cancelled and not os.path.exists(self.gate):
                time.sleep(0.01)
                cancelled = request.is_cancelled()
            self._write(f"end {value} {cancelled}")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x.astype(np.int32))]))
        return responses
'''

SCHEDULING = {
    "plain": "",
    "dyn": "dynamic_batching { }",
    "seq": "sequence_batching { max_sequence_idle_microseconds: 60000000 }",
}
#: how long a request may take before the server is taken to be stuck (no timing is asserted)
_PATIENCE_S = 20.0
#: a waiting request's gRPC deadline / HTTP timeout
_GIVE_UP_S = 0.3
#: how long the servers are given to see a client go away (module docstring)
_GRACE_S = 0.3


def _config(name: str, work: Path) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "gate" value: {{ string_value: "{work}/gate_{name}" }} }}
parameters {{ key: "log" value: {{ string_value: "{work}/log_{name}" }} }}
{SCHEDULING[name]}
"""


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cancelled_work")


@pytest.fixture(scope="module")
def repository(tmp_path_factory, work: Path) -> Path:
    repository = tmp_path_factory.mktemp("cancelled_requests")
    for name in SCHEDULING:
        write_model(repository, name, _config(name, work), {"1/model.py": MODEL_PY})
    return repository


Ports = tuple[int, int, int]


@pytest.fixture(scope="module")
def ferry(repository: Path) -> Iterator[Ports]:
    thread = ServerThread(make_options([repository], model_control_mode="explicit", load_models=list(SCHEDULING)))
    server = thread.start().server
    try:
        yield server.http_port, server.grpc_port, server.metrics_port
    finally:
        thread.stop()


def _tensor(value: int) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return tensor


class _Case:
    """One model's view of a running server: requests, the model's lines, statistics and metrics."""

    def __init__(self, ports: Ports, work: Path, model: str, sequence_id: int) -> None:
        http_port, grpc_port, self.metrics_port = ports
        self.base = f"http://127.0.0.1:{http_port}"
        self.grpc_url = f"127.0.0.1:{grpc_port}"
        self.work, self.model, self.sequence_id = work, model, sequence_id
        self.stub = grpcclient.InferenceServerClient(self.grpc_url)
        self.gate.unlink(missing_ok=True)
        self.first_line = len(self.lines())
        self.calls: list[Any] = []  # a gRPC call whose handle is dropped is cancelled: kept until the case ends

    @property
    def gate(self) -> Path:
        return self.work / f"gate_{self.model}"

    def lines(self) -> list[str]:
        log = self.work / f"log_{self.model}"
        return log.read_text().splitlines() if log.exists() else []

    def new_lines(self) -> list[str]:
        return self.lines()[self.first_line:]

    def sequence(self, start: bool = False, end: bool = False) -> dict[str, Any]:
        if self.model != "seq":
            return {}
        return {"sequence_id": self.sequence_id, "sequence_start": start, "sequence_end": end}

    def wait_started(self, value: int) -> None:
        deadline = time.monotonic() + _PATIENCE_S
        while f"start {value}" not in self.new_lines():
            assert time.monotonic() < deadline, f"request {value} never started"
            time.sleep(0.01)

    def pending(self) -> int:
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics").text
        match = re.search(rf'nv_inference_pending_request_count{{model="{self.model}",version="1"}} (\S+)', text)
        return int(float(match.group(1))) if match else -1

    def wait_pending(self, count: int, done: Callable[[], bool] = lambda: False) -> None:
        """Until ``count`` requests wait (or ``done``: the request meant to wait gave up already)."""
        deadline = time.monotonic() + _PATIENCE_S
        while self.pending() < count and not done():
            assert time.monotonic() < deadline, f"never {count} pending"
            time.sleep(0.01)

    def hold(self, **options: Any) -> queue.Queue[Any]:
        """Send the holding request (-1) over gRPC; its answer (None, or the error's words) comes in the queue."""
        answers: queue.Queue = queue.Queue()
        self.calls.append(self.stub.async_infer(
            self.model, [_tensor(-1)],
            callback=lambda result, error: answers.put(None if error is None else str(error)),
            **self.sequence(start=True), **options))
        self.wait_started(-1)
        return answers

    def grpc(self, value: int, timeout: float = _PATIENCE_S, **flags: bool) -> str:
        try:
            self.stub.infer(self.model, [_tensor(value)], client_timeout=timeout, **self.sequence(**flags))
            return "ok"
        except Exception as error:  # noqa: BLE001 - the error is the answer compared
            return str(error)

    def grpc_async(self, value: int, **flags: bool) -> tuple[Any, queue.Queue[Any]]:
        answers: queue.Queue = queue.Queue()
        call = self.stub.async_infer(self.model, [_tensor(value)], **self.sequence(**flags),
                                     callback=lambda result, error: answers.put("ok" if error is None else str(error)))
        self.calls.append(call)
        return call, answers

    def http(self, value: int, timeout: float = _PATIENCE_S) -> object:
        body: dict[str, Any] = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1], "data": [value]}]}
        if self.model == "seq":
            body["parameters"] = {"sequence_id": self.sequence_id}
        try:
            with httpx.Client(timeout=timeout) as own:  # its own connection, which a timeout closes
                response = own.post(f"{self.base}/v2/models/{self.model}/infer", json=body)
        except httpx.TimeoutException:
            return "client closed"
        return response.status_code if response.status_code == 200 else (response.status_code, response.json())

    def end_sequence(self) -> str | None:
        return self.grpc(0, end=True) if self.model == "seq" else None

    def counts(self) -> dict[str, int]:
        entry = httpx.get(f"{self.base}/v2/models/{self.model}/stats").json()["model_stats"][0]
        stats = entry["inference_stats"]
        found = {"success": stats["success"]["count"], "fail": stats["fail"]["count"],
                 "queue": stats["queue"]["count"], "execution_count": entry["execution_count"],
                 "inference_count": entry["inference_count"]}
        text = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics").text
        series = r"^(nv_inference_(?:request_success|request_failure|count|exec_count))\{(.*)\} (\S+)$"
        for name, labels, value in re.findall(series, text, re.MULTILINE):
            if f'model="{self.model}"' in labels:
                reason = re.search(r'reason="(\w+)"', labels)
                found[name + (f"/{reason.group(1)}" if reason else "")] = int(float(value))
        return found

    def close(self) -> None:
        self.gate.touch()  # whatever still holds the instance ends
        self.stub.close()


def _waiting(how: str) -> Callable[[_Case], dict[str, Any]]:
    """The instance held, a second request (5) waits and its client goes away ``how``; then the gate opens."""

    def case(c: _Case) -> dict[str, Any]:
        held = c.hold()
        replies: dict[str, Any] = {}
        if how == "grpc deadline":
            replies["waiting"] = c.grpc(5, timeout=_GIVE_UP_S)
        elif how == "grpc cancel":
            call, answers = c.grpc_async(5)
            c.wait_pending(1)
            call.cancel()
            replies["waiting"] = answers.get(timeout=_PATIENCE_S)
        elif how == "stream closed":
            streamer = grpcclient.InferenceServerClient(c.grpc_url)
            streamer.start_stream(callback=lambda result, error: None)
            streamer.async_stream_infer(c.model, [_tensor(5)], **c.sequence())
            c.wait_pending(1)
            streamer.stop_stream(cancel_requests=True)
            streamer.close()
        else:  # http closed
            replies["waiting"] = c.http(5, timeout=_GIVE_UP_S)
        time.sleep(_GRACE_S)
        c.gate.touch()
        replies["holding"] = held.get(timeout=_PATIENCE_S)
        replies["end"] = c.end_sequence()  # None but for seq
        return replies

    return case


def _executing(how: str) -> Callable[[_Case], dict[str, Any]]:
    """The holding request's client goes away while it executes; a next request (7) follows at once and must be
    answered while the gate stays shut (so the holding execution ended when its model saw the cancel)."""

    def case(c: _Case) -> dict[str, Any]:
        replies: dict[str, Any] = {}
        if how == "grpc deadline":
            replies["executing"] = c.grpc(-1, timeout=_GIVE_UP_S, start=True)
        elif how == "grpc cancel":
            call, answers = c.grpc_async(-1, start=True)
            c.wait_started(-1)
            call.cancel()
            replies["executing"] = answers.get(timeout=_PATIENCE_S)
        else:  # http closed: seen by neither server, the gate must open for the next request
            replies["executing"] = c.http(-1, timeout=_GIVE_UP_S)
            c.gate.touch()
        replies["next"] = c.grpc(7)
        replies["end"] = c.end_sequence()  # None but for seq
        return replies

    return case


def _sequence_cancelled(c: _Case) -> dict[str, Any]:
    """seq: behind the holding request wait a gRPC request (5), an HTTP one (6) and the END (8); 5 is cancelled."""
    held = c.hold()
    cancelled, cancelled_answer = c.grpc_async(5)
    c.wait_pending(1)
    behind: dict[str, Any] = {}
    http = threading.Thread(target=lambda: behind.update(http=c.http(6)))
    http.start()
    c.wait_pending(2)
    _, end_answer = c.grpc_async(8, end=True)
    c.wait_pending(3)
    cancelled.cancel()
    replies: dict[str, Any] = {"cancelled": cancelled_answer.get(timeout=_PATIENCE_S)}
    time.sleep(_GRACE_S)
    c.gate.touch()
    replies["holding"] = held.get(timeout=_PATIENCE_S)
    http.join(_PATIENCE_S)
    replies["behind http"] = behind.get("http")
    replies["behind grpc end"] = end_answer.get(timeout=_PATIENCE_S)
    replies["later without start"] = c.grpc(9)
    return replies


CASES: dict[str, tuple[str, Callable[[_Case], dict[str, Any]]]] = {
    "plain waiting, grpc deadline": ("plain", _waiting("grpc deadline")),
    "plain waiting, grpc cancel": ("plain", _waiting("grpc cancel")),
    "plain waiting, stream closed": ("plain", _waiting("stream closed")),
    "plain waiting, http closed": ("plain", _waiting("http closed")),
    "plain executing, grpc deadline": ("plain", _executing("grpc deadline")),
    "plain executing, grpc cancel": ("plain", _executing("grpc cancel")),
    "plain executing, http closed": ("plain", _executing("http closed")),
    "dyn waiting, grpc deadline": ("dyn", _waiting("grpc deadline")),
    "dyn waiting, stream closed": ("dyn", _waiting("stream closed")),
    "dyn executing, grpc cancel": ("dyn", _executing("grpc cancel")),
    "seq waiting, grpc cancel": ("seq", _waiting("grpc cancel")),
    "seq waiting, http closed": ("seq", _waiting("http closed")),
    "seq executing, grpc deadline": ("seq", _executing("grpc deadline")),
    "seq cancelled ends its sequence": ("seq", _sequence_cancelled),
}


def _added(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: value - before.get(key, 0) for key, value in after.items() if value != before.get(key, 0)}


def _outcomes(ports: Ports, work: Path, expected: dict[str, Any]) -> dict[str, Any]:
    got = {}
    for number, (name, (model, run)) in enumerate(CASES.items()):
        c = _Case(ports, work, model, sequence_id=100 + number)
        try:
            before = c.counts()
            replies = run(c)
            want = expected.get(name, {})
            deadline = time.monotonic() + _PATIENCE_S  # what still runs counts when it ends
            while (c.new_lines(), _added(before, c.counts())) != (want.get("ran"), want.get("counted")):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            time.sleep(0.1)  # and nothing more comes later
            got[name] = {"replies": replies, "ran": c.new_lines(), "counted": _added(before, c.counts())}
        finally:
            c.close()
    return got


def _success(count: int) -> dict[str, int]:
    return {"success": count, "queue": count, "execution_count": count, "inference_count": count,
            "nv_inference_request_success": count, "nv_inference_count": count, "nv_inference_exec_count": count}


def _cancelled(count: int, succeeded: int) -> dict[str, int]:
    return _success(succeeded) | {"fail": count, "nv_inference_request_failure/CANCELED": count}


DEADLINE = "[StatusCode.DEADLINE_EXCEEDED] Deadline Exceeded"
CANCELLED = "[StatusCode.CANCELLED] Locally cancelled by application!"
HELD = ["start -1", "end -1 False"]
NO_START = ("[StatusCode.INVALID_ARGUMENT] inference request for sequence {} to model 'seq' must specify the START "
            "flag on the first request of the sequence")
CANCELLED_WITH_SEQUENCE = ("sequence 113 of model 'seq' was cancelled: an earlier request of it was cancelled by its "
                           "client before it ran")

#: Ferry's outcomes (Triton's are the same but for ``TRITON_DIFFERENT``)
EXPECTED: dict[str, Any] = {
    "plain waiting, grpc deadline": {"replies": {"waiting": DEADLINE, "holding": None, "end": None}, "ran": HELD,
                                     "counted": _cancelled(1, 1)},
    "plain waiting, grpc cancel": {"replies": {"waiting": CANCELLED, "holding": None, "end": None}, "ran": HELD,
                                   "counted": _cancelled(1, 1)},
    "plain waiting, stream closed": {"replies": {"holding": None, "end": None}, "ran": HELD,
                                     "counted": _cancelled(1, 1)},
    "plain waiting, http closed": {"replies": {"waiting": "client closed", "holding": None, "end": None},
                                   "ran": HELD + ["start 5", "end 5 False"], "counted": _success(2)},
    "plain executing, grpc deadline": {"replies": {"executing": DEADLINE, "next": "ok", "end": None},
                                       "ran": ["start -1", "end -1 True", "start 7", "end 7 False"],
                                       "counted": _success(2)},
    "plain executing, grpc cancel": {"replies": {"executing": CANCELLED, "next": "ok", "end": None},
                                     "ran": ["start -1", "end -1 True", "start 7", "end 7 False"],
                                     "counted": _success(2)},
    "plain executing, http closed": {"replies": {"executing": "client closed", "next": "ok", "end": None},
                                     "ran": HELD + ["start 7", "end 7 False"], "counted": _success(2)},
    "dyn waiting, grpc deadline": {"replies": {"waiting": DEADLINE, "holding": None, "end": None}, "ran": HELD,
                                   "counted": _cancelled(1, 1)},
    "dyn waiting, stream closed": {"replies": {"holding": None, "end": None}, "ran": HELD,
                                   "counted": _cancelled(1, 1)},
    "dyn executing, grpc cancel": {"replies": {"executing": CANCELLED, "next": "ok", "end": None},
                                   "ran": ["start -1", "end -1 True", "start 7", "end 7 False"],
                                   "counted": _success(2)},
    "seq waiting, grpc cancel": {"replies": {"waiting": CANCELLED, "holding": None, "end": NO_START.format(110)},
                                 "ran": HELD, "counted": _cancelled(1, 1)},
    "seq waiting, http closed": {"replies": {"waiting": "client closed", "holding": None, "end": "ok"},
                                 "ran": HELD + ["start 5", "end 5 False", "start 0", "end 0 False"],
                                 "counted": _success(3)},
    "seq executing, grpc deadline": {"replies": {"executing": DEADLINE, "next": "ok", "end": "ok"},
                                     "ran": ["start -1", "end -1 True", "start 7", "end 7 False", "start 0",
                                             "end 0 False"], "counted": _success(3)},
    "seq cancelled ends its sequence": {
        "replies": {"cancelled": CANCELLED, "holding": None, "behind http": (400, {"error": CANCELLED_WITH_SEQUENCE}),
                    "behind grpc end": f"[StatusCode.CANCELLED] {CANCELLED_WITH_SEQUENCE}",
                    "later without start": NO_START.format(113)},
        "ran": HELD, "counted": _cancelled(3, 1)},
}

#: Triton 2.51's outcomes where Ferry's differ on purpose (module docstring)
TRITON_DIFFERENT: dict[str, Any] = {
    "plain waiting, grpc deadline": EXPECTED["plain waiting, grpc deadline"]
    | {"ran": HELD + ["start 5", "end 5 True"], "counted": _success(2)},
    "plain waiting, grpc cancel": EXPECTED["plain waiting, grpc cancel"]
    | {"ran": HELD + ["start 5", "end 5 True"], "counted": _success(2)},
    "plain waiting, stream closed": EXPECTED["plain waiting, stream closed"]
    | {"ran": HELD + ["start 5", "end 5 True"], "counted": _success(2)},
    "dyn waiting, grpc deadline": EXPECTED["dyn waiting, grpc deadline"]
    | {"ran": HELD + ["start 5", "end 5 True"], "counted": _success(2)},
    "dyn waiting, stream closed": EXPECTED["dyn waiting, stream closed"]
    | {"ran": HELD + ["start 5", "end 5 True"], "counted": _success(2)},
    "seq cancelled ends its sequence": EXPECTED["seq cancelled ends its sequence"]
    | {"replies": EXPECTED["seq cancelled ends its sequence"]["replies"]
       | {"behind http": (400, {"error": ""}), "behind grpc end": "[StatusCode.CANCELLED] "}},
}


def _differing(got: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    return {name: (got.get(name), want) for name, want in expected.items() if got.get(name) != want}


def test_clients_that_go_away_count_as_expected(ferry: Ports, work: Path) -> None:
    assert _differing(_outcomes(ferry, work, EXPECTED), EXPECTED) == {}


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_clients_that_go_away_match_nvidia_triton(repository: Path, work: Path) -> None:
    from support.triton import running_triton

    expected = EXPECTED | TRITON_DIFFERENT
    with running_triton(repository, list(SCHEDULING)) as ports:
        got = _outcomes(ports, work, expected)
    assert _differing(got, expected) == {}
