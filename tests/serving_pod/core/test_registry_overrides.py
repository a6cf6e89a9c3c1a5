"""Loads with a ``config`` override, then without one, as NVIDIA Triton 2.51 answers them (repository extension).

Checked against Triton 2.51 (CPU, python backend) over HTTP: a model whose first load carried a config override reads
its repository files again at the next load without one; a model loaded from its repository before (even unloaded
since) keeps the override at a later load without one, until a file of it is newer. Ferry kept the override of a
model first loaded with one. Ferry runs the same sequence over gRPC too. Triton's answers are recorded in
``EXPECTED``: Ferry runs against them by default, Triton in a slow test.

Differences kept on purpose (Ferry's clearer behaviour), not compared here:

* an override Triton refuses before any version loads (a name that is not the model's, JSON that does not parse or
  names an unknown field): both answer 500 "failed to load '<m>', failed to poll from model repository"; Ferry adds
  ``: <the reason>``. A ``config`` that is not a string: Triton 500 "attempt to access JSON non-string as string",
  Ferry 400 "invalid value type for load parameter 'config', expected a string".
* ``file:`` overrides: Triton ignores them without a ``config`` ("failed to poll", 500), decodes bad base64 into junk
  bytes, and answers "failed to poll" to a path with ``..`` or "at least one version must be available" to an
  absolute one; its load of an override without the backend's model file never ends. Ferry refuses each with 400
  and the reason.
* a model loaded only from file overrides: Triton's repository index does not list it, READY or unloaded; Ferry's
  lists it with its versions' states.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.server import ServerThread, make_options, test_model_config, write_model

PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            request, "INPUT0").as_numpy())]) for request in requests]
'''


def _override(backend: str, max_batch_size: int) -> str:
    return json.dumps({"backend": backend, "max_batch_size": max_batch_size,
                       "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
                       "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]})


def _sequence(load: Callable[..., None], unload: Callable[[str], None], served: Callable[[str], int],
              backend: str) -> dict[str, int]:
    """max_batch_size served after each step (the repository's config says 8)."""
    answers: dict[str, int] = {}
    load("first", _override(backend, 4))
    answers["first loaded with an override"] = served("first")
    load("first")
    answers["then without"] = served("first")
    load("second")
    unload("second")
    time.sleep(0.05)
    load("second", _override(backend, 4))
    answers["loaded, unloaded, with an override"] = served("second")
    load("second")
    answers["then without "] = served("second")
    load("second", _override(backend, 3))
    load("second")
    answers["another override, then without"] = served("second")
    return answers


#: max_batch_size served after each step of ``_sequence``, as Triton 2.51 answers (over HTTP with python models)
EXPECTED = {"first loaded with an override": 4, "then without": 8, "loaded, unloaded, with an override": 4,
            "then without ": 4, "another override, then without": 3}


def test_an_override_first_load_reads_the_repository_again_after(threaded_server: Any, tmp_path: Path) -> None:
    """Over gRPC: the sequence above, as Triton answers it (Ferry served 4 again where Triton reads 8)."""
    for name in ("first", "second"):
        write_model(tmp_path, name, test_model_config(name))
    server = threaded_server([tmp_path], model_control_mode="explicit")
    client = server.client("grpc")

    def load(name: str, config: str | None = None) -> None:
        client.load_model(name, config=config)

    answers = _sequence(load, client.unload_model, lambda name: client.get_model_config(name).config.max_batch_size,
                        "ferry_test")
    assert answers == EXPECTED


def _http_steps(port: int) -> tuple[Callable[..., None], Callable[[str], None], Callable[[str], int]]:
    base = f"http://127.0.0.1:{port}/v2"

    def load(name: str, config: str | None = None) -> None:
        body = {"parameters": {"config": config}} if config is not None else {}
        response = httpx.post(f"{base}/repository/models/{name}/load", json=body, timeout=60)
        assert response.status_code == 200, response.text

    def unload(name: str) -> None:
        assert httpx.post(f"{base}/repository/models/{name}/unload", timeout=60).status_code == 200

    def served(name: str) -> int:
        return httpx.get(f"{base}/models/{name}/config", timeout=60).json()["max_batch_size"]

    return load, unload, served


def _python_repository(path: Path) -> Path:
    for name in ("first", "second"):
        config = (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
                  'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                  'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
        write_model(path, name, config, files={"1/model.py": PY})
    return path


def test_override_then_plain_loads_match_nvidia_tritons(tmp_path: Path) -> None:
    """Over HTTP with python models, as Triton 2.51 answers them (``EXPECTED``)."""
    thread = ServerThread(make_options([_python_repository(tmp_path)], model_control_mode="explicit"))
    handle = thread.start()
    try:
        got = _sequence(*_http_steps(handle.server.http_port), "python")
    finally:
        thread.stop()
    assert got == EXPECTED


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_nvidia_triton_override_then_plain_loads_as_recorded(tmp_path: Path) -> None:
    from support.triton import running_triton

    with running_triton(_python_repository(tmp_path), []) as (http, _, _):
        assert _sequence(*_http_steps(http), "python") == EXPECTED
