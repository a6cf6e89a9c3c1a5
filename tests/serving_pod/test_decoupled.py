"""Decoupled python models over gRPC ModelStreamInfer with tritonclient's streaming API.

Models in tests/serving_pod/data/decoupled: ``dec_counter`` (N responses, errors, cancellation),
``dec_async`` (async execute), ``dec_seq`` (a decoupled sequence model). Covers: N responses then the
final flag (``triton_final_response``), the empty final response on request, errors in-stream, HTTP
refusal, cancellation visible to the model when the client goes away, sequences over a stream. The counter's
cases run twice: on its instances' threads and on the event loop thread (``dec_counter_inline``: its sender only
queues each response for the loop, so a quick decoupled ``execute`` may run there; ``auto`` moves it after a
window of quick executions).
"""

from __future__ import annotations

import queue
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

DATA = Path(__file__).resolve().parent / "data" / "decoupled"
#: the counter on its instances' threads and on the event loop thread
COUNTERS = ["dec_counter", "dec_counter_inline"]


def _count_model(repo: Path, name: str, decoupled: bool, body: str) -> None:
    """A python model COUNT (INT32 [1]) -> OUT whose ``execute`` is ``body``."""
    (repo / name / "1").mkdir(parents=True)
    policy = "model_transaction_policy { decoupled: true }\n" if decoupled else ""
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{policy}'
        'input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    (repo / name / "1" / "model.py").write_text(
        "import time\n\nimport triton_python_backend_utils as pb_utils\n\n\n"
        f"class TritonPythonModel:\n    def execute(self, requests):\n        {body}\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from support.server import ServerThread, make_options

    repo = tmp_path_factory.mktemp("decoupled_repo")
    for name in ("dec_counter", "dec_async", "dec_seq", "wait_cancel"):
        shutil.copytree(DATA / name, repo / name)
    inline = repo / "dec_counter_inline"
    shutil.copytree(DATA / "dec_counter", inline)
    config = (inline / "config.pbtxt").read_text().replace('name: "dec_counter"', 'name: "dec_counter_inline"')
    (inline / "config.pbtxt").write_text(
        config + 'parameters { key: "ferry_execution_mode" value { string_value: "inline" } }\n')
    # decoupled, 3 ms asleep before its one response: over the inline wall-time limit
    _count_model(repo, "dec_slow", True, "for request in requests:\n"
                 "            time.sleep(0.003)\n"
                 "            request.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor(\"OUT\", "
                 "pb_utils.get_input_tensor_by_name(request, \"COUNT\").as_numpy())]), "
                 "flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)")
    # not decoupled: one response per request
    _count_model(repo, "echo_int", False, "return [pb_utils.InferenceResponse([pb_utils.Tensor(\"OUT\", "
                 "pb_utils.get_input_tensor_by_name(r, \"COUNT\").as_numpy())]) for r in requests]")
    thread = ServerThread(make_options([repo]))
    handle = thread.start()
    assert not handle.engine.startup_failures, handle.engine.startup_failures
    yield handle
    thread.stop()


