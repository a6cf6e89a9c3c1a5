"""Python backend behaviours found by running NVIDIA Triton's own QA models (``qa/python_models``) on Ferry
and on Triton 2.51 side by side; each case here is our own minimal ``model.py`` for one difference fixed.

- A ``model.py`` importing a helper beside it relatively (``from . import helper``), as Triton imports
  ``<version>.model``, loads and serves (Ferry failed: "attempted relative import with no known parent package").
- A sibling imported while ``execute`` runs (``import helper`` in a function, ``unittest.main("model")`` in
  Triton's BLS QA models) is found in the model's version directory, which Triton keeps on ``sys.path``
  (Ferry: ``ModuleNotFoundError``); two models' helpers of the same name stay apart.
- A non-decoupled model answering through ``request.get_response_sender()``: a response followed by the
  final flag is the answer (Ferry kept the flag's ``None``: "returned no response"); a response sent before
  ``execute`` returns one wins over the returned one; a response sent after ``execute`` returned ``None``
  (from a thread, or a task of an ``async def execute``) is awaited (Ferry answered "returned no response").
- ``pb_utils`` arguments a model gets wrong, as Triton's binding refuses them: a ``None`` request id, model
  version or output name, a ``None`` correlation id, a negative timeout and a ``None`` log message are
  ``TypeError`` (Ferry accepted most, or raised TritonModelException); a ``None`` input tensor, an empty output
  name and a ``None`` output tensor are TritonModelException with Triton's words; parameters of the wrong type
  are refused with Triton's words (``bool/int/str, found type <class 'float'>``); and a request the model
  builds reads its parameters back as ``json.dumps`` wrote them (Ferry: compact).
- A model whose process dies in ``initialize`` fails its load with Triton's ``Internal: Stub process
  '<instance>' is not healthy.`` (Ferry: ``Invalid argument: failed to load python model ...``), followed
  by the exit status Ferry saw. (A model running in the server's process cannot be contained: ``FERRY_ISOLATED``.)
- BLS from ``initialize`` (or ``finalize``) is refused with Triton's ``BLS is only supported during the
  'execute' function.``, which fails the load (Ferry ran the call).

Kept different on purpose (Triton's behaviour is a hang, junk or leaks internals):

- A non-decoupled model that sends a response (no final flag), returns ``None``, then sends more from a
  thread: Triton's client waits forever; Ferry answers the first response.
- A non-decoupled ``execute`` that returns ``None`` without taking a response sender leaves Triton's client
  waiting forever; Ferry answers ``returned no response`` at once.
- An ``async def execute`` of a decoupled model that returns a value: Triton 2.51 hangs or ignores it; Ferry
  answers as for a synchronous one (``... the execute function must return None.``).
- Triton 2.51's binding has no ``InferenceResponse(parameters=...)`` (later Tritons do: Ferry takes it) and
  its ``Tensor.triton_dtype()`` raises ``TypeError`` (Ferry returns the type's number).
- A non-decoupled model that sends a response and, before ``execute`` returns, a second one: Triton answers
  a unary call ``expected a single response, got 2`` and a stream the first response; Ferry fails the request
  with the model's exception (``Non-decoupled model cannot send more than one response.``) on both.
- Triton appends the model's traceback (``\\n\\nAt:\\n  <server path>(line): function``) to the message a
  client gets for an exception raised in ``initialize``/``execute``; Ferry sends the exception alone and logs
  the traceback.
"""

from __future__ import annotations

import json
from collections.abc import Callable
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
'''

RELATIVE_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils

import absolute_helper
from . import relative_helper


class TritonPythonModel:
    def execute(self, requests):
        import lazy_helper  # a sibling imported while executing (as unittest.main("model") does)

        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array(
            [absolute_helper.VALUE + relative_helper.VALUE + lazy_helper.VALUE], np.int32))]) for _ in requests]
'''

LAZY_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        import lazy_helper  # the same name as the other model's helper: each model finds its own

        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([lazy_helper.VALUE], np.int32))])
                for _ in requests]
'''

BLS_IN_INITIALIZE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        request = pb_utils.InferenceRequest(model_name="relative", requested_output_names=["OUT"],
                                            inputs=[pb_utils.Tensor("IN", np.array([0], np.int32))])
        request.exec(decoupled=True)

    def execute(self, requests):
        return None
'''

SENDER_MODEL = '''
import asyncio
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def answer(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))])


class TritonPythonModel:
    """Non-decoupled, answering through a response sender: MODE 0 sends then closes, 1 sends then also
    returns a response, 2 sends from a thread after execute returned None, 3 sends without the final flag and
    returns a response as well."""

    def execute(self, requests):
        returned = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            if mode == 2:
                def later(sender=sender):
                    time.sleep(0.2)
                    sender.send(answer(3), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                threading.Thread(target=later, daemon=True).start()
                returned.append(None)
                continue
            sender.send(answer(1))
            if mode == 3:
                returned.append(answer(2))
                continue
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            returned.append(answer(2) if mode == 1 else None)
        return None if returned == [None] * len(requests) else returned
'''

