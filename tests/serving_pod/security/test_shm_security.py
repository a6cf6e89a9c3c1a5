"""Shared-memory security: every bad registration or tensor placement is refused with a clear error.

Out-of-bounds offsets and sizes (at registration and per tensor, for inputs and outputs), unregistered
regions, keys that try to leave /dev/shm (``..``, slashes, symlinks), objects shrunk after registration,
and the whole API refused while ``--allow-client-shm`` is false. After each refusal the server still serves.
"""

from __future__ import annotations

import os
import uuid

import httpx
import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from support.server import test_model_config, write_model

DATA = np.arange(8, dtype=np.float32).reshape(2, 4)


def _repo(tmp_path):
    write_model(tmp_path, "idt", test_model_config("idt"))
    return tmp_path


@pytest.fixture
def server(threaded_server, tmp_path):
    return threaded_server([_repo(tmp_path)], allow_client_shm=True)


@pytest.fixture
def region():
    handle = shm.create_shared_memory_region("r", f"/ferry_{uuid.uuid4().hex[:12]}", 64)
    shm.set_shared_memory_region(handle, [DATA])
    yield handle
    shm.destroy_shared_memory_region(handle)


def _still_serves(server) -> None:
    client, module = server.client("http"), server.module("http")
    infer_input = module.InferInput("INPUT0", [2, 4], "FP32")
    infer_input.set_data_from_numpy(DATA)
    np.testing.assert_array_equal(client.infer("idt", [infer_input]).as_numpy("OUTPUT0"), DATA)


def _infer_json(server, inputs_params: dict, outputs: list | None = None) -> httpx.Response:
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 4], "parameters": inputs_params}]}
    if outputs is not None:
        body["outputs"] = outputs
    return httpx.post(f"http://{server.http_url}/v2/models/idt/infer", json=body, timeout=30)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_shm_api_is_refused_unless_allowed(threaded_server, tmp_path, region, protocol):
    server = threaded_server([_repo(tmp_path)])  # --allow-client-shm defaults to false
    client = server.client(protocol)
    with pytest.raises(InferenceServerException, match="Client shared memory is disabled") as info:
        client.register_system_shared_memory("r", region._shm_key, 64)
    assert "--allow-client-shm=true" in str(info.value)
    with pytest.raises(InferenceServerException, match="Client shared memory is disabled"):
        client.unregister_system_shared_memory()
    status = client.get_system_shared_memory_status()
    assert (status if protocol == "http" else list(status.regions)) == []
    response = _infer_json(server, {"shared_memory_region": "r", "shared_memory_byte_size": 32})
    assert response.status_code == 404
    assert response.json() == {"error": "Unable to find shared memory region: 'r'"}
    _still_serves(server)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize(
    "offset, byte_size",
    [(0, 65), (60, 8), (64, 1), (0, 0), (2**63 - 1, 2)],
    ids=["size-past-end", "span-past-end", "offset-at-end", "empty", "overflow"],
)
def test_registration_outside_the_object_is_refused(server, region, protocol, offset, byte_size):
    client = server.client(protocol)
    with pytest.raises(InferenceServerException, match="failed to register shared memory region 'r': invalid args"):
        client.register_system_shared_memory("r", region._shm_key, byte_size, offset=offset)
    assert not server.engine.shm.regions
    _still_serves(server)


@pytest.mark.parametrize("key", ["/../etc/passwd", "/a/b", "..", "/", "/triton_python_backend_shm_region_1", "/nope_" + "x" * 8])
def test_keys_that_are_not_a_plain_shm_object_are_refused(server, key):
    client = server.client("http")
    with pytest.raises(InferenceServerException) as info:
        client.register_system_shared_memory("r", key, 8)
    assert "shared memory region" in str(info.value)
    assert not server.engine.shm.regions


