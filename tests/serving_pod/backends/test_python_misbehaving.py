"""Misbehaving ``model.py`` files fail their own load or requests with Triton's errors, never the server.

Found by running the same broken models on Ferry and NVIDIA Triton 2.51: a model that raises
``KeyboardInterrupt`` (or calls ``sys.exit()`` while it is imported or auto-completed) must not unwind
through the server's threads; misuse the backend detects is worded as Triton's stub words it; and
``pb_utils.Tensor`` refuses what Triton's binding refuses instead of inventing a BYTES scalar.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from serving_pod.backends import pb_utils
from serving_pod.backends.base import InstanceContext
from serving_pod.backends.python import PythonBackend
from serving_pod.core import errors
from serving_pod.core.types import InferRequest, InferResponse, Tensor

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""
# mode = INPUT0[0]: 0 echo, 1 KeyboardInterrupt, 2 too few responses, 3 a str for a response, 4 a tuple of responses,
# 5 one response, no list
MODES_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        mode = int(x[0])
        if mode == 1:
            raise KeyboardInterrupt()
        if mode == 2:
            return []
        if mode == 3:
            return ["hello" for _ in requests]
        answers = [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]) for _ in requests]
        if mode == 4:
            return tuple(answers)
        if mode == 5:
            return answers[0]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]) for _ in requests]
"""


def _write(tmp_path: Path, name: str, code: str, extra: str = "") -> Path:
    model_dir = tmp_path / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(CONFIG.format(name=name) + extra)
    (model_dir / "1" / "model.py").write_text(code)
    return model_dir


def _create(model_dir: Path, auto_complete: bool = False) -> Any:
    config = text_format.Parse((model_dir / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    backend = PythonBackend()
    if auto_complete:
        backend.auto_complete(config, model_dir, model_dir / "1")
    return backend.create_instance(InstanceContext(
        model_name=config.name, model_version="1", model_dir=model_dir, version_dir=model_dir / "1",
        config=config, name=f"{config.name}_0_0", kind="KIND_CPU", engine=None,
    ))


def _call(instance: Any, mode: int, count: int = 2) -> list[Any]:
    data = np.array([mode, 5], np.float32)
    return instance.execute([InferRequest("modes", "", [Tensor("INPUT0", "FP32", data)]) for _ in range(count)])


@pytest.fixture
def modes(tmp_path: Path) -> Any:
    instance = _create(_write(tmp_path, "modes", MODES_MODEL))
    yield instance
    instance.close()


def test_keyboard_interrupt_in_execute_fails_the_call_and_the_model_serves_on(modes: Any) -> None:
    results = _call(modes, 1)
    assert [type(r) for r in results] == [errors.InternalError] * 2
    assert results[0].message == "Failed to process the request(s) for model 'modes_0_0', message: KeyboardInterrupt: "
    assert all(isinstance(r, InferResponse) for r in _call(modes, 0))


@pytest.mark.parametrize(("mode", "detail"), [
    (2, "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
        "InferenceRequest(s) size is:2, and InferenceResponse(s) size is:0\n"),
    (3, "Expected an 'InferenceResponse' object in the execute function return list, found type '<class 'str'>'."),
    (4, "Expected a list in the execute return, found type '<class 'tuple'>'."),
    (5, "Expected a list in the execute return, found type '<class 'c_python_backend_utils.InferenceResponse'>'."),
])
def test_misuse_found_by_the_backend_is_worded_as_in_triton(modes: Any, mode: int, detail: str) -> None:
    """Triton: ``Failed to process the request(s) for model '<instance>', message: <detail>``, no exception type,
    for every request of the call. A tuple is no list for Triton 2.51's stub (recorded live; Ferry took it), and a
    type of its own is named as its binding names it."""
    expected = f"Failed to process the request(s) for model 'modes_0_0', message: {detail}"
    assert [getattr(r, "message", r) for r in _call(modes, mode)] == [expected] * 2


@pytest.mark.parametrize(("code", "where"), [
    ("import sys\nsys.exit(4)\n", "load"),
    ("class TritonPythonModel:\n    def initialize(self, args):\n        raise KeyboardInterrupt()\n"
     "    def execute(self, requests):\n        return None\n", "initialize"),
    ("import sys\nclass TritonPythonModel:\n    @staticmethod\n    def auto_complete_config(config):\n"
     "        sys.exit(5)\n    def execute(self, requests):\n        return None\n", "auto_complete_config"),
])
def test_exiting_while_loading_is_a_load_error(tmp_path: Path, code: str, where: str) -> None:
    model_dir = _write(tmp_path, "leaves", code)
    with pytest.raises(errors.ModelLoadError, match=r"(SystemExit: [45]|KeyboardInterrupt)"):
        _create(model_dir, auto_complete=True)


def test_tensor_refuses_none_a_str_and_a_non_str_name() -> None:
    """Triton's binding takes a str name and a numpy array, refused with pybind11's words (see
    test_python_tensor_parity for more); numpy would turn None or "hello" into a 0-d object array, sent to the
    client as a BYTES scalar the model never meant."""
    for value in (None, "hello", b"raw"):
        with pytest.raises(TypeError, match=r"(?s)incompatible constructor arguments.*Invoked with: 'OUTPUT0', "):
            pb_utils.Tensor("OUTPUT0", value)
    with pytest.raises(TypeError, match=r"Invoked with: 123, array\(\[0\., 0\.\], dtype=float32\)"):
        pb_utils.Tensor(123, np.zeros(2, np.float32))  # type: ignore[arg-type]
    with pytest.raises(pb_utils.TritonModelException, match="Tensor name cannot be an empty string"):
        pb_utils.Tensor("", np.zeros(2, np.float32))