class Stream:
    """A tritonclient gRPC stream whose callback results land in a queue."""

    def __init__(self, handle) -> None:
        self.client = grpcclient.InferenceServerClient(handle.grpc_url)
        self.items: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.items.put(error or result))

    def send(self, model: str, name: str, value: int, **kwargs) -> None:
        tensor = grpcclient.InferInput(name, [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], np.int32))
        self.client.async_stream_infer(model, [tensor], **kwargs)

    def take(self, count: int, timeout: float = 20.0) -> list:
        return [self.items.get(timeout=timeout) for _ in range(count)]

    def assert_quiet(self, seconds: float = 0.3) -> None:
        with pytest.raises(queue.Empty):
            self.items.get(timeout=seconds)

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def _marker_text(marker: Path, timeout: float = 10.0) -> str:
    """What the model wrote to ``marker``, once it has written something ("" after ``timeout``). The model opens
    the file before it writes, so the file can exist and still be empty for a moment."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker.exists() and (text := marker.read_text()):
            return text
        time.sleep(0.02)
    return marker.read_text() if marker.exists() else ""


def _final(result) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


@pytest.mark.parametrize("counter", COUNTERS)
def test_streams_n_responses_then_final(server, counter: str) -> None:
    stream = Stream(server)
    stream.send(counter, "COUNT", 5, request_id="five")
    results = stream.take(5)
    assert [int(r.as_numpy("OUT")[0]) for r in results] == [0, 1, 2, 3, 4]
    assert [r.get_response().id for r in results] == ["five"] * 5
    assert [_final(r) for r in results] == [False] * 5
    stream.assert_quiet()  # the flag-only final response is not sent unless asked for
    stream.close()


@pytest.mark.parametrize("counter", COUNTERS)
def test_empty_final_response_when_enabled(server, counter: str) -> None:
    stream = Stream(server)
    stream.send(counter, "COUNT", 2, enable_empty_final_response=True)
    results = stream.take(3)
    assert [_final(r) for r in results] == [False, False, True]
    assert results[2].as_numpy("OUT") is None
    stream.send(counter, "COUNT", 0, enable_empty_final_response=True)
    (only,) = stream.take(1)
    assert _final(only) and only.as_numpy("OUT") is None
    stream.close()


@pytest.mark.parametrize("counter", COUNTERS)
def test_final_flag_on_a_data_response(server, counter: str) -> None:
    stream = Stream(server)
    stream.send(counter, "COUNT", 3, parameters={"mode": "final_with_data"}, enable_empty_final_response=True)
    results = stream.take(3)
    assert [int(r.as_numpy("OUT")[0]) for r in results] == [0, 1, 2]
    assert [_final(r) for r in results] == [False, False, True]
    stream.assert_quiet()
    stream.close()


@pytest.mark.parametrize("enable_empty", [False, True])
def test_a_models_one_response_on_a_stream_is_marked_final(server, enable_empty: bool) -> None:
    """tritonserver sets triton_final_response on every stream response, decoupled model or not; a client
    waiting for the flag got none from a model that answers once (and no empty final response follows)."""
    stream = Stream(server)
    stream.send("echo_int", "COUNT", 7, enable_empty_final_response=enable_empty)
    (only,) = stream.take(1)
    assert int(only.as_numpy("OUT")[0]) == 7 and _final(only)
    stream.assert_quiet()
    stream.close()


def test_async_execute_streams(server) -> None:
    stream = Stream(server)
    stream.send("dec_async", "COUNT", 4)
    assert [int(r.as_numpy("OUT")[0]) for r in stream.take(4)] == [10, 20, 30, 40]
    stream.close()


@pytest.mark.parametrize("counter", COUNTERS)
def test_concurrent_requests_on_one_stream(server, counter: str) -> None:
    stream = Stream(server)
    for index in range(4):
        stream.send(counter, "COUNT", 3, request_id=f"r{index}")
    by_id: dict[str, list[int]] = {}
    for result in stream.take(12):
        by_id.setdefault(result.get_response().id, []).append(int(result.as_numpy("OUT")[0]))
    assert by_id == {f"r{index}": [0, 1, 2] for index in range(4)}
    stream.close()


@pytest.mark.parametrize("counter", COUNTERS)
def test_errors_arrive_in_stream_and_the_stream_goes_on(server, counter: str) -> None:
    stream = Stream(server)
    stream.send(counter, "COUNT", 2, parameters={"mode": "raise"})
    (error,) = stream.take(1)
    assert isinstance(error, InferenceServerException) and "asked to fail after 2" in str(error)
    stream.send(counter, "WRONG_INPUT", 1)
    (error,) = stream.take(1)
    assert isinstance(error, InferenceServerException) and "unexpected inference input 'WRONG_INPUT'" in str(error)
    stream.send(counter, "COUNT", 1)
    (ok,) = stream.take(1)
    assert int(ok.as_numpy("OUT")[0]) == 0
    stream.close()


@pytest.mark.parametrize("counter", COUNTERS)
def test_an_error_response_between_responses_is_streamed_and_the_rest_follow(server, counter: str) -> None:
    """As Triton: a non-final error response a model sends reaches the client, then its later responses."""
    stream = Stream(server)
    stream.send(counter, "COUNT", 1, parameters={"mode": "error_between"}, request_id="between")
    first, error, second = stream.take(3)
    assert int(first.as_numpy("OUT")[0]) == 0 and not _final(first)
    assert isinstance(error, InferenceServerException) and "an error between two responses" in str(error)
    assert int(second.as_numpy("OUT")[0]) == 1
    stream.assert_quiet()  # the flag-only final is not sent without triton_enable_empty_final_response
    stream.send(counter, "COUNT", 1)  # the stream goes on
    (ok,) = stream.take(1)
    assert int(ok.as_numpy("OUT")[0]) == 0
    stream.close()


def test_http_infer_on_decoupled_model_is_refused(server) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    tensor = httpclient.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], np.int32))
    with pytest.raises(InferenceServerException) as error:
        client.infer("dec_counter", [tensor])
    assert "HTTP end point doesn't support models with decoupled transaction policy" in str(error.value)
    client.close()
    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], np.int32))
    with pytest.raises(InferenceServerException,
                       match="ModelInfer RPC doesn't support models with decoupled transaction policy"):
        grpc_client.infer("dec_counter", [tensor])  # unary ModelInfer cannot carry 0..N responses either
    grpc_client.close()


def test_model_sees_cancellation_when_the_client_goes_away(server, tmp_path) -> None:
    marker = tmp_path / "marker"
    stream = Stream(server)
    stream.send("dec_counter", "COUNT", 1, parameters={"mode": "until_cancelled", "marker": str(marker)})
    (first,) = stream.take(1)
    assert int(first.as_numpy("OUT")[0]) == 0
    stream.close(cancel=True)
    assert _marker_text(marker) == "cancelled"


def test_unary_request_cancelled_when_the_client_gives_up(server, tmp_path) -> None:
    """A gRPC ModelInfer past its deadline: the running (non-decoupled) model sees is_cancelled()."""
    marker = tmp_path / "marker"
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("X", [1], "INT32")
    tensor.set_data_from_numpy(np.array([3], np.int32))
    with pytest.raises(InferenceServerException, match="Deadline"):
        client.infer("wait_cancel", [tensor], parameters={"marker": str(marker)}, client_timeout=0.5)
    client.close()
    assert _marker_text(marker) == "cancelled"


def test_sequences_over_a_stream(server) -> None:
    """Two interleaved sequences of a decoupled sequence model on one stream: each keeps its own total."""
    stream = Stream(server)
    plan = {"seq-a": [1, 2, 3], "seq-b": [100, 200, 300]}
    for step in range(3):
        for key, values in plan.items():
            stream.send("dec_seq", "INPUT", values[step], request_id=f"{key}:{step}", sequence_id=key,
                        sequence_start=step == 0, sequence_end=step == 2)
    got: dict[str, list[int]] = {}
    for result in stream.take(12):
        assert not isinstance(result, Exception), result
        got.setdefault(result.get_response().id, []).append(int(result.as_numpy("TOTAL")[0]))
    assert got == {
        "seq-a:0": [1, 10], "seq-a:1": [3, 30], "seq-a:2": [6, 60],
        "seq-b:0": [100, 1000], "seq-b:1": [300, 3000], "seq-b:2": [600, 6000],
    }
    stream.send("dec_seq", "INPUT", 1, sequence_id="seq-a")  # ended: a new START is needed
    (error,) = stream.take(1)
    assert isinstance(error, InferenceServerException) and "must specify the START flag" in str(error)
    stream.close()


def _runs_inline(handle, model: str) -> list[bool]:
    pool = handle.engine.registry.get(model).pool
    return [pool.runs_inline(index) for index in range(len(pool.instances))]


def test_a_quick_decoupled_model_moves_to_the_loop_and_a_slow_one_stays_on_its_thread(
    server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dec_counter_inline`` runs on the loop from the first request; ``auto`` moves ``dec_counter`` there after a
    window of quick executions per instance (up to sixteen windows' worth of requests on a busy host), while
    ``dec_slow`` (3 ms asleep each time) and ``dec_async`` (a coroutine) stay on their threads."""
    from serving_pod.schedulers import instances

    monkeypatch.setattr(instances, "INLINE_ENTER_NS", 5_000_000)  # a busy host's CPU spikes must not restart windows
    assert _runs_inline(server, "dec_counter_inline") == [True, True]
    stream = Stream(server)
    sent = 0
    while not all(_runs_inline(server, "dec_counter")) and sent < 16 * instances.INLINE_WINDOW:
        stream.send("dec_counter", "COUNT", 2, request_id=str(sent))
        assert [int(r.as_numpy("OUT")[0]) for r in stream.take(2)] == [0, 1]
        sent += 1
    assert _runs_inline(server, "dec_counter") == [True, True]
    stream.send("dec_counter", "COUNT", 3, request_id="after")
    assert [int(r.as_numpy("OUT")[0]) for r in stream.take(3)] == [0, 1, 2]
    for value in range(instances.INLINE_WINDOW + 4):
        stream.send("dec_slow", "COUNT", value)
        assert int(stream.take(1)[0].as_numpy("OUT")[0]) == value
    assert _runs_inline(server, "dec_slow") == [False]
    assert _runs_inline(server, "dec_async") == [False]
    stream.close()
