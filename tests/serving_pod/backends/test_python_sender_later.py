"""A non-decoupled python model that answers a request after ``execute`` returned None, through the request's
response sender, with one instance: as in Triton 2.51, the instance is free meanwhile, so a later request's
``execute`` runs while the first one waits, and may be what answers it (Ferry held the instance until the answer came:
the two requests waited on each other). Same cases over HTTP and gRPC, for a thread and for a task of an
``async def execute``; side by side with Triton where it can be had.

Kept different on purpose: a model that never answers leaves Triton's client waiting and the model ``UNLOADING`` for
good after an unload; Ferry waits ``python_model.UNLOAD_GRACE_S`` for the answer, then answers the request
``UNAVAILABLE`` (``... was unloaded before it sent a response ...``) and the unload completes.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from support.server import write_model

CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
'''

#: IN 0: wait for the next request (answered -1 after 20 s if none comes: bounded on a server that holds the
#: instance); IN < 0: never answered (but after 60 s); IN k > 0: answer k + 1 (+ 100 per request never answered),
#: and the waiting request k from a thread
RELAY = '''
import threading

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def answer(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        self.waiting = []
        self.open = set()
        self.changed = threading.Condition()

    def _send_to_waiting(self, value, timeout):
        with self.changed:
            self.changed.wait_for(lambda: self.waiting, timeout=timeout)
            waiting, self.waiting = self.waiting, []
            self.open.difference_update(waiting)
        for sender in waiting:
            sender.send(answer(value), flags=FINAL)

    def _fallback(self, sender):
        with self.changed:
            if sender not in self.open:
                return
            self.open.discard(sender)
            if sender in self.waiting:
                self.waiting.remove(sender)
        sender.send(answer(-1), flags=FINAL)

    def execute(self, requests):
        out = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if value > 0:
                threading.Thread(target=self._send_to_waiting, args=(value, 30), daemon=True).start()
                with self.changed:
                    never = len(self.open.difference(self.waiting))
                out.append(answer(value + 1 + 100 * never))
                continue
            sender = request.get_response_sender()
            timer = threading.Timer(20 if value == 0 else 60, self._fallback, args=(sender,))
            timer.daemon = True
            with self.changed:
                self.open.add(sender)
                if value == 0:
                    self.waiting.append(sender)
                    self.changed.notify_all()
            timer.start()
            out.append(None)
        return out
'''

ASYNC_RELAY = '''
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def answer(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])


class TritonPythonModel:
    """IN 0 waits for the next request (or 20 s); IN k > 0 answers k + 1, and the waiting one k from a task."""

    def initialize(self, args):
        self.waiting = []
        self.tasks = set()

    def _spawn(self, coroutine):
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _fallback(self, sender):
        await asyncio.sleep(20)
        if sender in self.waiting:
            self.waiting.remove(sender)
            sender.send(answer(-1), flags=FINAL)

    async def _send_to_waiting(self, value):
        for _ in range(3000):
            if self.waiting:
                break
            await asyncio.sleep(0.01)
        waiting, self.waiting = self.waiting, []
        for sender in waiting:
            sender.send(answer(value), flags=FINAL)

    async def execute(self, requests):
        out = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if value > 0:
                self._spawn(self._send_to_waiting(value))
                out.append(answer(value + 1))
                continue
            sender = request.get_response_sender()
            self.waiting.append(sender)
            self._spawn(self._fallback(sender))
            out.append(None)
        return out
'''


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sender_later")
    write_model(root, "relay", CONFIG.format(name="relay"), {"1/model.py": RELAY})
    write_model(root, "async_relay", CONFIG.format(name="async_relay"), {"1/model.py": ASYNC_RELAY})
    return root


def _client(protocol: str, url: str) -> tuple[Any, Any]:
    if protocol == "http":
        import tritonclient.http as module

        return module.InferenceServerClient(url, network_timeout=60.0, connection_timeout=60.0), module
    import tritonclient.grpc as module

    return module.InferenceServerClient(url), module


def _ask(protocol: str, url: str, model: str, value: int) -> Any:
    """OUT of one request, or the error's status and message."""
    from tritonclient.utils import InferenceServerException

    client, module = _client(protocol, url)
    tensor = module.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    try:
        return client.infer(model, [tensor]).as_numpy("OUT").tolist()
    except InferenceServerException as exc:
        return [exc.status(), exc.message()]


