"""A model repository on a real local S3 server (moto's ThreadedMotoServer on 127.0.0.1): load, serve, re-poll."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from support.s3 import moto_endpoint

from serving_pod.repository.cloud import CloudRoot
from support.server import test_model_config


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    with moto_endpoint() as endpoint:
        yield endpoint


@pytest.fixture
def s3(s3_server, monkeypatch, request):
    import boto3

    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "S3_ENDPOINT", "S3_USE_HTTPS", "AWS_ANONYMOUS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = boto3.client("s3", endpoint_url=f"http://{s3_server}", region_name="us-east-1")
    bucket = "repo-" + request.node.name.lower().replace("_", "-")[:40]
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="models/idt/config.pbtxt", Body=test_model_config("idt").encode())
    client.put_object(Bucket=bucket, Key="models/idt/1/weights.bin", Body=b"w1")
    client.put_object(Bucket=bucket, Key="models/README.md", Body=b"top-level files are not models")
    return client, bucket


def _infer(server, model: str, width: int) -> np.ndarray:
    client, module = server.client("http"), server.module("http")
    data = np.arange(width, dtype=np.float32).reshape(1, width)
    infer_input = module.InferInput("INPUT0", [1, width], "FP32")
    infer_input.set_data_from_numpy(data)
    return client.infer(model, [infer_input]).as_numpy("OUTPUT0")


def _wait(condition, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_s3_repository_loads_serves_and_repolls(s3, s3_server, threaded_server):
    client, bucket = s3
    uri = f"s3://{s3_server}/{bucket}/models"  # Triton's s3://host:port/bucket/path form
    server = threaded_server([uri], model_control_mode="poll", repository_poll_secs=0.2)
    assert _infer(server, "idt", 4).shape == (1, 4)
    http = server.client("http")
    assert [m["name"] for m in http.get_model_repository_index()] == ["idt"]

    # an object changes: the model is reloaded with the new config
    client.put_object(Bucket=bucket, Key="models/idt/config.pbtxt",
                      Body=test_model_config("idt", dims="[ 2 ]").encode())
    _wait(lambda: http.get_model_metadata("idt")["inputs"][0]["shape"] == [-1, 2])
    assert _infer(server, "idt", 2).shape == (1, 2)

    # a new model appears, a removed one goes away
    client.put_object(Bucket=bucket, Key="models/second/config.pbtxt", Body=test_model_config("second").encode())
    client.put_object(Bucket=bucket, Key="models/second/1/weights.bin", Body=b"w")
    _wait(lambda: http.is_model_ready("second"))
    client.delete_object(Bucket=bucket, Key="models/second/config.pbtxt")
    client.delete_object(Bucket=bucket, Key="models/second/1/weights.bin")
    _wait(lambda: not http.is_model_ready("second"))
    assert _infer(server, "idt", 2).shape == (1, 2)


def test_endpoint_from_environment_and_signature_follows_etags(s3, s3_server, monkeypatch, tmp_path):
    client, bucket = s3
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{s3_server}")
    root = CloudRoot(f"s3://{bucket}/models", cache_dir=tmp_path, min_interval_s=0)
    first = root.scan()
    assert list(first) == ["idt"]
    assert (first["idt"].path / "config.pbtxt").read_text() == test_model_config("idt")
    assert (first["idt"].path / "1" / "weights.bin").read_bytes() == b"w1"
    assert root.scan()["idt"] == first["idt"]  # unchanged objects: same source, no new download
    client.put_object(Bucket=bucket, Key="models/idt/1/weights.bin", Body=b"w2")
    second = root.scan()["idt"]
    assert second.signature != first["idt"].signature and second.path != first["idt"].path
    assert (second.path / "1" / "weights.bin").read_bytes() == b"w2"


def test_failed_listing_keeps_the_last_listing(s3, s3_server, tmp_path):
    client, bucket = s3
    root = CloudRoot(f"s3://{s3_server}/{bucket}/models", cache_dir=tmp_path, min_interval_s=0)
    assert list(root.scan()) == ["idt"]
    for item in client.list_objects_v2(Bucket=bucket)["Contents"]:
        client.delete_object(Bucket=bucket, Key=item["Key"])
    client.delete_bucket(Bucket=bucket)  # listing now fails: a blip must not unload every model
    assert list(root.scan()) == ["idt"]


def test_unsupported_repository_uri_is_a_clear_error():
    with pytest.raises(ValueError, match="unsupported model repository 'http://example.com/models'"):
        CloudRoot("http://example.com/models")
