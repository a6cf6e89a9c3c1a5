"""``triton_python_backend_utils`` as a ``model.py`` sees it, next to NVIDIA Triton 2.51's (checked side by side).

A differential hunt ran the same calls in a model on both servers; these are the answers, the differences fixed
among them: ``requested_output_names()`` is a ``set`` (on a request ``execute`` gets and on a BLS request), a
``TritonError`` code is a member of Triton's ``__ErrorCode`` enum (equal to its number, but a bare number is no
code: pybind11's ``TypeError``), ``InferenceResponse`` refuses anything but a sequence of tensors and a
``TritonError`` where the model builds it, and ``auto_complete_config``'s ``ModelConfig`` words a refusal as Triton
does (checked against Triton's own ``triton_python_backend_utils.py``, which is pure Python), and
``TRITONSERVER_MEMORY_CPU`` / ``_GPU`` are members of Triton's ``MemoryType`` enum numbered CPU 1 and GPU 0 (Ferry had
bare numbers the other way round, CPU 0 and GPU 1), which ``PreferredMemory`` alone takes (a bare number is pybind11's
``TypeError``, as is a ``preferred_memory`` that is no ``PreferredMemory``). Likewise ``Logger.INFO``... are members of
``Logger.LogLevel`` and ``MetricFamily.COUNTER``... of ``MetricKind`` (Ferry: bare numbers, which ``Logger.log`` and
``MetricFamily`` took), ``Tensor.from_dlpack`` refuses other arguments as pybind11 does and words an unusable object
with the spaces of Triton's message, and ``request.trace()`` is an ``InferenceTrace``. Triton's answers are
recorded (``EXPECTED``, ``TRITONS_EDITS``): Ferry runs against them by default, Triton under ``-m slow``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from serving_pod.backends.pb_model_config import ModelConfig
from support.server import write_model

CALLS = [
    'type(r.requested_output_names()).__name__',
    'sorted(r.requested_output_names())',
    'type(pb_utils.InferenceRequest(model_name="m", requested_output_names=["a"], inputs=[])'
    '.requested_output_names()).__name__',
    'pb_utils.get_input_tensor_by_name(r, "MISSING")',
    '(r.correlation_id(), r.flags(), r.timeout(), r.request_id())',
    'pb_utils.get_output_config_by_name(self.config, "OUT")["data_type"]',
    'pb_utils.get_output_config_by_name(self.config, "NOPE")',
    '{k: v for k, v in self.args.items() if k not in ("model_config", "model_repository")}',
    'pb_utils.TritonError("x", 3)',
    'pb_utils.TritonError(None)',
    'pb_utils.TritonError("x", code=pb_utils.TritonError.NOT_FOUND).code()',
    'str(pb_utils.TritonError.INTERNAL)',
    '(pb_utils.TritonError("x").code() == 1, int(pb_utils.TritonError.CANCELLED))',
    'pb_utils.InferenceResponse(None)',
    'pb_utils.InferenceResponse("ab")',
    'pb_utils.InferenceResponse(["not a tensor"])',
    'pb_utils.InferenceResponse(error="not an error")',
    'pb_utils.InferenceResponse((pb_utils.Tensor("A", np.zeros(1)),)).output_tensors()[0].name()',
    '(str(pb_utils.TRITONSERVER_MEMORY_CPU), repr(pb_utils.TRITONSERVER_MEMORY_GPU), '
    'int(pb_utils.TRITONSERVER_MEMORY_CPU), pb_utils.TRITONSERVER_MEMORY_GPU == 0, '
    '{pb_utils.TRITONSERVER_MEMORY_CPU: "cpu"}.get(1), type(pb_utils.TRITONSERVER_MEMORY_CPU).__name__)',
    'pb_utils.PreferredMemory(1, 0)',
    'pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, "0")',
    '[n for n in dir(pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU)) if not n.startswith("_")]',
    'type(pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], '
    'preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0))).__name__',
    '(str(pb_utils.Logger.INFO), repr(pb_utils.Logger.WARNING), int(pb_utils.Logger.ERROR), '
    'type(pb_utils.Logger.INFO).__name__, pb_utils.Logger.INFO == 0, pb_utils.Logger.LogLevel.WARNING is '
    'pb_utils.Logger.WARNING)',
    'pb_utils.Logger.log("x", 0)',
    'pb_utils.Logger.log("x", level=pb_utils.Logger.WARNING)',
    '(str(pb_utils.MetricFamily.COUNTER), repr(pb_utils.MetricFamily.HISTOGRAM), int(pb_utils.MetricFamily.GAUGE), '
    'type(pb_utils.MetricFamily.COUNTER).__name__, {0: "c"}.get(pb_utils.MetricFamily.COUNTER))',
    'pb_utils.MetricFamily("k_z", "x", 0)',
    'pb_utils.MetricFamily(1, "x", pb_utils.MetricFamily.COUNTER)',
    'pb_utils.Tensor.from_dlpack("A", object())',
    'pb_utils.Tensor.from_dlpack("A")',
    'pb_utils.Tensor.from_dlpack(1, np.zeros(1))',
    'type(r.trace()).__name__',
    'refusal(r.get_response_sender().send, "x")',
    'refusal(r.get_response_sender().send, flags="1")',
]

MODEL = '''
import json
import re

import numpy as np
import triton_python_backend_utils as pb_utils

CALLS = %r


def refusal(call, *args, **kwargs):
    """What ``call(*args, **kwargs)`` raises, object addresses left out."""
    try:
        call(*args, **kwargs)
    except Exception as exc:
        return re.sub(" at 0x[0-9a-f]+", "", "%%s: %%s" %% (type(exc).__name__, exc))
    return "accepted"


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        self.config = json.loads(args["model_config"])

    def execute(self, requests):
        responses = []
        for r in requests:
            call = CALLS[int(pb_utils.get_input_tensor_by_name(r, "CALL").as_numpy()[0])]
            try:
                value = eval(call)
                text = "%%s:%%r" %% (type(value).__name__, value)
            except Exception as exc:
                text = "%%s: %%s" %% (type(exc).__name__, exc)
            answer = pb_utils.Tensor("OUT", np.array([text.encode()], np.object_))
            responses.append(pb_utils.InferenceResponse([answer]))
        return responses
''' % (CALLS,)

CONFIG = ('name: "calls"\nbackend: "python"\nmax_batch_size: 0\n'
          'input [ { name: "CALL" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
          'output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }, '
          '{ name: "OTHER" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')


def _refused(signature: str, given: str) -> str:
    return ("TypeError: __init__(): incompatible constructor arguments. The following argument types are supported:"
            f"\n    1. c_python_backend_utils.{signature}\n\nInvoked with: {given}")


def _function_refused(function: str, signature: str, given: str) -> str:
    return ("TypeError: " + function + "(): incompatible function arguments. The following argument types are "
            f"supported:\n    1. {signature}\n\nInvoked with: {given}")


_LOG = "(message: str, level: c_python_backend_utils.Logger.LogLevel = <LogLevel.INFO: 0>) -> None"
_FAMILY = "MetricFamily(name: str, description: str, kind: c_python_backend_utils.MetricKind)"
_FROM_DLPACK = "(self: str, arg0: object) -> c_python_backend_utils.Tensor"
_SEND = ("(self: c_python_backend_utils.InferenceResponseSender, response: c_python_backend_utils.InferenceResponse = "
         "None, flags: int = 0) -> None")
_ERROR = ("TritonError(message: str, code: c_python_backend_utils.TritonError.__ErrorCode = "
          "<__ErrorCode.INTERNAL: 1>)")
_RESPONSE = ("InferenceResponse(output_tensors: List[c_python_backend_utils.Tensor] = [], "
             "error: c_python_backend_utils.TritonError = None)")
_MEMORY = ("PreferredMemory(preferred_memory_type: triton::backend::python::PreferredMemory::MemoryType, "
           "preferred_device_id: int = 0)")

#: Triton 2.51's answers, call by call (recorded from a live Triton; the slow ``test_tritons_answers`` compares a live
#: one with them)
EXPECTED = [
    "str:'set'",
    "list:['OTHER', 'OUT']",
    "str:'set'",
    "NoneType:None",
    "tuple:(0, 0, 0, 'call-id')",
    "str:'TYPE_STRING'",
    "NoneType:None",
    "dict:{'model_instance_kind': 'CPU', 'model_instance_name': 'calls_0', 'model_instance_device_id': '0', "
    "'model_version': '1', 'model_name': 'calls'}",
    _refused(_ERROR, "'x', 3"),
    _refused(_ERROR, "None"),
    "__ErrorCode:<__ErrorCode.NOT_FOUND: 2>",
    "str:'__ErrorCode.INTERNAL'",
    "tuple:(True, 7)",
    _refused(_RESPONSE, "None"),
    _refused(_RESPONSE, "'ab'"),
    _refused(_RESPONSE, "['not a tensor']"),
    _refused(_RESPONSE, "kwargs: error='not an error'"),
    "str:'A'",
    "tuple:('MemoryType.TRITONSERVER_MEMORY_CPU', '<MemoryType.TRITONSERVER_MEMORY_GPU: 0>', 1, True, 'cpu', "
    "'MemoryType')",
    _refused(_MEMORY, "1, 0"),
    _refused(_MEMORY, "<MemoryType.TRITONSERVER_MEMORY_CPU: 1>, '0'"),
    "list:[]",
    "str:'InferenceRequest'",
    "tuple:('LogLevel.INFO', '<LogLevel.WARNING: 1>', 2, 'LogLevel', True, True)",
    _function_refused("log", _LOG, "'x', 0"),
    "NoneType:None",
    "tuple:('MetricKind.COUNTER', '<MetricKind.HISTOGRAM: 2>', 1, 'MetricKind', 'c')",
    _refused(_FAMILY, "'k_z', 'x', 0"),
    _refused(_FAMILY, "1, 'x', <MetricKind.COUNTER: 0>"),
    "TritonModelException: Provided tensor is not supported. Tensor must be a DLPack capsule         or have "
    "`__dlpack__` and `__dlpack_device__` attributes",  # sic: Triton's spaces
    _function_refused("from_dlpack", _FROM_DLPACK, "'A'"),
    _function_refused("from_dlpack", _FROM_DLPACK, "1, array([0.])"),
    "str:'InferenceTrace'",
    "str:" + repr(_function_refused("send", _SEND, "<c_python_backend_utils.InferenceResponseSender object>, 'x'")),
    "str:" + repr(_function_refused("send", _SEND, "<c_python_backend_utils.InferenceResponseSender object>; "
                                                   "kwargs: flags='1'")),
]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("python_api")
    write_model(root, "calls", CONFIG, {"1/model.py": MODEL})
    return root


def _answers(http: str) -> list[str]:
    answers = []
    for call in range(len(CALLS)):
        body = {"id": "call-id", "inputs": [{"name": "CALL", "datatype": "INT32", "shape": [1], "data": [call]}]}
        response = httpx.post(f"http://{http}/v2/models/calls/infer", json=body, timeout=60)
        assert response.status_code == 200, response.text
        answers.append(response.json()["outputs"][0]["data"][0])
    return answers


@pytest.fixture(scope="module")
def answers(repository: Path) -> list[str]:
    """Ferry's answers, one server for every call."""
    from support.server import ServerThread, make_options

    thread = ServerThread(make_options([repository]))
    try:
        return _answers(thread.start().http_url)
    finally:
        thread.stop()