def _relayed(protocol: str, url: str, model: str) -> dict[str, Any]:
    """Request A waits on its sender; request B, sent while A waits, executes and has A answered with its value."""
    seen: dict[str, Any] = {}

    def ask(key: str, value: int) -> None:
        seen[key] = _ask(protocol, url, model, value)

    first = threading.Thread(target=ask, args=("A", 0))
    first.start()
    second = threading.Thread(target=ask, args=("B", 5))
    second.start()
    first.join(60)
    second.join(60)
    return seen


#: A is answered 5 by B's thread (or task): B executed while A waited; B answered 6 itself
RELAYED = {"A": [5], "B": [6]}


def _url(server: Any, protocol: str) -> str:
    return server.http_url if protocol == "http" else server.grpc_url


@pytest.mark.parametrize("model", ["relay", "async_relay"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_later_execute_runs_while_a_request_waits_on_its_sender(threaded_server: Any, repository: Path,
                                                                 protocol: str, model: str) -> None:
    server = threaded_server([repository], model_control_mode="explicit", load_models=(model,))
    assert _relayed(protocol, _url(server, protocol), model) == RELAYED
    # and again: nothing stayed behind
    assert _relayed(protocol, _url(server, protocol), model) == RELAYED
    stats = server.client("http").get_inference_statistics(model)["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 4
    assert stats["execution_count"] == 4


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_unload_answers_a_request_the_model_never_answered(threaded_server: Any, repository: Path,
                                                              monkeypatch: pytest.MonkeyPatch, protocol: str) -> None:
    _unload_answers_the_request_never_answered(threaded_server, repository, monkeypatch, protocol)


def _unload_answers_the_request_never_answered(threaded_server: Any, repository: Path,
                                               monkeypatch: pytest.MonkeyPatch, protocol: str) -> None:
    """One request waits on ``relay``'s sender for good, a later one runs meanwhile; the unload waits
    UNLOAD_GRACE_S (handed to an isolated child with its finalize) and answers the waiting request itself."""
    from serving_pod.backends import python_model

    monkeypatch.setattr(python_model, "UNLOAD_GRACE_S", 0.2)
    server = threaded_server([repository], model_control_mode="explicit", load_models=("relay",))
    url = _url(server, protocol)
    seen: list[Any] = []
    waiting = threading.Thread(target=lambda: seen.append(_ask(protocol, url, "relay", -1)))
    waiting.start()
    client = server.client("http")
    answered = _ask(protocol, url, "relay", 7)
    while answered == [8]:  # executed before the waiting request got to its execute
        answered = _ask(protocol, url, "relay", 7)
    assert answered == [108]  # executed while the other waits: the instance is free
    client.unload_model("relay")  # waits UNLOAD_GRACE_S for the answer, then gives the request its own
    waiting.join(45)
    status = "503" if protocol == "http" else "StatusCode.UNAVAILABLE"
    assert seen == [[status, "model 'relay' was unloaded before it sent a response through the response sender "
                             "of this request"]]
    assert not client.is_model_ready("relay")


@pytest.mark.slow  # live tritonserver: with -m slow
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_runs_a_later_execute_while_a_request_waits(repository: Path, protocol: str) -> None:
    """Side by side with Triton 2.51 (skipped where it cannot be had)."""
    from support.triton import running_triton

    with running_triton(repository, ["relay", "async_relay"]) as (http, grpc, _):
        url = f"127.0.0.1:{http if protocol == 'http' else grpc}"
        assert {model: _relayed(protocol, url, model) for model in ("relay", "async_relay")} == {
            "relay": RELAYED, "async_relay": RELAYED}
