"""Ensemble failures, clients that go away, and the statistics they leave, side by side with tritonserver 2.51.

Python steps (``fast``: x2; ``slow``: x3, taking a second unless its input is negative or its request is
cancelled; ``post``: x10; ``repeat``: decoupled, one response per element) make ``chain`` (slow then post),
``par`` (fast and slow side by side), ``outer`` (an ensemble over ``par``) and ``dslow`` (slow, repeat, post:
decoupled). Each case sends one request, waits until the statistics settle, and compares the reply (HTTP status
and body, gRPC error) and what the request added to every model's success, failure and execution counts; the
``nv_inference_request_failure`` series of the ensembles are compared last. Ferry is checked against Triton's
recorded answers always (skipped with the installer's reason where Triton cannot be had).

Triton 2.51 counts a failed ensemble request once when the error goes out and once more when it releases the
request, which it does only if no step was left in flight: a step failing while another runs in parallel (or a
decoupled step still to send its final flag, a flow still running, a composing ensemble failing so) counts one
failure, and the request is never released (a leak fixed in later Triton). The first error to come wins, prefixed
``in ensemble '<name>', `` (twice for a nested ensemble's step); the composing models count what they ran (an
error response of a python model is a success of that model). Difference fixed here: Ferry counted every failure
twice; it now counts as Triton does, without the leak (the steps left are cancelled).

Kept different on purpose: a client that goes away while a step runs (a gRPC cancel or deadline, a closed
stream). Triton 2.51 runs every step to the end and counts a success for the ensemble; Ferry cancels the request
and its steps (the step executing sees ``is_cancelled()``; later steps never run) and counts one failure of
reason ``CANCELED`` for the ensemble, as its schedulers count a request dropped for its client, so that every
request is counted once (before, Ferry counted it nowhere). An HTTP client that closes its connection is not seen before the answer is written, by
either server: the request runs and counts a success.

Triton 2.51 itself sometimes stops answering here: on a busy machine (3 runs of about 25, none on an idle one),
after requests whose step fails while another runs, a composing model stops answering and later requests
through it hang. Its half then ends as an expected failure naming the request left unanswered, with nothing
compared; Ferry's half fails on any unanswered request.
"""

from __future__ import annotations

import queue
import re
import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from support.server import write_model

#: INPUT0 times ``factor``, after ``wait`` seconds unless the input is negative or the request is cancelled;
#: an error response for an input whose first element is in ``fail_on``
WORK_PY = '''
import json
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config["name"]
        parameters = config["parameters"]
        self.factor = int(parameters["factor"]["string_value"])
        self.wait = float(parameters["wait"]["string_value"])
        self.fail_on = {int(value) for value in parameters["fail_on"]["string_value"].split(",")}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            deadline = time.monotonic() + (self.wait if x.size and int(x.flat[0]) >= 0 else 0)
            while time.monotonic() < deadline and not request.is_cancelled():
                time.sleep(0.01)
            if x.size and int(x.flat[0]) in self.fail_on:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"{self.name} refuses {int(x.flat[0])}")))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (x * self.factor).astype(np.int32))]))
        return responses
'''

#: one response per element of INPUT0, then the final flag alone
REPEAT_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for value in pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().flat:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", np.array([value], dtype=np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

MODELS = ("fast", "slow", "post", "repeat", "chain", "par", "outer", "dslow")
ENSEMBLES = ("chain", "par", "outer", "dslow")