@pytest.mark.parametrize("call", range(len(CALLS)), ids=[str(i) for i in range(len(CALLS))])
def test_a_model_sees_the_api_as_in_triton(answers: list[str], call: int) -> None:
    assert answers[call] == EXPECTED[call], CALLS[call]


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half (test_a_model_sees_the_api_as_in_triton) runs by default
def test_tritons_answers(answers: list[str], repository: Path) -> None:
    """Side by side with Triton 2.51 (skipped where it cannot be had): ``EXPECTED`` are its answers, and Ferry's."""
    from support.triton import running_triton

    with running_triton(repository, ["calls"]) as (http, _, _):
        triton = _answers(f"127.0.0.1:{http}")
    assert triton == EXPECTED == answers


def test_a_bls_request_refuses_a_preferred_memory_that_is_no_preferred_memory() -> None:
    """Triton 2.51: ``InferenceRequest(..., preferred_memory=1)`` is pybind11's constructor ``TypeError`` (its
    message shows object addresses, so only the kind is compared); Ferry took anything."""
    from serving_pod.backends import pb_utils

    with pytest.raises(TypeError, match="^__init__\\(\\): incompatible constructor arguments") as raised:
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], preferred_memory=1)
    assert str(raised.value).endswith("preferred_memory=1")


# --------------------------------------------------------------------------- auto_complete_config's ModelConfig

