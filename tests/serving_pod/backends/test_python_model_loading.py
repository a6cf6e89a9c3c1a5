"""Triton's model loading API from python models: ``pb_utils.load_model`` / ``unload_model`` / ``is_model_ready``.

``py_loader`` (data/) loads ``py_scale`` copies in ``initialize`` and, as request parameters say,
in ``execute`` (plain, with a config override, with a file override), runs BLS against them and
unloads them; every change is checked through tritonclient (repository index, model config). It
runs in the server process (on its instance's thread, and on the event loop thread, suspended at each call:
``core/suspend.py``) and isolated in its own process. Errors reach the model as
``TritonModelException`` with Triton's wording and fail only their request.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from support.python_models import install_python_model

SCALE_BY_10 = json.dumps({
    "name": "scale", "backend": "python", "max_batch_size": 0,
    "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
    "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}],
    "parameters": {"FACTOR": {"string_value": "10.0"}},
})
PLUS_100 = (
    "import triton_python_backend_utils as pb_utils\n\n\n"
    "class TritonPythonModel:\n"
    "    def execute(self, requests):\n"
    "        return [pb_utils.InferenceResponse([pb_utils.Tensor('Y', pb_utils.get_input_tensor_by_name(r, 'X')"
    ".as_numpy() + 100)]) for r in requests]\n"
)


#: where ``loader`` executes: its thread, its own process, or the loop thread (suspended at each engine call)
WHERE = {"in-process": {}, "isolated": {"FERRY_ISOLATED": "true"}, "on-loop": {"ferry_execution_mode": "inline"}}


def _repository(tmp_path: Any, *, where: str, load_on_init: bool) -> Any:
    install_python_model(tmp_path, "py_loader", "loader",
                         parameters={**WHERE[where], **({"LOAD_ON_INIT": "scale_init"} if load_on_init else {})})
    install_python_model(tmp_path, "py_scale", "scale")
    install_python_model(tmp_path, "py_scale", "scale_init")
    return tmp_path


def _call(client: Any, action: str, model: str, x: tuple[float, float] = (1, 2), **extra: str) -> tuple[list, bool]:
    """One request to ``loader``: (Y, READY) as the model answers them."""
    import tritonclient.http as httpclient

    tensor = httpclient.InferInput("X", [2], "FP32")
    tensor.set_data_from_numpy(np.array(x, np.float32))
    result = client.infer("loader", [tensor], parameters={"action": action, "model": model, **extra})
    return result.as_numpy("Y").tolist(), bool(result.as_numpy("READY")[0])


def _state(client: Any, name: str) -> str:
    rows = [row for row in client.get_model_repository_index() if row["name"] == name]
    return rows[0].get("state", "") if rows else "absent"


def _fails(client: Any, message: str, action: str, model: str, **extra: str) -> None:
    with pytest.raises(InferenceServerException) as failure:
        _call(client, action, model, **extra)
    assert f"TritonModelException: {message}" in str(failure.value)


@pytest.mark.parametrize("where", list(WHERE))
def test_a_model_loads_calls_and_unloads_another(threaded_server, tmp_path, where: str) -> None:
    repo = _repository(tmp_path, where=where, load_on_init=True)
    server = threaded_server([repo], model_control_mode="explicit", load_models=("loader",))
    client = server.client("http")
    assert _state(client, "scale_init") == "READY"  # loaded by loader's initialize
    assert _state(client, "scale") == ""  # in the repository, never loaded
    assert _call(client, "ready", "scale") == ([1, 2], False)

    assert _call(client, "load", "scale") == ([1, 2], True)
    assert _state(client, "scale") == "READY"
    assert _call(client, "infer", "scale", (3, 4)) == ([6, 8], True)  # BLS to it: FACTOR 2
    assert _call(client, "ready", "scale", version="1")[1] is True
    assert _call(client, "ready", "scale", version="2")[1] is False

    assert _call(client, "load", "scale", config=SCALE_BY_10) == ([1, 2], True)
    assert client.get_model_config("scale")["parameters"]["FACTOR"]["string_value"] == "10.0"
    assert _call(client, "infer", "scale", (3, 4))[0] == [30, 40]
    _call(client, "load", "scale", config=SCALE_BY_10, source=PLUS_100)  # files={"file:1/model.py": ...}
    assert _call(client, "infer", "scale", (3, 4))[0] == [103, 104]

    assert _call(client, "unload", "scale") == ([1, 2], False)
    assert _state(client, "scale") == "UNAVAILABLE"
    with pytest.raises(InferenceServerException, match="'scale'"):
        client.infer("scale", [])  # gone for clients too

    instance = "loader_0"
    _fails(client, f"Failed to load model: Failed to process the request for model '{instance}', message: "
                   "failed to load 'no_such_model', failed to poll from model repository", "load", "no_such_model")
    _fails(client, f"Failed to check model readiness: Failed to process the request for model '{instance}', "
                   "message: failed to get model version from specified version string 'abc' (details: stol), "
                   "version should be an integral value > 0", "ready", "scale", version="abc")
    assert _call(client, "unload", "no_such_model") == ([1, 2], False)  # Triton: not an error
    assert _call(client, "infer", "scale_init", (1, 1)) == ([2, 2], True)  # the server keeps serving

    _call(client, "unload", "loader")  # itself: does not wait for its own request to drain
    deadline = time.monotonic() + 30
    while _state(client, "loader") != "UNAVAILABLE" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _state(client, "loader") == "UNAVAILABLE"


def test_load_and_unload_are_refused_unless_model_control_is_explicit(threaded_server, tmp_path) -> None:
    server = threaded_server([_repository(tmp_path, where="in-process", load_on_init=False)])  # mode "none"
    client = server.client("http")
    for verb, action in (("load", "load"), ("unload", "unload")):
        _fails(client, f"Failed to {verb} model: Failed to process the request for model 'loader_0', message: "
                       "explicit model load / unload is not allowed if polling is enabled", action, "scale")
    assert _state(client, "scale") == "READY"
    assert _call(client, "infer", "scale", (2, 3)) == ([4, 6], True)