ASYNC_SENDER_MODEL = '''
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Non-decoupled ``async def execute`` answering from a task that outlives it."""

    def initialize(self, args):
        self.tasks = set()

    async def execute(self, requests):
        async def later(sender):
            await asyncio.sleep(0.2)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([4], np.int32))]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        for request in requests:
            task = asyncio.create_task(later(request.get_response_sender()))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return None
'''

ARGUMENTS_MODEL = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def outcomes():
    t = [pb_utils.Tensor("IN", np.array([1], np.int32))]

    def request(**kwargs):
        arguments = {"model_name": "m", "inputs": t, "requested_output_names": ["OUT"], **kwargs}
        return pb_utils.InferenceRequest(**arguments)

    cases = [
        lambda: request(request_id=None), lambda: request(correlation_id=None), lambda: request(model_version=None),
        lambda: request(timeout=-1), lambda: request(requested_output_names=[None]), lambda: request(inputs=[None]),
        lambda: request(requested_output_names=[""]), lambda: pb_utils.InferenceResponse(output_tensors=[None]),
        lambda: pb_utils.Logger.log_info(None), lambda: request(parameters={"a": 1.5}),
        lambda: request(parameters={1: "a"}), lambda: request(parameters={"a": 1, "b": "x"}).parameters(),
    ]
    seen = []
    for case in cases:
        try:
            value = case()
            seen.append(value if isinstance(value, str) else "accepted")
        except TypeError:  # pybind11 words these by its signatures: the class is what a model can rely on
            seen.append("TypeError")
        except pb_utils.TritonModelException as exc:
            seen.append(f"TritonModelException: {exc}")
    return seen


class TritonPythonModel:
    def execute(self, requests):
        text = json.dumps(outcomes())
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text.encode()], np.object_))])
                for _ in requests]
'''

_EMPTY = "TritonModelException: {} for request with id '' and model name 'm' should not be empty."
ARGUMENTS = ["TypeError"] * 5 + [
    _EMPTY.format("Input tensor"), _EMPTY.format("Requested output name"),
    "TritonModelException: Output tensor for inference response should not be empty.", "TypeError",
    "TritonModelException: Expect parameters values to have type bool/int/str, found type <class 'float'>",
    "TritonModelException: Expect parameters keys to have type str, found type <class 'int'>",
    '{"a": 1, "b": "x"}',
]

CRASH_MODEL = '''
import os
import signal


class TritonPythonModel:
    def initialize(self, args):
        os.kill(os.getpid(), signal.SIGKILL)

    def execute(self, requests):
        return None