_BASE = {"name": "m", "max_batch_size": 0, "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
         "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}]}

#: edits a model's auto_complete_config makes: each on a fresh config, the result or the refusal compared
EDITS: dict[str, Callable[[Any], Any]] = {
    "batch": lambda c: c.set_max_batch_size(8),
    "input": lambda c: c.add_input({"name": "Z", "data_type": "TYPE_INT32", "dims": [1], "optional": True}),
    "same input": lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [2]}),
    "input dims": lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [3]}),
    "input type": lambda c: c.add_input({"name": "X", "data_type": "TYPE_INT32", "dims": [2]}),
    "input extra": lambda c: c.add_input({"name": "Z", "data_type": "TYPE_INT32", "dims": [1], "format": 1}),
    "input no type": lambda c: c.add_input({"name": "Z", "dims": [1]}),
    "input no dims": lambda c: c.add_input({"name": "Z", "data_type": "TYPE_INT32"}),
    "output extra": lambda c: c.add_output({"name": "W", "data_type": "TYPE_INT32", "dims": [1], "optional": True}),
    "output dims": lambda c: c.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}),
    "dynamic": lambda c: c.set_dynamic_batching(),
    "decoupled": lambda c: c.set_model_transaction_policy({"decoupled": True}),
    "policy extra": lambda c: c.set_model_transaction_policy({"decoupled": True, "other": 1}),
}


