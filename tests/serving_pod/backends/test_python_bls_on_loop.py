"""A BLS model's ``execute`` on the event loop thread, suspended at each ``exec()`` (``core/suspend.py``).

The same BLS models run on their instance's thread (``ferry_execution_mode: thread``) and on the loop thread
(``inline``, which for a model that blocks only on the engine means suspended there), over HTTP and gRPC:
the answers, the errors a failed call gives and the statistics are the same. Between a suspended
execution's waits other models run on the loop thread; ``outer`` imports a helper from its own directory
after its call, which finds it only if its thread state (``bind_thread``) is its own again. A decoupled
call (``exec(decoupled=True)``) streams into a suspended execution, an ``auto`` model moves to the loop
after its first window of threaded executions, a client that leaves while the execution waits takes
nothing else down (the execution runs to its end and is charged), and a model with threads of its own is
never suspended on the loop.
"""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from serving_pod.schedulers import instances
from support.python_models import COUNT_CONFIG, COUNT_MODEL, execution_mode, in_out_config
from support.server import write_model

PROTOCOLS = ["http", "grpc"]
MODES = ["thread", "inline"]


INNER = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        self.delay = float(json.loads(args["model_config"])["parameters"].get("DELAY_S", {}).get("string_value", 0))

    def execute(self, requests):
        time.sleep(self.delay)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN")
                                                            .as_numpy() * 2)]) for r in requests]
'''

#: calls ``target`` (request parameter, default "inner"), then multiplies by its helper's FACTOR (3)
OUTER = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            target = json.loads(request.parameters()).get("target", "inner")
            answer = pb_utils.InferenceRequest(
                model_name=target, requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())],
            ).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("outer: " + answer.error().message())))
                continue
            import outer_helper  # found in this model's own directory only

            out = pb_utils.get_output_tensor_by_name(answer, "OUT").as_numpy() * outer_helper.FACTOR
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out.astype(np.int32))]))
        return responses
'''
#: ``OUTER`` without the helper, whose import (about 700 us of CPU, made each time) would keep ``auto`` on the thread
OUTER_LIGHT = OUTER.replace("import outer_helper  # found in this model's own directory only", "").replace(
    "outer_helper.FACTOR", "3")

#: sums the responses of a decoupled call to ``counter`` (N -> 0 + 1 + ... + N-1); an error part fails the request
STREAMER = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="counter", requested_output_names=["I"],
                inputs=[pb_utils.Tensor("N", pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())],
            )
            total = 0
            for part in call.exec(decoupled=True):
                if part.has_error():
                    raise pb_utils.TritonModelException("streamer: " + part.error().message())
                if part.output_tensors():
                    total += int(pb_utils.get_output_tensor_by_name(part, "I").as_numpy()[0])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([total], np.int32))]))
        return responses
'''

#: a BLS model whose call lives in a helper module it imports at the top: the source check reads that module too;
#: a request that asks ("alone") is answered without the call
HELPED = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils

import hidden_helper


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if json.loads(request.parameters()).get("alone"):
                out = value * 6
            else:
                out = hidden_helper.times_six(value)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out.astype(np.int32))]))
        return responses
'''
#: the same, importing its helper only where it calls it: neither its source nor its load shows the engine call
HIDDEN = HELPED.replace("\nimport hidden_helper\n", "\n").replace(
    "                out = hidden_helper.times_six(value)",
    "                import hidden_helper\n\n                out = hidden_helper.times_six(value)")
HIDDEN_HELPER = '''
import triton_python_backend_utils as pb_utils


def times_six(value):
    answer = pb_utils.InferenceRequest(model_name="inner", requested_output_names=["OUT"],
                                       inputs=[pb_utils.Tensor("IN", value)]).exec()
    if answer.has_error():
        raise pb_utils.TritonModelException(answer.error().message())
    return pb_utils.get_output_tensor_by_name(answer, "OUT").as_numpy() * 3
'''