'''

#: a process of its own: Ferry runs it isolated (Triton ignores the parameter: every instance is a stub process)
ISOLATED = 'parameters { key: "FERRY_ISOLATED" value { string_value: "true" } }\n'
CRASHED = "version 1 is at UNAVAILABLE state: Internal: Stub process 'crash_0' is not healthy."

BLS_REFUSED = "TritonModelException: BLS is only supported during the 'execute' function."


def _repository(root: Path) -> Path:
    write_model(root, "relative", CONFIG.format(name="relative"), {
        "1/model.py": RELATIVE_MODEL, "1/absolute_helper.py": "VALUE = 40\n", "1/relative_helper.py": "VALUE = 2\n",
        "1/lazy_helper.py": "VALUE = 100\n"})
    write_model(root, "lazy", CONFIG.format(name="lazy"), {"1/model.py": LAZY_MODEL, "1/lazy_helper.py": "VALUE = 7\n"})
    write_model(root, "sender", CONFIG.format(name="sender"), {"1/model.py": SENDER_MODEL})
    write_model(root, "async_sender", CONFIG.format(name="async_sender"), {"1/model.py": ASYNC_SENDER_MODEL})
    write_model(root, "arguments", CONFIG.format(name="arguments").replace('"OUT" data_type: TYPE_INT32',
                                                                          '"OUT" data_type: TYPE_STRING'),
                {"1/model.py": ARGUMENTS_MODEL})
    write_model(root, "crash", CONFIG.format(name="crash") + ISOLATED, {"1/model.py": CRASH_MODEL})
    write_model(root, "bls_in_initialize", CONFIG.format(name="bls_in_initialize"),
                {"1/model.py": BLS_IN_INITIALIZE})
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _repository(tmp_path_factory.mktemp("qa_parity"))


def _ask(client: Any, module: Any, name: str, mode: int = 0) -> Any:
    tensor = module.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([mode], np.int32))
    return client.infer(name, [tensor]).as_numpy("OUT").tolist()


def _imports(client: Any, module: Any) -> list[Any]:
    client.load_model("relative")
    client.load_model("lazy")
    return [_ask(client, module, name) for name in ("relative", "lazy", "relative")]


def _senders(client: Any, module: Any) -> list[Any]:
    client.load_model("sender")
    client.load_model("async_sender")
    return [_ask(client, module, name, mode)
            for name, mode in (("sender", 0), ("sender", 1), ("sender", 2), ("async_sender", 0))]


def _sent_twice(client: Any, module: Any) -> str:
    """A response sent without the final flag and another returned: the request fails (Triton 2.51's HTTP answer is
    a 500 whose body is the sent response, which its client cannot read as an error: any exception counts)."""
    client.load_model("sender")
    try:
        return repr(_ask(client, module, "sender", 3))
    except Exception:  # noqa: BLE001 - which one depends on the protocol and the server, as said above
        return "failed"


def _arguments(client: Any, module: Any) -> list[str]:
    client.load_model("arguments")
    return json.loads(_ask(client, module, "arguments")[0])


def _refused(client: Any, model: str, expected: str) -> list[Any]:
    """Loading ``model`` fails with ``expected`` in its message, and the model is not ready."""
    from tritonclient.utils import InferenceServerException

    try:
        client.load_model(model)
    except InferenceServerException as exc:
        seen = expected if expected in exc.message() else exc.message()
    else:
        seen = "loaded"
    return [seen, client.is_model_ready(model)]


#: each behaviour: what a client sees, and what Triton 2.51 shows
CASES: dict[str, tuple[Callable[[Any, Any], Any], Any]] = {
    "imports": (_imports, [[142], [7], [142]]),
    # a sent response wins over a returned one; one sent after execute returned is the answer
    "senders": (_senders, [[1], [1], [3], [4]]),
    # a response sent without the final flag and another returned: the request fails (Ferry answered the sent one)
    "sent_twice": (_sent_twice, "failed"),
    "arguments": (_arguments, ARGUMENTS),
    "bls_in_initialize": (lambda client, _: _refused(client, "bls_in_initialize", BLS_REFUSED), [BLS_REFUSED, False]),
    "crash": (lambda client, _: _refused(client, "crash", CRASHED), [CRASHED, False]),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_qa_behaviour_matches_triton(threaded_server: Any, repository: Path, protocol: str, case: str) -> None:
    server = threaded_server([repository], model_control_mode="explicit")
    ask, expected = CASES[case]
    assert ask(server.client(protocol), server.module(protocol)) == expected


@pytest.mark.parametrize(("protocol", "status"), [("http", "500"), ("grpc", "StatusCode.INTERNAL")])
def test_a_response_sent_and_another_returned_fail_the_request(
    threaded_server: Any, repository: Path, protocol: str, status: str
) -> None:
    """Recorded from Triton 2.51: its stub refuses the returned response (non-decoupled, one sent already without
    the final flag) and gRPC answers INTERNAL 'expected a single response, got 2'; HTTP a 500 (whose body is the
    sent response there: Ferry words the error as gRPC does). Ferry answered 200 with the sent response."""
    from tritonclient.utils import InferenceServerException

    server = threaded_server([repository], model_control_mode="explicit")
    client, module = server.client(protocol), server.module(protocol)
    client.load_model("sender")
    with pytest.raises(InferenceServerException) as raised:
        _ask(client, module, "sender", 3)
    assert (raised.value.status(), raised.value.message()) == (status, "expected a single response, got 2")
    assert _ask(client, module, "sender", 0) == [1]


def test_isolated_instances_behave_the_same(threaded_server: Any, tmp_path: Path) -> None:
    """Each instance in its own process (``FERRY_ISOLATED``): the same answers."""
    import tritonclient.http as httpclient

    root = _repository(tmp_path)
    for config in root.glob("*/config.pbtxt"):
        if ISOLATED not in config.read_text():
            config.write_text(config.read_text() + ISOLATED)
    server = threaded_server([root], model_control_mode="explicit")
    seen = {case: ask(server.client("http"), httpclient) for case, (ask, _) in CASES.items()}
    assert seen == {case: expected for case, (_, expected) in CASES.items()}


@pytest.mark.slow  # live tritonserver: with -m slow
def test_the_same_models_answer_the_same_on_nvidia_triton(threaded_server: Any, repository: Path) -> None:
    """Side by side with Triton 2.51 (skipped where it cannot be had)."""
    import tritonclient.http as httpclient

    from support.triton import running_triton

    with running_triton(repository, []) as (http, _, _):
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http}", network_timeout=60.0)
        triton = {case: ask(client, httpclient) for case, (ask, _) in CASES.items()}
    server = threaded_server([repository], model_control_mode="explicit")
    ferry = {case: ask(server.client("http"), httpclient) for case, (ask, _) in CASES.items()}
    assert ferry == triton == {case: expected for case, (_, expected) in CASES.items()}
