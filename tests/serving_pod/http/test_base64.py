"""Base64 fields of HTTP requests read as Triton reads them (libb64): line breaks are skipped.

perf_analyzer and the other C++ clients encode with libb64, which breaks lines every 72 characters; the CUDA
shared memory ``raw_handle`` of ``perf_analyzer --shared-memory cuda`` over HTTP arrived that way and was
refused as "not valid base64". Covered: the decoder, a model load whose ``file:`` override is wrapped, and
the CUDA registration route (wrapped: past the decoding; a character outside the alphabet: 400).
"""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest

from serving_pod.core.errors import InvalidArgumentError
from serving_pod.http.codec import decode_base64

MODEL = b"""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 3)])
                for r in requests]
"""
CONFIG = {"name": "tripled", "backend": "python", "max_batch_size": 0,
          "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
          "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}]}


def _libb64(data: bytes) -> str:
    """What libb64's encoder writes: 72 characters a line, and a final newline."""
    text = base64.b64encode(data).decode()
    return "".join(text[i:i + 72] + "\n" for i in range(0, len(text), 72))


def test_line_breaks_and_spaces_are_skipped_and_other_characters_refused() -> None:
    data = bytes(range(256)) * 3
    assert "\n" in _libb64(data)[:-1]
    assert decode_base64(_libb64(data), "field") == data
    assert decode_base64(" " + base64.b64encode(b"ab").decode() + "\r\n", "field") == b"ab"
    for bad in ("YW!i", "YWJjZ", "YW\x00Jj", "YQ=a"):
        with pytest.raises(InvalidArgumentError, match="^field is not valid base64$"):
            decode_base64(bad, "field")


@pytest.mark.parametrize(("text", "data"), [("YQ", b"a"), ("YQ=", b"a"), ("YWJ", b"ab"), ("YWJj", b"abc"),
                                            ("YWJjZA", b"abcd"), ("YW\nJj\nZA", b"abcd")])
def test_the_final_padding_may_be_left_off(text: str, data: bytes) -> None:
    """libb64 decodes a last group of two or three characters without its ``=`` padding: Triton 2.51 loaded a
    ``file:1/model.py`` override of "YQ" as the one-byte file "a" (recorded live), where Ferry answered 400 "load
    parameter 'file:1/model.py' is not valid base64". One character left over ("YWJjZ") is still refused."""
    assert decode_base64(text, "field") == data


def test_a_load_with_a_wrapped_file_override_serves_it(threaded_server, tmp_path) -> None:
    server = threaded_server([tmp_path], model_control_mode="explicit")
    url = f"http://{server.http_url}"
    parameters = {"config": json.dumps(CONFIG), "file:1/model.py": _libb64(MODEL)}
    response = httpx.post(f"{url}/v2/repository/models/tripled/load", json={"parameters": parameters}, timeout=60)
    assert response.status_code == 200, response.text
    client = server.client("http")
    tensor = server.module("http").InferInput("X", [2], "FP32")
    tensor.set_data_from_numpy(np.array([1.0, 2.0], np.float32))
    np.testing.assert_array_equal(client.infer("tripled", [tensor]).as_numpy("Y"), [3.0, 6.0])
    parameters["file:1/model.py"] = base64.b64encode(MODEL.replace(b"* 3", b"* 4")).decode().rstrip("=")  # unpadded
    assert len(parameters["file:1/model.py"]) % 4
    response = httpx.post(f"{url}/v2/repository/models/tripled/load", json={"parameters": parameters}, timeout=60)
    assert response.status_code == 200, response.text
    np.testing.assert_array_equal(client.infer("tripled", [tensor]).as_numpy("Y"), [4.0, 8.0])
    parameters["file:1/model.py"] = "!!" + _libb64(MODEL)
    response = httpx.post(f"{url}/v2/repository/models/tripled/load", json={"parameters": parameters}, timeout=60)
    assert response.status_code == 400
    assert response.json() == {"error": "load parameter 'file:1/model.py' is not valid base64"}


def test_cuda_registration_reads_a_wrapped_handle(threaded_server, tmp_path) -> None:
    server = threaded_server([tmp_path], allow_client_shm=True)
    url = f"http://{server.http_url}/v2/cudasharedmemory/region/r/register"
    body = {"raw_handle": {"b64": _libb64(b"\x01" * 64)}, "device_id": 0, "byte_size": 64}
    wrapped = httpx.post(url, json=body, timeout=30)
    assert "base64" not in wrapped.text  # decoded: refused later (no GPU here; no such handle on a GPU)
    assert wrapped.status_code in (400, 501), wrapped.text
    body["raw_handle"]["b64"] = "@" + body["raw_handle"]["b64"]
    bad = httpx.post(url, json=body, timeout=30)
    assert bad.status_code == 400
    assert bad.json() == {"error": "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"}  # Triton's