def _edited(model_config: type, edit: Callable[[Any], Any], base: dict[str, Any]) -> Any:
    config = model_config(json.dumps(base))
    try:
        edit(config)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return config.as_dict()


def test_model_config_words_refusals_as_triton() -> None:
    assert _edited(ModelConfig, EDITS["input extra"], _BASE) == (
        "ValueError: input 'Z' in auto-complete-config function for model 'm' contains property other than 'name', "
        "'data_type', 'dims' and 'optional'.")
    assert _edited(ModelConfig, EDITS["output extra"], _BASE) == (
        "ValueError: output 'W' in auto-complete-config function for model 'm' contains property other than "
        "'name', 'data_type' and 'dims'.")


def _tritons_utils() -> Any:
    from support.triton import triton_or_skip

    source = Path(triton_or_skip().path).parents[1] / "backends" / "python" / "triton_python_backend_utils.py"
    spec = importlib.util.spec_from_file_location("_tritons_python_backend_utils", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_SEQUENCE = {**_BASE, "sequence_batching": {}}


def _refused(reason: str) -> tuple[str, str]:
    return (f"ValueError: {reason}",) * 2


def _changed(**fields: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    return {**_BASE, **fields}, {**_SEQUENCE, **fields}


_IN = "in auto-complete-config function for model 'm'"
#: each of ``EDITS`` on (``_BASE``, ``_SEQUENCE``) through Triton 2.51's own ``triton_python_backend_utils.ModelConfig``
#: (``_edited``): recorded from the file in Triton's install; the slow ``test_tritons_own_model_config_as_recorded``
#: compares that file's answers with them
TRITONS_EDITS: dict[str, tuple[Any, Any]] = {
    "batch": _changed(max_batch_size=8),
    "input": _changed(input=[*_BASE["input"], {"name": "Z", "data_type": "TYPE_INT32", "dims": [1], "optional": True}]),
    "same input": (_BASE, _SEQUENCE),
    "input dims": _refused("model 'm', tensor 'X': the model expects dims [3] but the model configuration specifies "
                           "dims [2]"),
    "input type": _refused("unable to load model 'm', configuration expects datatype TYPE_FP32 for input 'X', model "
                           "provides TYPE_INT32"),
    "input extra": _refused(f"input 'Z' {_IN} contains property other than 'name', 'data_type', 'dims' and "
                            "'optional'."),
    "input no type": _refused(f"input 'Z' {_IN} is missing 'data_type' property."),
    "input no dims": _refused(f"input 'Z' {_IN} is missing 'dims' property."),
    "output extra": _refused(f"output 'W' {_IN} contains property other than 'name', 'data_type' and 'dims'."),
    "output dims": _refused("model 'm', tensor 'Y': the model expects dims [1] but the model configuration specifies "
                            "dims [2]"),
    "dynamic": ({**_BASE, "dynamic_batching": {}},
                "ValueError: Configuration specified scheduling_choice as 'sequence_batching', but auto-complete-config "
                "function for model 'm' tries to set scheduling_choice as 'dynamic_batching'"),
    "decoupled": _changed(model_transaction_policy={"decoupled": True}),
    "policy extra": _refused(f"model transaction property {_IN} contains property other than 'decoupled'."),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_model_config_edits_as_tritons_own(edit: str) -> None:
    """The same edits as through Triton 2.51's ``triton_python_backend_utils.ModelConfig`` (``TRITONS_EDITS``)."""
    for base, theirs in zip((_BASE, _SEQUENCE), TRITONS_EDITS[edit], strict=True):
        assert _edited(ModelConfig, EDITS[edit], base) == theirs


@pytest.mark.slow  # needs Triton's install (hundreds of MB) for one pure-Python file: the default suite uses the record
@pytest.mark.parametrize("edit", list(EDITS))
def test_tritons_own_model_config_as_recorded(edit: str) -> None:
    tritons = _tritons_utils().ModelConfig
    for base, theirs in zip((_BASE, _SEQUENCE), TRITONS_EDITS[edit], strict=True):
        assert _edited(tritons, EDITS[edit], base) == theirs