def _work(name: str, factor: int, wait: float, fail_on: str, extra: str = "") -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
parameters {{ key: "factor" value: {{ string_value: "{factor}" }} }}
parameters {{ key: "wait" value: {{ string_value: "{wait}" }} }}
parameters {{ key: "fail_on" value: {{ string_value: "{fail_on}" }} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}
"""


def _step(model: str, source: str, target: str, ports: tuple[str, str] = ("INPUT0", "OUTPUT0")) -> str:
    return (f'{{ model_name: "{model}" model_version: -1 input_map {{ key: "{ports[0]}" value: "{source}" }} '
            f'output_map {{ key: "{ports[1]}" value: "{target}" }} }}')


def _ensemble(name: str, outputs: tuple[str, ...], steps: list[str]) -> str:
    tensors = ", ".join(f'{{ name: "{output}" data_type: TYPE_INT32 dims: [ -1 ] }}' for output in outputs)
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {tensors} ]
ensemble_scheduling {{ step [ {", ".join(steps)} ] }}
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repository = tmp_path_factory.mktemp("ensemble_failures")
    write_model(repository, "fast", _work("fast", 2, 0, "99,55"), {"1/model.py": WORK_PY})
    write_model(repository, "slow", _work("slow", 3, 1.0, "77,55,-7"), {"1/model.py": WORK_PY})
    write_model(repository, "post", _work("post", 10, 0, "-15"), {"1/model.py": WORK_PY})
    write_model(repository, "repeat", _work("repeat", 1, 0, "0", "model_transaction_policy { decoupled: true }"),
                {"1/model.py": REPEAT_PY})
    write_model(repository, "chain", _ensemble("chain", ("OUT",), [_step("slow", "IN", "x"), _step("post", "x", "OUT")]))
    write_model(repository, "par", _ensemble("par", ("A", "B"), [_step("fast", "IN", "A"), _step("slow", "IN", "B")]))
    outer_step = ('{ model_name: "par" model_version: -1 input_map { key: "IN" value: "IN" } '
                  'output_map { key: "A" value: "A" } output_map { key: "B" value: "B" } }')
    write_model(repository, "outer", _ensemble("outer", ("A", "B"), [outer_step]))
    write_model(repository, "dslow", _ensemble("dslow", ("OUT",), [
        _step("slow", "IN", "x"), _step("repeat", "x", "y"), _step("post", "y", "OUT")]))
    return repository


Counts = dict[str, tuple[int, int, int]]


def _counts(client: httpx.Client) -> Counts:
    """Every model's (success, fail, execution) counts."""
    counts = {}
    for entry in client.get("/v2/models/stats").json()["model_stats"]:
        stats = entry["inference_stats"]
        counts[entry["name"]] = (stats["success"]["count"], stats["fail"]["count"], entry["execution_count"])
    return counts


def _added(before: Counts, after: Counts) -> Counts:
    return {model: tuple(a - b for a, b in zip(after[model], before[model]))  # type: ignore[misc]
            for model in MODELS if after[model] != before[model]}


def _failure_metrics(client: httpx.Client, metrics_port: int) -> dict[str, int]:
    """The ensembles' non-zero ``nv_inference_request_failure`` series, as ``model/reason``."""
    text = client.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    found = {}
    for line in text.splitlines():
        match = re.match(r'nv_inference_request_failure\{(.*)\} (\S+)$', line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            if labels["model"] in ENSEMBLES and float(match.group(2)):
                found[f"{labels['model']}/{labels['reason']}"] = int(float(match.group(2)))
    return found


def _body(values: list[int]) -> dict[str, Any]:
    return {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [len(values)], "data": values}]}


def _tensor(values: list[int]) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("IN", [len(values)], "INT32")
    tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
    return tensor


#: how long a request may take before the server is taken to be stuck (Triton 2.51 can be: module docstring)
_PATIENCE_S = 30.0
#: the replies of a request that got no answer in time
_UNANSWERED = ("client closed", "[StatusCode.DEADLINE_EXCEEDED] Deadline Exceeded")


class _NoAnswer(Exception):
    """The server did not answer a request that should have been answered."""


def _answers(http_port: int, grpc_port: int, metrics_port: int, expected: dict[str, Any]) -> dict[str, Any]:
    grpc_url = f"127.0.0.1:{grpc_port}"
    with httpx.Client(base_url=f"http://127.0.0.1:{http_port}", timeout=60) as client:
        return _run_cases(client, grpc_url, metrics_port, expected)


