"""Isolated python models (``FERRY_ISOLATED``) answering a request after ``execute`` returned None, through the
request's response sender, with one instance: the child posts the answer once the model sent it
(``python_stub.LATER``), so the instance is free meanwhile and a later request's ``execute`` runs and may be what
answers the first one, as in Triton 2.51 and as ``test_python_sender_later`` checks for in-process models (the child
held the instance until the answer came: the two requests waited on each other until the model's 20 s fallback).
Same cases over HTTP and gRPC, for a thread and for a task of an ``async def execute``; Triton's side is
``test_python_sender_later``'s (the same models: Triton has no isolated mode, every stub is a process).

Kept different on purpose, as in-process: a model that never answers leaves Triton's client waiting for good after an
unload; Ferry's child waits ``python_model.UNLOAD_GRACE_S``, then the request is answered ``UNAVAILABLE``. A child
that dies while it owes an answer fails that request with an error naming the exit code (Triton: the stub's
'Stub process ... is not healthy' for the requests in flight).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from support.server import write_model


def _in_process_cases() -> Any:
    """``test_python_sender_later`` (the same models and cases; test modules are not importable by name here)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_ferry_sender_later_cases",
                                                  Path(__file__).with_name("test_python_sender_later.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_cases = _in_process_cases()
ASYNC_RELAY, CONFIG, RELAY, RELAYED = _cases.ASYNC_RELAY, _cases.CONFIG, _cases.RELAY, _cases.RELAYED
_ask, _relayed, _url = _cases._ask, _cases._relayed, _cases._url

ISOLATED = 'parameters { key: "FERRY_ISOLATED" value { string_value: "true" } }\n'

#: IN 0: answered from a thread after 30 s; IN 9: answered 10 + 100 per request waiting, and where one waits the
#: process exits 3 from a thread soon after
CRASHER = '''
import os
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


def answer(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])


class TritonPythonModel:
    def initialize(self, args):
        self.waiting = 0

    def execute(self, requests):
        out = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if value == 9:
                if self.waiting:
                    threading.Timer(0.3, os._exit, args=(3,)).start()
                out.append(answer(10 + 100 * self.waiting))
                continue
            self.waiting += 1
            sender = request.get_response_sender()
            timer = threading.Timer(30, lambda: sender.send(answer(-1), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL))
            timer.daemon = True
            timer.start()
            out.append(None)
        return out
'''


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("isolated_sender_later")
    for name, source in (("relay", RELAY), ("async_relay", ASYNC_RELAY), ("crasher", CRASHER)):
        write_model(root, name, CONFIG.format(name=name) + ISOLATED, {"1/model.py": source})
    return root


@pytest.mark.parametrize("model", ["relay", "async_relay"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_later_execute_runs_while_a_request_waits_on_its_sender(threaded_server: Any, repository: Path,
                                                                 protocol: str, model: str) -> None:
    server = threaded_server([repository], model_control_mode="explicit", load_models=(model,))
    assert _relayed(protocol, _url(server, protocol), model) == RELAYED
    assert _relayed(protocol, _url(server, protocol), model) == RELAYED  # and again: nothing stayed behind
    stats = server.client("http").get_inference_statistics(model)["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 4
    assert stats["execution_count"] == 4


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_unload_answers_a_request_the_model_never_answered(threaded_server: Any, repository: Path,
                                                              monkeypatch: pytest.MonkeyPatch, protocol: str) -> None:
    _cases._unload_answers_the_request_never_answered(threaded_server, repository, monkeypatch, protocol)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_child_that_dies_fails_the_answer_it_owes(threaded_server: Any, repository: Path, protocol: str) -> None:
    server = threaded_server([repository], model_control_mode="explicit", load_models=("crasher",))
    url = _url(server, protocol)
    seen: list[Any] = []
    waiting = threading.Thread(target=lambda: seen.append(_ask(protocol, url, "crasher", 0)))
    waiting.start()
    for _ in range(100):  # until one runs while the other waits (not before it)
        if _ask(protocol, url, "crasher", 9) == [110]:
            break
        time.sleep(0.05)
    else:
        pytest.fail("no request ran while the first one waited on its sender")
    waiting.join(45)
    assert not waiting.is_alive()
    status, message = seen[0]
    assert status == ("500" if protocol == "http" else "StatusCode.INTERNAL")
    assert "stopped unexpectedly: exit code 3" in message
    time.sleep(0.5)
    assert _ask(protocol, url, "crasher", 9) == [10]  # a fresh child answers the next one
