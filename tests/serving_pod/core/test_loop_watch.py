"""The loop watch (``core/loop_watch.py``) names a model whose execution holds the event loop thread.

A python model forced onto the loop thread that sleeps 1.2 s per execution is reported once per execution, with
its name and the line where it waits; the same model on its own thread, and a quick model on the loop thread
answering many requests, are never reported. The request that held the loop is still answered. A BLS model
suspended on the loop thread is reported when it sleeps there, not while it waits 1.2 s for its call's answer
(the loop is free meanwhile).
"""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

from serving_pod.core import loop_watch
from support.python_models import execution_mode, in_out_config
from support.server import write_model

SLEEPER = '''
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if value[0] > 0:
                time.sleep(value[0] / 1000)  # held here
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value * 2)]))
        return responses
'''

#: calls ``sleeper_apart`` (on its thread) with IN (its answer takes IN ms, the loop free), or for a negative IN calls it with 0
#: and then sleeps -IN ms itself
BLS_SLEEPER = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            answer = pb_utils.InferenceRequest(
                model_name="sleeper_apart", requested_output_names=["OUT"],
                inputs=[pb_utils.Tensor("IN", np.maximum(value, 0))]).exec()
            if value[0] < 0:
                time.sleep(-value[0] / 1000)  # held here, suspended between calls
            responses.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "OUT")]))
        return responses
'''


@pytest.fixture
def server(threaded_server, tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(loop_watch, "INTERVAL_S", 0.2)
    for name, mode in (("sleeper_inline", "inline"), ("sleeper_apart", "thread")):
        write_model(tmp_path, name, in_out_config(name, 0, execution_mode(mode)), {"1/model.py": SLEEPER})
    write_model(tmp_path, "bls_inline", in_out_config("bls_inline", 0, execution_mode("inline")), {"1/model.py": BLS_SLEEPER})
    return threaded_server([tmp_path])


def _infer(server, model: str, value: int) -> list[int]:
    tensor = server.module("http").InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return server.client("http").infer(model, [tensor]).as_numpy("OUT").tolist()


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "ferry.loop" and r.levelno == logging.WARNING]


def test_a_model_holding_the_loop_thread_is_named_once_per_execution(server, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="ferry.loop")
    assert _infer(server, "sleeper_inline", 1200) == [2400]
    (warning,) = _warnings(caplog)
    assert warning.startswith("model 'sleeper_inline' has held the server's event loop thread for ")
    assert "set ferry_execution_mode to 'thread'" in warning
    assert "model.py" in warning and "time.sleep(value[0] / 1000)  # held here" in warning
    assert _infer(server, "sleeper_inline", 1200) == [2400]
    assert len(_warnings(caplog)) == 2  # the next execution is another call: reported too


def test_a_model_on_its_thread_or_quick_on_the_loop_is_not_named(server, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="ferry.loop")
    assert _infer(server, "sleeper_apart", 1200) == [2400]
    answers: list[list[int]] = []
    done = threading.Event()

    def quick() -> None:
        while not done.is_set():
            answers.append(_infer(server, "sleeper_inline", 0))

    worker = threading.Thread(target=quick)
    worker.start()
    try:
        done.wait(1.5)  # many quick executions on the loop thread, over several of the watch's looks
    finally:
        done.set()
        worker.join(10)
    assert len(answers) > 10 and all(answer == [0] for answer in answers)
    assert _warnings(caplog) == []


def test_a_suspended_execution_is_named_when_it_holds_the_loop_not_while_it_waits(server, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="ferry.loop")
    pool = server.engine.registry.get("bls_inline").pool
    assert pool._modes[0].inline and not pool.runs_inline(0)  # suspended on the loop thread
    assert _infer(server, "bls_inline", 1200) == [2400]  # waited 1.2 s for its call, the loop free
    assert _warnings(caplog) == []
    assert _infer(server, "bls_inline", -1200) == [0]  # then slept 1.2 s on the loop thread
    (warning,) = _warnings(caplog)
    assert warning.startswith("model 'bls_inline' has held the server's event loop thread for ")
    assert "time.sleep(-value[0] / 1000)  # held here, suspended between calls" in warning