def _run_cases(client: httpx.Client, grpc_url: str, metrics_port: int, expected: dict[str, Any]) -> dict[str, Any]:
    base = str(client.base_url).rstrip("/")

    def http(model: str, values: list[int], timeout: float = _PATIENCE_S) -> object:
        try:
            with httpx.Client(timeout=timeout) as own:  # its own connection, which a timeout closes
                response = own.post(f"{base}/v2/models/{model}/infer", json=_body(values))
        except httpx.TimeoutException:
            return "client closed"
        body = response.json()
        return response.status_code, body.get("error") or {o["name"]: o["data"] for o in body["outputs"]}

    def grpc(model: str, values: list[int], timeout: float = _PATIENCE_S) -> object:
        stub = grpcclient.InferenceServerClient(grpc_url)
        try:
            result = stub.infer(model, [_tensor(values)], client_timeout=timeout)
            return {output.name: result.as_numpy(output.name).tolist() for output in result.get_response().outputs}
        except Exception as error:  # noqa: BLE001 - the error is the answer compared
            return str(error)
        finally:
            stub.close()

    def grpc_cancelled(model: str, values: list[int]) -> object:
        stub = grpcclient.InferenceServerClient(grpc_url)
        answers: queue.Queue = queue.Queue()
        call = stub.async_infer(model, [_tensor(values)], callback=lambda result, error: answers.put(error))
        time.sleep(0.3)  # slow is running
        call.cancel()
        error = answers.get(timeout=_PATIENCE_S)
        stub.close()
        return str(error)

    def stream_cancelled(model: str, values: list[int]) -> object:
        stub = grpcclient.InferenceServerClient(grpc_url)
        answers: queue.Queue = queue.Queue()
        stub.start_stream(callback=lambda result, error: answers.put(error))
        stub.async_stream_infer(model, [_tensor(values)], enable_empty_final_response=True)
        time.sleep(0.3)  # slow is running
        stub.stop_stream(cancel_requests=True)
        stub.close()
        return "cancelled"  # tritonclient's own words

    cases: dict[str, Callable[[], object]] = {
        "chain ok": lambda: http("chain", [-1, -2]),
        "chain first step fails": lambda: http("chain", [-7]),
        "chain last step fails": lambda: http("chain", [-5]),
        "par fails while a step runs http": lambda: http("par", [99]),
        "par fails while a step runs grpc": lambda: grpc("par", [99]),
        "par last step fails": lambda: http("par", [77]),
        "par both fail": lambda: grpc("par", [55]),
        "outer fails while a step runs": lambda: grpc("outer", [99]),
        "outer last step fails": lambda: http("outer", [77]),
        "chain http client closes": lambda: http("chain", [1], timeout=0.3),
        "chain grpc deadline": lambda: grpc("chain", [1], timeout=0.3),
        "par grpc cancelled": lambda: grpc_cancelled("par", [1]),
        "dslow stream cancelled": lambda: stream_cancelled("dslow", [1, 2]),
    }
    got: dict[str, Any] = {}
    for name, send in cases.items():
        before = _counts(client)
        reply = send()
        if reply in _UNANSWERED and reply != expected[name][0]:
            raise _NoAnswer(f"{name!r}: no answer in {_PATIENCE_S} s")
        deadline = time.monotonic() + 20  # steps still running (Triton lets them finish) count when they end
        while _added(before, _counts(client)) != expected[name][1] and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.1)  # and nothing more comes later
        got[name] = (reply, _added(before, _counts(client)))
    got["failure metrics"] = _failure_metrics(client, metrics_port)
    return got


