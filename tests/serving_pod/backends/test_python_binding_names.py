"""An ``AttributeError`` a python model raises on a ``pb_utils`` object, as a client reads it, side by side with
NVIDIA Triton 2.51 (found running Triton's QA model ``response_sender_error``, which calls the response sender's
``close()``, a method Triton 2.51 does not have).

Triton's ``pb_utils`` classes are pybind11 bindings named ``c_python_backend_utils.<class>``, so the error a client
gets reads ``AttributeError: 'c_python_backend_utils.InferenceResponseSender' object has no attribute 'close'``;
Ferry said ``'InferenceResponseSender' object ...``. The model's own class of the same name keeps its plain name.
Over HTTP and gRPC, in the server's process and isolated (``FERRY_ISOLATED``).

Kept different on purpose: Triton appends the model's traceback (``\\n\\nAt:\\n  <server path>(line): execute``);
Ferry logs it (compared without it). Inside the model ``str(exc)``, ``type(obj).__module__`` and ``repr`` of
``pb_utils`` objects still name Ferry's modules (Triton: ``c_python_backend_utils``; its ``TritonError`` repr is
pybind11's ``<... object at 0x...>``, Ferry's says the message and code).
"""

from __future__ import annotations

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
ISOLATED = 'parameters { key: "FERRY_ISOLATED" value { string_value: "true" } }\n'

MODEL = '''
import triton_python_backend_utils as pb_utils


class Tensor:
    """the model's own class named like a binding"""


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            if mode == 0:
                request.get_response_sender().close()
            elif mode == 1:
                request.nope
            elif mode == 2:
                pb_utils.get_input_tensor_by_name(request, "IN").extra = 1
            elif mode == 3:
                pb_utils.InferenceResponse(error=pb_utils.TritonError("x")).error().nope
            else:
                Tensor().nope
        return [None] * len(requests)
'''

MODELS = ("names", "names_isolated")
PREFIX = "Failed to process the request(s) for model '{name}_0', message: AttributeError: "
#: Triton 2.51's messages (without its traceback), by IN
EXPECTED = {
    0: "'c_python_backend_utils.InferenceResponseSender' object has no attribute 'close'",
    1: "'c_python_backend_utils.InferenceRequest' object has no attribute 'nope'",
    2: "'c_python_backend_utils.Tensor' object has no attribute 'extra'",
    3: "'c_python_backend_utils.TritonError' object has no attribute 'nope'",
    4: "'Tensor' object has no attribute 'nope'",
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("binding_names")
    write_model(root, "names", CONFIG.format(name="names"), {"1/model.py": MODEL})
    write_model(root, "names_isolated", CONFIG.format(name="names_isolated") + ISOLATED, {"1/model.py": MODEL})
    return root


def _messages(protocol: str, url: str, model: str) -> dict[int, str]:
    """The error message of each mode, the traceback Triton appends left out."""
    from tritonclient.utils import InferenceServerException

    if protocol == "http":
        import tritonclient.http as module
    else:
        import tritonclient.grpc as module  # type: ignore[no-redef]
    client = module.InferenceServerClient(url)
    seen: dict[int, str] = {}
    for mode in EXPECTED:
        tensor = module.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([mode], np.int32))
        try:
            client.infer(model, [tensor])
            seen[mode] = "answered"
        except InferenceServerException as exc:
            seen[mode] = exc.message().split("\n\nAt:\n")[0]
    return seen


def _expected(model: str) -> dict[int, str]:
    return {mode: PREFIX.format(name=model) + text for mode, text in EXPECTED.items()}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_attribute_errors_name_the_binding_classes(threaded_server: Any, repository: Path, protocol: str,
                                                   model: str) -> None:
    server = threaded_server([repository], model_control_mode="explicit", load_models=(model,))
    url = server.http_url if protocol == "http" else server.grpc_url
    assert _messages(protocol, url, model) == _expected(model)


@pytest.mark.slow  # live tritonserver: with -m slow
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_triton_names_the_binding_classes(repository: Path, protocol: str) -> None:
    """Side by side with Triton 2.51 (skipped where it cannot be had; Triton ignores FERRY_ISOLATED)."""
    from support.triton import running_triton

    with running_triton(repository, ["names"]) as (http, grpc, _):
        url = f"127.0.0.1:{http if protocol == 'http' else grpc}"
        assert _messages(protocol, url, "names") == _expected("names")
