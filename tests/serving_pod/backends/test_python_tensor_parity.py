"""``pb_utils.Tensor(name, array)`` with odd arguments, as NVIDIA Triton 2.51's stub takes them (checked side by side).

Triton's binding has one signature, ``Tensor(arg0: str, arg1: numpy.ndarray)``: anything else (a list, a scalar,
None, keywords) is pybind11's ``TypeError``; a dtype outside Triton's (unicode ``U`` arrays, complex, big-endian)
is ``TritonModelException: NumPy dtype is not supported.``; a non-contiguous array becomes a C-contiguous one; a
0-d array, an object array of str and a ``bytes`` name are taken. Each is a model's own error: the request goes on
(the model answers with the text here), nothing fails to load. Ferry is checked against Triton's recorded answers
(``EXPECTED``) by default, a live Triton under ``-m slow``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from support.server import write_model

CASES = [
    'pb_utils.Tensor("OUT", [1, 2, 3])',
    'pb_utils.Tensor("OUT", 5)',
    'pb_utils.Tensor("OUT", None)',
    'pb_utils.Tensor(name="OUT", numpy_array=np.array([1], np.int32))',
    'pb_utils.Tensor("OUT", np.array([1], np.int32), 3)',
    'pb_utils.Tensor(b"OUT", np.array([1], np.int32))',
    'pb_utils.Tensor("OUT", np.array(["a", "bc"]))',
    'pb_utils.Tensor("OUT", np.array([1, 2], ">i4"))',
    'pb_utils.Tensor("OUT", np.array([1 + 2j]))',
    'pb_utils.Tensor("OUT", np.array(["a", "bc"], dtype=object))',
    'pb_utils.Tensor("OUT", np.array(5, np.int32))',
    'pb_utils.Tensor("OUT", np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2])',
    'pb_utils.Tensor("OUT", np.matrix([[1, 2]], np.int32))',
]

MODEL = '''
import warnings

import numpy as np
import triton_python_backend_utils as pb_utils

CASES = %r


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            case = CASES[int(pb_utils.get_input_tensor_by_name(request, "CASE").as_numpy()[0])]
            outputs = []
            try:
                with warnings.catch_warnings():  # np.matrix's PendingDeprecationWarning
                    warnings.simplefilter("ignore")
                    tensor = eval(case)
            except Exception as exc:
                text = "%%s: %%s" %% (type(exc).__name__, exc)
            else:
                array = tensor.as_numpy()
                text = "%%s %%s %%s contiguous=%%s" %% (tensor.name(), array.dtype, array.shape,
                                                     array.flags["C_CONTIGUOUS"])
                outputs.append(tensor)
            outputs.append(pb_utils.Tensor("TEXT", np.array([text.encode()], dtype=np.object_)))
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
''' % (CASES,)

CONFIG = ('name: "tensors"\nbackend: "python"\nmax_batch_size: 0\n'
          'input [ { name: "CASE" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
          'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }, '
          '{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]\n')

_REFUSED = ("TypeError: __init__(): incompatible constructor arguments. The following argument types are supported:"
            "\n    1. c_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)\n\nInvoked with: ")
_DTYPE = "TritonModelException: NumPy dtype is not supported."

#: (the model's text, the OUT tensor the client gets as (datatype, shape, data) or None), case by case: Triton 2.51's
#: (recorded from a live Triton; the slow ``test_tritons_answers`` compares a live one with them)
EXPECTED = [
    (_REFUSED + "'OUT', [1, 2, 3]", None),
    (_REFUSED + "'OUT', 5", None),
    (_REFUSED + "'OUT', None", None),
    (_REFUSED + "kwargs: name='OUT', numpy_array=array([1], dtype=int32)", None),
    (_REFUSED + "'OUT', array([1], dtype=int32), 3", None),
    ("OUT int32 (1,) contiguous=True", ("INT32", [1], [1])),
    (_DTYPE, None),
    (_DTYPE, None),
    (_DTYPE, None),
    ("OUT object (2,) contiguous=True", ("BYTES", [2], ["a", "bc"])),
    ("OUT int32 () contiguous=True", ("INT32", [], [5])),
    ("OUT int32 (3, 2) contiguous=True", ("INT32", [3, 2], [0, 2, 4, 6, 8, 10])),
    ("OUT int32 (1, 2) contiguous=True", ("INT32", [1, 2], [1, 2])),
]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("python_tensors")
    write_model(root, "tensors", CONFIG, {"1/model.py": MODEL})
    return root


def _answers(http: str) -> list[tuple[str, Any]]:
    answers = []
    for case in range(len(CASES)):
        body = {"inputs": [{"name": "CASE", "datatype": "INT32", "shape": [1], "data": [case]}]}
        response = httpx.post(f"http://{http}/v2/models/tensors/infer", json=body, timeout=60)
        assert response.status_code == 200, response.text
        outputs = {o["name"]: o for o in response.json()["outputs"]}
        out = outputs.get("OUT")
        answers.append((outputs["TEXT"]["data"][0],
                        None if out is None else (out["datatype"], out["shape"], out["data"])))
    return answers


@pytest.fixture(scope="module")
def answers(repository: Path) -> list[tuple[str, Any]]:
    """Ferry's answers, one server for every case."""
    from support.server import ServerThread, make_options

    thread = ServerThread(make_options([repository]))
    try:
        return _answers(thread.start().http_url)
    finally:
        thread.stop()


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{i}" for i in range(len(CASES))])
def test_odd_tensor_arguments_are_taken_or_refused_as_in_triton(answers: list[tuple[str, Any]], case: int) -> None:
    assert answers[case] == EXPECTED[case], CASES[case]


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_tritons_answers(answers: list[tuple[str, Any]], repository: Path) -> None:
    """Side by side with Triton 2.51 (skipped where it cannot be had): ``EXPECTED`` are its answers, and Ferry's."""
    from support.triton import running_triton

    with running_triton(repository, ["tensors"]) as (http, _, _):
        triton = _answers(f"127.0.0.1:{http}")
    assert triton == EXPECTED == answers
