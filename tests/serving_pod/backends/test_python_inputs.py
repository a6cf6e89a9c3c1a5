"""A python model's input arrays are its own, as under Triton: writable, and exportable with DLPack.

The engine hands the model read-only views of the request body (no copy on the way in). Triton's stub gives
models arrays they own, so models written for it may scale an input in place or pass it to a framework with
``to_dlpack`` (which numpy refuses for a read-only array). ``as_numpy`` and ``to_dlpack`` copy such a view
once. Checked with tritonclient over HTTP and gRPC, in the server process and isolated in a child.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving_pod.backends import pb_utils

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            array = x.as_numpy()
            array *= 2  # in place, as models written for Triton may
            exported = pb_utils.Tensor.from_dlpack("Y", x.to_dlpack())  # the same (scaled) data
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", exported.as_numpy() + 1)]))
        return responses
"""


def _config(name: str, isolated: bool) -> str:
    extra = 'parameters { key: "FERRY_ISOLATED" value { string_value: "true" } }\n' if isolated else ""
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
            'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]\n' + extra)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from support.server import ServerThread, make_options

    repo: Path = tmp_path_factory.mktemp("inputs_repo")
    for name, isolated in (("inplace", False), ("inplace_isolated", True)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(_config(name, isolated))
        (repo / name / "1" / "model.py").write_text(MODEL)
    thread = ServerThread(make_options([repo]))
    handle = thread.start()
    assert not handle.engine.startup_failures, handle.engine.startup_failures
    yield handle
    thread.stop()


@pytest.mark.parametrize("model", ["inplace", "inplace_isolated"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_writes_into_its_input_and_exports_it_with_dlpack(server: Any, protocol: str, model: str) -> None:
    module = server.module(protocol)
    x = np.array([1.5, -2.0, 3.0], np.float32)
    tensor = module.InferInput("X", [3], "FP32")
    tensor.set_data_from_numpy(x)
    result = server.client(protocol).infer(model, [tensor])
    np.testing.assert_array_equal(result.as_numpy("Y"), x * 2 + 1)


def test_a_read_only_view_is_copied_once_and_a_writable_array_never() -> None:
    view = np.frombuffer(np.arange(4, dtype=np.float32).tobytes(), np.float32)
    wrapped = pb_utils.Tensor._wrap("X", view, "FP32")
    first = wrapped.as_numpy()
    assert first is not view and first.flags.writeable and wrapped.as_numpy() is first
    np.testing.assert_array_equal(first, view)
    own = np.arange(3, dtype=np.int32)
    assert pb_utils.Tensor("Y", own).as_numpy() is own