def test_symlinked_key_is_refused(server, tmp_path):
    target = tmp_path / "secret"
    target.write_bytes(b"s" * 64)
    link = f"ferry_link_{uuid.uuid4().hex[:8]}"
    os.symlink(target, f"/dev/shm/{link}")
    try:
        with pytest.raises(InferenceServerException, match="Unable to open shared memory region"):
            server.client("http").register_system_shared_memory("r", "/" + link, 8)
    finally:
        os.unlink(f"/dev/shm/{link}")
    assert target.read_bytes() == b"s" * 64


@pytest.mark.parametrize(
    "params, status, message",
    [
        ({"shared_memory_region": "r", "shared_memory_byte_size": 32, "shared_memory_offset": 48}, 400,
         "Invalid offset + byte size for shared memory region: 'r'"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": 32, "shared_memory_offset": 64}, 400,
         "Invalid offset for shared memory region: 'r'"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": 2**62, "shared_memory_offset": 0}, 400,
         "Invalid offset + byte size for shared memory region: 'r'"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": 32, "shared_memory_offset": -8}, 400,
         "'shared_memory_offset' must be a non-negative integer"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": "32"}, 400,
         "'shared_memory_byte_size' must be a non-negative integer"),
        ({"shared_memory_region": "r"}, 400, "'shared_memory_byte_size' is required"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": 16}, 400,
         "input byte size mismatch for input 'INPUT0' for model 'idt'. Expected 32, got 16"),
        ({"shared_memory_region": "missing", "shared_memory_byte_size": 32}, 404,
         "Unable to find shared memory region: 'missing'"),
    ],
    ids=["span-past-end", "offset-at-end", "huge-size", "negative-offset", "size-not-int", "no-size",
         "size-mismatch", "unregistered"],
)
def test_bad_input_placements_are_refused(server, region, params, status, message):
    server.client("http").register_system_shared_memory("r", region._shm_key, 64)
    response = _infer_json(server, params)
    assert response.status_code == status
    assert message in response.json()["error"]
    _still_serves(server)


def test_bad_output_placements_are_refused_before_inference(server, region):
    server.client("http").register_system_shared_memory("r", region._shm_key, 64)
    body_input = {"shared_memory_region": "r", "shared_memory_byte_size": 32}
    for out_params, message in [
        ({"shared_memory_region": "r", "shared_memory_byte_size": 32, "shared_memory_offset": 40},
         "Invalid offset + byte size for shared memory region: 'r'"),
        ({"shared_memory_region": "gone", "shared_memory_byte_size": 32}, "Unable to find shared memory region"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": 32, "binary_data": True},
         "can't set both 'shared_memory_region' and 'binary_data'"),
    ]:
        response = _infer_json(server, body_input, [{"name": "OUTPUT0", "parameters": out_params}])
        assert response.status_code in (400, 404)
        assert message in response.json()["error"]
    stats = server.client("http").get_inference_statistics("idt")["model_stats"][0]
    assert int(stats["inference_stats"]["success"]["count"]) == 0  # refused before running the model
    _still_serves(server)


def test_object_shrunk_after_registration_is_an_error_not_a_crash(server):
    key = f"/ferry_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("r", key, 64)
    try:
        server.client("grpc").register_system_shared_memory("r", key, 64)
        os.truncate(f"/dev/shm{key}", 8)  # a hostile client shrinks the object (would SIGBUS a naive reader)
        response = _infer_json(server, {"shared_memory_region": "r", "shared_memory_byte_size": 32})
        assert response.status_code == 400
        assert "was truncated below its registered size" in response.json()["error"]
        _still_serves(server)
    finally:
        server.client("grpc").unregister_system_shared_memory()
        shm.destroy_shared_memory_region(handle)


def test_unknown_region_status_is_not_found(server):
    for protocol in ("http", "grpc"):
        with pytest.raises(InferenceServerException, match="Unable to find system shared memory region: 'nope'"):
            server.client(protocol).get_system_shared_memory_status("nope")
