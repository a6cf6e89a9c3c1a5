"""Poll mode: a model directory, or one version directory, removed from the repository and put back.

Recorded live side by side with tritonserver 2.51 (``--model-control-mode=poll --repository-poll-secs=1``, python
models, HTTP and gRPC):

- a model directory removed: the model unloads and leaves the repository index (no row at all, ready or not), while
  a request for it still finds it "has no available versions" (404 / NOT_FOUND), and for its version "is not at
  ready state" (503 / UNAVAILABLE), as Triton's life cycle keeps the name. Ferry listed it ``UNAVAILABLE``
  ``unloaded``;
- the directory put back (``shutil.copytree``: the files keep their old times): the model loads again and serves.
  Ferry never loaded it again: its poll compared the directory's signature with the one of the last load;
- one version directory removed while another stays: that version is listed ``UNAVAILABLE`` ``unloaded`` and a
  request for it finds it "is not at ready state" (503 / UNAVAILABLE). Ferry answered "is not found" (404 /
  NOT_FOUND) while another version was READY; put back, it serves again.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from support.server import test_model_config, wait_for, write_model

PROTOCOLS = ["http", "grpc"]
#: the status each protocol gives Triton's "has no available versions" and "is not at ready state"
NOT_FOUND = {"http": "404", "grpc": "StatusCode.NOT_FOUND"}
NOT_READY = {"http": "503", "grpc": "StatusCode.UNAVAILABLE"}


def _rows(handle: Any, protocol: str, name: str) -> list[dict[str, str]]:
    client = handle.client(protocol)
    if protocol == "grpc":
        rows = client.get_model_repository_index(as_json=True).get("models", [])
    else:
        rows = client.get_model_repository_index()
    return [row for row in rows if row["name"] == name]


def _infer(handle: Any, protocol: str, model: str, version: str = "") -> tuple[str | None, str]:
    """(None, the version that answered), or the error's (status, message)."""
    module = handle.module(protocol)
    tensor = module.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    try:
        result = handle.client(protocol).infer(model, [tensor], model_version=version)
    except InferenceServerException as error:
        return error.status(), error.message()
    return None, result.get_response(as_json=True)["model_version"] if protocol == "grpc" else \
        result.get_response()["model_version"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_removed_model_leaves_the_index_and_loads_again_when_put_back(
        threaded_server: Any, tmp_path: Path, protocol: str) -> None:
    repository = tmp_path / "repository"
    write_model(repository, "gone", test_model_config("gone"))
    write_model(repository, "stays", test_model_config("stays"))
    shutil.copytree(repository / "gone", tmp_path / "saved")
    server = threaded_server([repository], model_control_mode="poll", repository_poll_secs=0.1)
    client = server.client(protocol)
    assert _rows(server, protocol, "gone") == [{"name": "gone", "version": "1", "state": "READY"}]

    shutil.rmtree(repository / "gone")
    wait_for(lambda: not _rows(server, protocol, "gone"))
    assert not client.is_model_ready("gone") and client.is_server_ready() and client.is_model_ready("stays")
    assert _infer(server, protocol, "gone") == (
        NOT_FOUND[protocol], "Request for unknown model: 'gone' has no available versions")
    assert _infer(server, protocol, "gone", "1") == (
        NOT_READY[protocol], "Request for unknown model: 'gone' version 1 is not at ready state")

    shutil.copytree(tmp_path / "saved", repository / "gone")  # its files keep the times they had when loaded
    wait_for(lambda: client.is_model_ready("gone"))
    assert _rows(server, protocol, "gone") == [{"name": "gone", "version": "1", "state": "READY"}]
    assert _infer(server, protocol, "gone") == (None, "1")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_removed_version_is_not_at_ready_state(threaded_server: Any, tmp_path: Path, protocol: str) -> None:
    repository = tmp_path / "repository"
    write_model(repository, "multi", test_model_config("multi", extra="version_policy { all { } }"), versions=(1, 2))
    shutil.copytree(repository / "multi" / "2", tmp_path / "saved")
    server = threaded_server([repository], model_control_mode="poll", repository_poll_secs=0.1)
    client = server.client(protocol)

    shutil.rmtree(repository / "multi" / "2")
    wait_for(lambda: not client.is_model_ready("multi", "2"))
    assert _rows(server, protocol, "multi") == [
        {"name": "multi", "version": "1", "state": "READY"},
        {"name": "multi", "version": "2", "state": "UNAVAILABLE", "reason": "unloaded"}]
    assert _infer(server, protocol, "multi", "2") == (
        NOT_READY[protocol], "Request for unknown model: 'multi' version 2 is not at ready state")
    assert _infer(server, protocol, "multi") == (None, "1")

    shutil.copytree(tmp_path / "saved", repository / "multi" / "2")
    wait_for(lambda: client.is_model_ready("multi", "2"))
    assert _infer(server, protocol, "multi", "2") == (None, "2")