#: calls ``inner`` on this same server through tritonclient's HTTP client (the request's "url" parameter), not BLS
OVER_HTTP = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils
import tritonclient.http as httpclient


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            client = httpclient.InferenceServerClient(json.loads(request.parameters())["url"], network_timeout=5.0,
                                                      connection_timeout=5.0)
            tensor = httpclient.InferInput("IN", [1], "INT32")
            tensor.set_data_from_numpy(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())
            out = client.infer("inner", [tensor]).as_numpy("OUT") * 3
            client.close()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out.astype(np.int32))]))
        return responses
'''

@pytest.fixture
def server(threaded_server, tmp_path):
    write_model(tmp_path, "inner", in_out_config("inner", 0, execution_mode("inline")), {"1/model.py": INNER})
    write_model(tmp_path, "slow_inner",
                in_out_config("slow_inner", 0, 'parameters { key: "DELAY_S" value { string_value: "0.5" } }'),
                {"1/model.py": INNER})
    write_model(tmp_path, "counter", COUNT_CONFIG, {"1/model.py": COUNT_MODEL})
    for mode in MODES:
        write_model(tmp_path, f"outer_{mode}", in_out_config(f"outer_{mode}", 0, execution_mode(mode)),
                    {"1/model.py": OUTER, "1/outer_helper.py": "FACTOR = 3\n"})
    write_model(tmp_path, "outer_auto", in_out_config("outer_auto", 0, execution_mode("auto")), {"1/model.py": OUTER_LIGHT})
    for mode in ("auto", "inline"):  # a model with threads of its own could deadlock the loop: never suspended
        write_model(tmp_path, f"threads_{mode}", in_out_config(f"threads_{mode}", 0, execution_mode(mode)),
                    {"1/model.py": "import threading\n" + OUTER_LIGHT})
    write_model(tmp_path, "over_http_auto", in_out_config("over_http_auto", 0, execution_mode("auto")),
                {"1/model.py": OVER_HTTP})
    write_model(tmp_path, "sometimes_auto", in_out_config("sometimes_auto", 0, execution_mode("auto")),
                {"1/model.py": HIDDEN, "1/hidden_helper.py": HIDDEN_HELPER})
    write_model(tmp_path, "hidden_auto", in_out_config("hidden_auto", 0, execution_mode("auto")),
                {"1/model.py": HIDDEN, "1/hidden_helper.py": HIDDEN_HELPER})
    write_model(tmp_path, "helped_auto", in_out_config("helped_auto", 0, execution_mode("auto")),
                {"1/model.py": HELPED, "1/hidden_helper.py": HIDDEN_HELPER})
    for mode in MODES:
        write_model(tmp_path, f"streamer_{mode}", in_out_config(f"streamer_{mode}", 0, execution_mode(mode)),
                    {"1/model.py": STREAMER})
    return threaded_server([tmp_path])


def _infer(server, protocol: str, model: str, value: int, **kwargs):
    module = server.module(protocol)
    tensor = module.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return server.client(protocol).infer(model, [tensor], **kwargs)


def _error(server, protocol: str, model: str, value: int, **kwargs) -> str:
    with pytest.raises(InferenceServerException) as failure:
        _infer(server, protocol, model, value, **kwargs)
    return failure.value.message()


def _suspends(server, model: str) -> tuple[bool, bool]:
    """(declared suspends_on_engine, runs suspended on the loop now) for the model's one instance."""
    pool = server.engine.registry.get(model).pool
    return bool(pool.instances[0].suspends_on_engine), pool._modes[0].inline and not pool.runs_inline(0)


def _count(server, model: str) -> tuple[int, int, int]:
    stats = server.client("http").get_inference_statistics(model)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"]), int(stats["inference_stats"]["fail"]["count"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_bls_model_answers_the_same_on_the_loop_as_on_its_thread(server, protocol: str) -> None:
    assert _suspends(server, "outer_thread") == (True, False)
    assert _suspends(server, "outer_inline") == (True, True)
    for mode in MODES:
        assert _infer(server, protocol, f"outer_{mode}", 5).as_numpy("OUT").tolist() == [30]
    missing = [_error(server, protocol, f"outer_{mode}", 1, parameters={"target": "missing"}).replace(mode, "M")
               for mode in MODES]
    assert missing[0] == missing[1]
    assert missing[0].startswith("outer: ") and "missing" in missing[0]
    for mode in MODES:
        # two executions each (one failed call answered with the model's error: a success, as in Triton)
        assert _count(server, f"outer_{mode}") == (2, 2, 0)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_decoupled_call_streams_into_a_suspended_execution(server, protocol: str) -> None:
    for mode in MODES:
        assert _infer(server, protocol, f"streamer_{mode}", 5).as_numpy("OUT").tolist() == [10]
        assert _infer(server, protocol, f"streamer_{mode}", 0).as_numpy("OUT").tolist() == [0]
    # two parts, then an error (the message names the model's instance)
    errors = [_error(server, protocol, f"streamer_{mode}", -3).replace(mode, "M") for mode in MODES]
    assert errors[0] == errors[1] and "streamer: negative count" in errors[0]


def test_an_auto_bls_model_moves_to_the_loop(server, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a window of threaded executions that hold their thread briefly (their waits on the call left out). On a
    busy host a window's executions can wait for the GIL past the allowance, and the next is judged afresh: up to
    eight windows' worth of requests."""
    # the model's thread CPU per execution (200-500 us here) can pass INLINE_ENTER_NS now and then on a busy host
    monkeypatch.setattr(instances, "INLINE_ENTER_NS", 5_000_000)
    client = server.client("http")
    assert _suspends(server, "outer_auto") == (True, False)
    sent = 0
    while _suspends(server, "outer_auto")[1] is False and sent < 8 * instances.INLINE_WINDOW:
        tensor = server.module("http").InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([sent], np.int32))
        assert client.infer("outer_auto", [tensor]).as_numpy("OUT").tolist() == [6 * sent]
        sent += 1
    assert _suspends(server, "outer_auto") == (True, True)
    for value in range(3):  # now suspended on the loop
        tensor = server.module("http").InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], np.int32))
        assert client.infer("outer_auto", [tensor]).as_numpy("OUT").tolist() == [6 * value]
    assert _count(server, "outer_auto") == (sent + 3, sent + 3, 0)


def test_a_model_whose_source_hides_its_bls_call_stays_on_its_thread(server, monkeypatch: pytest.MonkeyPatch) -> None:
    """``model.py`` shows no engine call (its helper module makes it), so the model declares itself inline-safe,
    not suspendable; on its thread its executions are quick once their waits on the call are left out. ``auto``
    must not move it to the loop, where its call could not wait: every request is answered, on its thread."""
    monkeypatch.setattr(instances, "INLINE_ENTER_NS", 5_000_000)
    pool = server.engine.registry.get("hidden_auto").pool
    assert (pool.instances[0].inline_safe, pool.instances[0].suspends_on_engine) == (True, False)
    requests = 4 * instances.INLINE_WINDOW
    for value in range(requests):
        assert _infer(server, PROTOCOLS[value % 2], "hidden_auto", value).as_numpy("OUT").tolist() == [6 * value]
        assert not pool._modes[0].inline
    assert _count(server, "hidden_auto") == (requests, requests, 0)


def test_a_model_whose_hidden_call_comes_once_it_runs_inline_goes_back_to_its_thread(
        server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its first BLS call (in a helper module) comes after ``auto`` moved it to the loop: that call cannot wait
    there and is refused, failing its request with a clear error; the model goes back to its thread for good, and
    its later calls are answered."""
    monkeypatch.setattr(instances, "INLINE_ENTER_NS", 5_000_000)
    pool = server.engine.registry.get("sometimes_auto").pool
    sent = 0
    while not pool._modes[0].inline and sent < 8 * instances.INLINE_WINDOW:
        answer = _infer(server, PROTOCOLS[sent % 2], "sometimes_auto", sent, parameters={"alone": True})
        assert answer.as_numpy("OUT").tolist() == [6 * sent]
        sent += 1
    assert pool._modes[0].inline
    message = _error(server, "grpc", "sometimes_auto", 1)
    assert "a blocking BLS call was made on the server's event loop thread" in message
    assert not pool._modes[0].inline
    for value in range(instances.INLINE_WINDOW + 2):
        answer = _infer(server, PROTOCOLS[value % 2], "sometimes_auto", value, parameters={"alone": value % 2 == 1})
        assert answer.as_numpy("OUT").tolist() == [6 * value]
    assert not pool._modes[0].inline
    answered = sent + instances.INLINE_WINDOW + 2  # the refused request failed: counted an execution and a failure
    assert _count(server, "sometimes_auto") == (answered, answered + 1, 1)


def test_a_model_whose_bls_call_is_in_a_helper_it_imports_is_suspended_not_refused(
        server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its ``model.py`` shows no engine call, but the helper module its import loaded from its directory does: the
    model declares itself suspendable, so its first BLS call made once ``auto`` moved it to the loop suspends there
    and is answered (a model that imports its helper only where it calls it is refused once: the test above)."""
    monkeypatch.setattr(instances, "INLINE_ENTER_NS", 5_000_000)
    pool = server.engine.registry.get("helped_auto").pool
    assert (pool.instances[0].inline_safe, pool.instances[0].suspends_on_engine) == (False, True)
    sent = 0
    while not pool._modes[0].inline and sent < 8 * instances.INLINE_WINDOW:
        answer = _infer(server, PROTOCOLS[sent % 2], "helped_auto", sent, parameters={"alone": True})
        assert answer.as_numpy("OUT").tolist() == [6 * sent]
        sent += 1
    assert _suspends(server, "helped_auto") == (True, True)
    for value in range(4):  # the engine calls, the first of them on the loop
        assert _infer(server, PROTOCOLS[value % 2], "helped_auto", value).as_numpy("OUT").tolist() == [6 * value]
    assert _suspends(server, "helped_auto") == (True, True)
    assert _count(server, "helped_auto") == (sent + 4, sent + 4, 0)


def test_a_model_calling_its_own_server_over_the_network_stays_on_its_thread(
        server, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the loop thread its HTTP call to this server would wait for an answer only that thread can give: the
    server would hang until the client's timeout. Its source names a network client, so it never goes inline,
    however quick its executions are on its thread."""
    monkeypatch.setattr(instances, "INLINE_ENTER_NS", 5_000_000)
    pool = server.engine.registry.get("over_http_auto").pool
    assert not pool.instances[0].inline_safe
    requests = 2 * instances.INLINE_WINDOW
    for value in range(requests):
        answer = _infer(server, PROTOCOLS[value % 2], "over_http_auto", value, parameters={"url": server.http_url})
        assert answer.as_numpy("OUT").tolist() == [6 * value]
        assert not pool._modes[0].inline
    assert _count(server, "over_http_auto") == (requests, requests, 0)


def test_a_client_leaving_a_suspended_execution_takes_nothing_down(server) -> None:
    with pytest.raises(InferenceServerException) as failure:
        _infer(server, "grpc", "outer_inline", 4, parameters={"target": "slow_inner"}, client_timeout=0.1)
    assert failure.value.status() == str(grpc.StatusCode.DEADLINE_EXCEEDED)
    assert _infer(server, "http", "outer_inline", 2).as_numpy("OUT").tolist() == [12]  # the loop is free meanwhile
    deadline = time.monotonic() + 10
    while _count(server, "slow_inner")[0] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)
    assert _count(server, "slow_inner") == (1, 1, 0)  # the call ran to its end
    assert _count(server, "outer_inline")[1] == 2  # both executions charged
    assert _infer(server, "grpc", "outer_inline", 1).as_numpy("OUT").tolist() == [6]


def test_a_bls_model_with_threads_of_its_own_stays_on_its_thread(server) -> None:
    """Its threads could call the engine while its ``execute`` waits for them on the loop thread (a deadlock): it
    runs on its thread in ``auto``, and told to run ``inline`` its BLS call fails with a clear error, nothing else."""
    assert _suspends(server, "threads_auto") == (False, False)
    for value in range(instances.INLINE_WINDOW + 2):
        assert _infer(server, "http", "threads_auto", value).as_numpy("OUT").tolist() == [6 * value]
    assert _suspends(server, "threads_auto") == (False, False)
    message = _error(server, "grpc", "threads_inline", 1)
    assert "a blocking BLS call was made on the server's event loop thread" in message
    assert "ferry_execution_mode to 'thread'" in message
    assert _infer(server, "grpc", "outer_inline", 1).as_numpy("OUT").tolist() == [6]
