"""Model load with file overrides: files land only in a fresh temp model dir; traversal is refused."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from serving_pod.core.errors import InvalidArgumentError
from serving_pod.repository.overrides import materialize_override
from support.server import test_model_config, write_model

CONFIG = json.dumps({
    "name": "ov", "backend": "ferry_test", "max_batch_size": 8,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
})
ESCAPES = ["1/../../escaped.txt", "../escaped.txt", "/tmp/ferry_abs_escape.txt", "1/./x", "1//x", "1\\..\\x", ""]


@pytest.fixture
def server(threaded_server, tmp_path):
    repo = tmp_path / "repo"
    write_model(repo, "idt", test_model_config("idt"))
    return threaded_server([repo], model_control_mode="explicit", load_models=("idt",))


def _tmp_snapshot() -> set[str]:
    """Ferry's override directories in the temp folder (other processes' files there are not this test's)."""
    return {name for name in os.listdir(tempfile.gettempdir()) if name.startswith("ferry-override-")}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_override_loads_inside_a_fresh_directory(server, protocol):
    client, module = server.client(protocol), server.module(protocol)
    client.load_model("ov", config=CONFIG, files={"file:1/weights.bin": b"\x00\x01", "file:labels.txt": b"a\n"})
    infer_input = module.InferInput("INPUT0", [1, 4], "FP32")
    infer_input.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    assert client.infer("ov", [infer_input]).as_numpy("OUTPUT0").shape == (1, 4)
    directory = Path(server.engine._override_dirs["ov"])
    assert directory.name == "ov" and directory.parent.name.startswith("ferry-override-")
    assert (directory / "1" / "weights.bin").read_bytes() == b"\x00\x01"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("path", ESCAPES)
def test_paths_leaving_the_model_directory_are_refused(server, tmp_path, protocol, path):
    before = _tmp_snapshot()
    client = server.client(protocol)
    with pytest.raises(InferenceServerException, match="invalid file override") as info:
        client.load_model("ov", config=CONFIG, files={f"file:{path}": b"pwned"})
    # Triton 2.51's code and words (recorded live for 'file:../evil.py': it refuses such a path at its repository
    # poll), Ferry's reason after them
    assert str(info.value.status()) == {"http": "500", "grpc": "StatusCode.INTERNAL"}[protocol]
    assert info.value.message().startswith("failed to load 'ov', failed to poll from model repository: ")
    assert not os.path.exists("/tmp/ferry_abs_escape.txt")
    assert not list(Path(tempfile.gettempdir()).glob("escaped.txt"))
    assert _tmp_snapshot() - before == set()  # nothing left behind, not even the temp dir
    assert not server.engine.model_ready("ov")
    assert server.engine.model_ready("idt")  # the server keeps serving


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_override_without_config_creates_nothing(server, protocol):
    """Files without a config get Triton 2.51's poll failure (recorded live: INTERNAL 'failed to load ..., failed to
    poll from model repository'), Ferry's reason after it; nothing is written."""
    before = _tmp_snapshot()
    with pytest.raises(InferenceServerException) as info:
        server.client(protocol).load_model("ov", files={"file:1/x": b"x"})
    assert (str(info.value.status()), info.value.message()) == (
        {"http": "500", "grpc": "StatusCode.INTERNAL"}[protocol],
        "failed to load 'ov', failed to poll from model repository: a 'config' parameter is required with file "
        "overrides")
    assert _tmp_snapshot() - before == set()


@pytest.mark.parametrize("name", ["../evil", "a/b", "..", ""])
def test_model_names_that_are_paths_are_refused(name):
    with pytest.raises(InvalidArgumentError, match="invalid model name"):
        materialize_override(name, {"1/x": b"x"})


def test_file_and_folder_with_the_same_name_is_a_clear_error():
    with pytest.raises(InvalidArgumentError, match="invalid file override"):
        materialize_override("m", {"1": b"x", "1/model.onnx": b"y"})


def test_failed_override_load_leaves_nothing_behind(server):
    before = _tmp_snapshot()
    with pytest.raises(InferenceServerException):
        server.client("grpc").load_model("ov", config="{not json", files={"file:1/x": b"x"})
    assert _tmp_snapshot() - before == set()
    assert server.engine.model_ready("idt")
