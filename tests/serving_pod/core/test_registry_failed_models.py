"""What a model whose load failed answers, and what an unload leaves of it, as NVIDIA Triton 2.51 answers (explicit
model control, HTTP and gRPC).

Recorded from Triton 2.51 (CPU, python backend) side by side with Ferry; Ferry is held to ``EXPECTED`` always, a live
Triton with ``-m slow``. Each differed before:

* a model whose version policy leaves no version folder (none at all, or only ``01``: Triton ignores a folder name
  with a leading zero) stays in Triton's life cycle with no version: its metadata and config answer 404 / NOT_FOUND
  ``Request for unknown model: '<m>' has no available versions`` (``... version 1 is not found`` for a version);
  Ferry answered ``is not found``, and read ``01`` as version 1, then refused the load for a missing ``1/model.py``.
  A model refused at Triton's repository poll, or an ensemble refused with its steps, is not held: ``is not found``.
* unloading a model whose version failed to load leaves that version's state and reason in the index (Triton releases
  READY versions only); Ferry listed it ``unloaded``.
* (strict) server readiness: a load Triton refuses before its life cycle holds the model (a config refused at the
  repository poll, an ensemble refused with its steps) leaves the server ready; a model held with no version, or a
  version that failed to load (unloaded since or not), holds readiness back. Ferry was not ready after any refused
  load, and ready again once a failed model was unloaded. (A model that fails at start-up holds readiness back in
  both: test_registry_poll_recovery.py.)
* a ``batch_input`` naming an input the model does not have fails each version (Triton's ``ValidateBatchIO``); Ferry
  loaded the model.
* a ``platform`` Triton does not know, or a config with neither backend nor platform beside no model file Triton
  knows, is refused at its repository poll: 500 / INTERNAL ``failed to load '<m>', failed to poll from model
  repository``; Ferry answered 400 / INVALID_ARGUMENT with its own words. Ferry now answers Triton's, then a colon and
  the reason in Triton's log line (``unexpected platform type '<p>' for <m>``, ``Invalid model name: Could not
  determine backend for model '<m>' ...``), as for every poll refusal (test_registry_load_refusals.py).

Kept different on purpose (not asserted here): a model directory with no version folder leaves Triton's index after
its failed load, where Ferry lists it with its reason (test_registry_load_refusals.py); a python ``model.py`` without
``TritonPythonModel`` fails in Ferry's words (``python model '<m>' does not define class TritonPythonModel``, Triton:
``AttributeError: module '1.model' has no attribute 'TritonPythonModel'``); one whose class has no ``execute`` is
refused at load (Triton loads it and fails each request); a version folder without ``model.py`` is refused at once
(Triton's load never ends: its stub waits).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from support.python_models import IDENTITY_MODEL, INITIALIZE_RAISES
from support.server import ensemble_config, write_model

_PY = IDENTITY_MODEL
_RAISES = INITIALIZE_RAISES.format(error='ValueError("boom")')
_IO = ('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
       'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')


def _config(name: str, extra: str = "", backend: str = 'backend: "python"') -> str:
    return f'name: "{name}"\n{backend}\nmax_batch_size: 4\n{_IO}{extra}\n'


def _repository(root: Path) -> Path:
    write_model(root, "no_ver", _config("no_ver"), versions=())
    write_model(root, "lead0", _config("lead0"), files={"01/model.py": _PY}, versions=())
    write_model(root, "ver_bad", _config("ver_bad"), files={"1/model.py": _RAISES})
    write_model(root, "batch_in", _config("batch_in", 'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "X" '
                                                      'data_type: TYPE_FP32 source_input: "NOPE" } ]'),
                files={"1/model.py": _PY})
    write_model(root, "plat", _config("plat", backend='platform: "python"'), files={"1/model.py": _PY})
    write_model(root, "nothing", _config("nothing", backend=""))  # no backend, platform or model file
    write_model(root, "ens_missing", ensemble_config("ens_missing", ["nothere"], max_batch_size=4,
                                                     ports=("INPUT0", "OUTPUT0")))
    return root


#: loaded in this order, each over HTTP then gRPC
LOADS = ("plat", "nothing", "ens_missing", "batch_in", "no_ver", "lead0", "ver_bad")
#: loaded over HTTP only: Triton answers a refused ensemble's later loads with its poll failure (a difference kept
#: on purpose, tests/serving_pod/core/test_registry_load_refusals.py)
ONCE = ("ens_missing",)
#: (model, version) whose metadata and config are asked after the loads
ASKED = (("no_ver", ""), ("no_ver", "1"), ("lead0", ""), ("ver_bad", ""), ("ver_bad", "1"), ("plat", ""),
         ("ens_missing", ""))


def answers(http_port: int, grpc_port: int) -> dict[str, Any]:
    base = f"http://127.0.0.1:{http_port}/v2"
    got: dict[str, Any] = {}
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        def over_grpc(method: str, request: Any) -> tuple[str, Any]:
            try:
                return "OK", json_format.MessageToDict(getattr(stub, method)(request, timeout=120))
            except grpc.RpcError as error:
                return error.code().name, error.details()

        for name in LOADS:
            response = httpx.post(f"{base}/repository/models/{name}/load", timeout=120)
            again = None if name in ONCE else over_grpc("RepositoryModelLoad",
                                                        pb.RepositoryModelLoadRequest(model_name=name))
            got[f"load {name}"] = (response.status_code, response.json().get("error") if response.content else None,
                                   again)
            got[f"server ready after {name}"] = httpx.get(f"{base}/health/ready", timeout=60).status_code
        for name, version in ASKED:
            path = f"{base}/models/{name}" + (f"/versions/{version}" if version else "")
            for what, route, method, request in (
                    ("metadata", path, "ModelMetadata", pb.ModelMetadataRequest(name=name, version=version)),
                    ("config", f"{path}/config", "ModelConfig", pb.ModelConfigRequest(name=name, version=version))):
                response = httpx.get(route, timeout=60)
                got[f"{what} {name} {version}"] = (response.status_code, response.json().get("error"),
                                                   over_grpc(method, request))

        def rows() -> list[dict[str, str]]:
            index = httpx.post(f"{base}/repository/index", timeout=60).json()
            return [{**row, "reason": _without_traceback(row["reason"])} for row in index
                    if row["name"] in ("ver_bad", "batch_in")]

        got["index"] = rows()
        got["unload ver_bad"] = httpx.post(f"{base}/repository/models/ver_bad/unload", timeout=120).status_code
        got["index after the unload"] = rows()
        got["server ready after the unload"] = httpx.get(f"{base}/health/ready", timeout=60).status_code
    return {key: _without_traceback(value) for key, value in got.items()}


def _without_traceback(value: Any) -> Any:
    """Triton's python errors carry the model's traceback (``\\n\\nAt:\\n  <file>(<line>): <function>\\n``); Ferry
    logs it instead (tests/serving_pod/test_model_control.py)."""
    if isinstance(value, str):
        return re.sub(r"\n\nAt:\n(?:  [^\n]*\n)+", "", value)
    if isinstance(value, (list, tuple)):
        return type(value)(_without_traceback(item) for item in value)
    return value


def _no_version(name: str) -> str:
    return f"load failed for model '{name}': at least one version must be available under the version policy of " \
           f"model '{name}'\n"


def _not_found(name: str, words: str = "is not found") -> tuple[int, str, tuple[str, str]]:
    message = f"Request for unknown model: '{name}' {words}"
    return 404, message, ("NOT_FOUND", message)


_BOOM = "Internal: ValueError: boom"
_BATCH_IN = "Invalid argument: unknown source input name 'NOPE' for batch_in"
_PLAT = "failed to load 'plat', failed to poll from model repository"
_NOTHING = "failed to load 'nothing', failed to poll from model repository"
_VER_BAD_1 = "Request for unknown model: 'ver_bad' version 1 is not at ready state"
_ENS = ("load failed for model 'ens_missing': ensemble ens_missing contains models that are not available or "
        "ambiguous: nothere\n")
#: Triton 2.51's answers to ``answers`` (``plat``'s load: Ferry adds the reason, see ``_ferry``)
EXPECTED: dict[str, Any] = {
    "load no_ver": (400, _no_version("no_ver"), ("INVALID_ARGUMENT", _no_version("no_ver"))),
    "load lead0": (400, _no_version("lead0"), ("INVALID_ARGUMENT", _no_version("lead0"))),
    "load ver_bad": (400, f"load failed for model 'ver_bad': version 1 is at UNAVAILABLE state: {_BOOM};\n",
                     ("INVALID_ARGUMENT", f"load failed for model 'ver_bad': version 1 is at UNAVAILABLE state: {_BOOM};\n")),
    "load batch_in": (400, f"load failed for model 'batch_in': version 1 is at UNAVAILABLE state: {_BATCH_IN};\n",
                      ("INVALID_ARGUMENT",
                       f"load failed for model 'batch_in': version 1 is at UNAVAILABLE state: {_BATCH_IN};\n")),
    "load plat": (500, _PLAT, ("INTERNAL", _PLAT)),
    "load nothing": (500, _NOTHING, ("INTERNAL", _NOTHING)),
    "load ens_missing": (400, _ENS, None),
    **{f"{what} no_ver ": _not_found("no_ver", "has no available versions") for what in ("metadata", "config")},
    **{f"{what} no_ver 1": _not_found("no_ver", "version 1 is not found") for what in ("metadata", "config")},
    **{f"{what} lead0 ": _not_found("lead0", "has no available versions") for what in ("metadata", "config")},
    **{f"{what} ver_bad ": _not_found("ver_bad", "has no available versions") for what in ("metadata", "config")},
    **{f"{what} ver_bad 1": (503, _VER_BAD_1, ("UNAVAILABLE", _VER_BAD_1)) for what in ("metadata", "config")},
    **{f"{what} plat ": _not_found("plat") for what in ("metadata", "config")},
    **{f"{what} ens_missing ": _not_found("ens_missing") for what in ("metadata", "config")},
    "index": [{"name": "batch_in", "version": "1", "state": "UNAVAILABLE", "reason": _BATCH_IN},
              {"name": "ver_bad", "version": "1", "state": "UNAVAILABLE", "reason": _BOOM}],
    **{f"server ready after {name}": 200 if name in ("plat", "nothing", "ens_missing") else 400 for name in LOADS},
    "unload ver_bad": 200,
    "index after the unload": [{"name": "batch_in", "version": "1", "state": "UNAVAILABLE", "reason": _BATCH_IN},
                               {"name": "ver_bad", "version": "1", "state": "UNAVAILABLE", "reason": _BOOM}],
    "server ready after the unload": 400,
}


def _ferry() -> dict[str, Any]:
    """``EXPECTED`` with Ferry's reason after Triton's words for the poll refusals (module docstring)."""
    plat = f"{_PLAT}: unexpected platform type 'python' for plat"
    nothing = (f"{_NOTHING}: Invalid model name: Could not determine backend for model 'nothing' with no backend in "
               "model configuration. Expected model name of the form 'model.<backend_name>'.")
    return {**EXPECTED, "load plat": (500, plat, ("INTERNAL", plat)),
            "load nothing": (500, nothing, ("INTERNAL", nothing))}


def test_failed_models_answer_as_nvidia_tritons(threaded_server, tmp_path: Path) -> None:
    server = threaded_server([_repository(tmp_path / "models")], model_control_mode="explicit")
    got = answers(server.server.http_port, server.server.grpc_port)
    assert {key: (value, _ferry().get(key)) for key, value in got.items() if value != _ferry().get(key)} == {}
    assert sorted(got) == sorted(EXPECTED)


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_triton_answers_failed_models_as_recorded(tmp_path: Path) -> None:
    from support.triton import running_triton

    with running_triton(_repository(tmp_path / "models"), []) as (http, grpc_port, _):
        got = answers(http, grpc_port)
    assert {key: (value, EXPECTED.get(key)) for key, value in got.items() if value != EXPECTED.get(key)} == {}
    assert sorted(got) == sorted(EXPECTED)