OK = (1, 0, 1)
EXPECTED: dict[str, Any] = {
    "chain ok": ((200, {"OUT": [-30, -60]}), {"slow": OK, "post": OK, "chain": OK}),
    "chain first step fails": ((500, "in ensemble 'chain', slow refuses -7"), {"slow": OK, "chain": (0, 2, 0)}),
    "chain last step fails": ((500, "in ensemble 'chain', post refuses -15"),
                              {"slow": OK, "post": OK, "chain": (0, 2, 0)}),
    "par fails while a step runs http": ((500, "in ensemble 'par', fast refuses 99"),
                                         {"fast": OK, "slow": OK, "par": (0, 1, 0)}),
    "par fails while a step runs grpc": ("[StatusCode.INTERNAL] in ensemble 'par', fast refuses 99",
                                         {"fast": OK, "slow": OK, "par": (0, 1, 0)}),
    "par last step fails": ((500, "in ensemble 'par', slow refuses 77"), {"fast": OK, "slow": OK, "par": (0, 2, 0)}),
    "par both fail": ("[StatusCode.INTERNAL] in ensemble 'par', fast refuses 55",  # the first error wins
                      {"fast": OK, "slow": OK, "par": (0, 1, 0)}),
    "outer fails while a step runs": ("[StatusCode.INTERNAL] in ensemble 'outer', in ensemble 'par', fast refuses 99",
                                      {"fast": OK, "slow": OK, "par": (0, 1, 0), "outer": (0, 1, 0)}),
    "outer last step fails": ((500, "in ensemble 'outer', in ensemble 'par', slow refuses 77"),
                              {"fast": OK, "slow": OK, "par": (0, 2, 0), "outer": (0, 2, 0)}),
    "chain http client closes": ("client closed", {"slow": OK, "post": OK, "chain": OK}),
    # kept different (module docstring): Ferry cancels the request and counts it CANCELED
    "chain grpc deadline": ("[StatusCode.DEADLINE_EXCEEDED] Deadline Exceeded", {"slow": OK, "chain": (0, 1, 0)}),
    "par grpc cancelled": ("[StatusCode.CANCELLED] Locally cancelled by application!",
                           {"fast": OK, "slow": OK, "par": (0, 1, 0)}),
    "dslow stream cancelled": ("cancelled", {"slow": OK, "dslow": (0, 1, 0)}),
    "failure metrics": {"chain/OTHER": 4, "chain/CANCELED": 1, "par/OTHER": 8, "par/CANCELED": 1, "outer/OTHER": 3,
                        "dslow/CANCELED": 1},
}

#: Triton 2.51's answers where Ferry's differ on purpose (module docstring)
TRITON_DIFFERENT: dict[str, Any] = {
    "chain grpc deadline": (EXPECTED["chain grpc deadline"][0], {"slow": OK, "post": OK, "chain": OK}),
    "par grpc cancelled": (EXPECTED["par grpc cancelled"][0], {"fast": OK, "slow": OK, "par": OK}),
    "dslow stream cancelled": ("cancelled", {"slow": OK, "repeat": OK, "post": (2, 0, 2), "dslow": OK}),
    "failure metrics": {"chain/OTHER": 4, "par/OTHER": 8, "outer/OTHER": 3},
}


def _differing(got: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    return {key: (got.get(key), value) for key, value in expected.items() if got.get(key) != value}


def test_failures_and_cancellation_count_as_expected(threaded_server, repository) -> None:
    server = threaded_server([repository], model_control_mode="explicit", load_models=MODELS)
    got = _answers(server.server.http_port, server.server.grpc_port, server.server.metrics_port, EXPECTED)
    assert _differing(got, EXPECTED) == {}


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_answers_match_nvidia_tritons(repository) -> None:
    from support.triton import running_triton

    expected = EXPECTED | TRITON_DIFFERENT
    with running_triton(repository, list(MODELS)) as ports:
        try:
            got = _answers(*ports, expected)
        except _NoAnswer as stuck:  # Triton's own fault, seen under load (module docstring): nothing to compare
            pytest.xfail(f"tritonserver 2.51 stopped answering at {stuck}")
    assert _differing(got, expected) == {}
