"""Fixtures for the storage tests: a real moto S3 server and a static HTTP server, both on port 0."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.s3 import moto_endpoint


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_endpoint() as endpoint:
        yield endpoint


@pytest.fixture()
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Credentials and endpoint as the init container gets them; returns ``host:port``."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "S3_ENDPOINT", "S3_USE_HTTPS", "AWS_ANONYMOUS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return s3_endpoint


@pytest.fixture()
def bucket(s3_env: str, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """A fresh bucket holding a small Triton model repository; returns (boto3 client, name)."""
    import boto3

    client = boto3.client("s3", endpoint_url=f"http://{s3_env}", region_name="us-east-1")
    name = "models-" + request.node.name.lower().replace("_", "-").replace("[", "-").replace("]", "")[:40]
    client.create_bucket(Bucket=name)
    client.put_object(Bucket=name, Key="repo/simple/config.pbtxt", Body=b'name: "simple"\n')
    client.put_object(Bucket=name, Key="repo/simple/1/model.onnx", Body=b"\x08\x01onnx")
    client.put_object(Bucket=name, Key="repo/other/1/model.onnx", Body=b"other")
    client.put_object(Bucket=name, Key="repo/", Body=b"")  # console-style folder marker
    client.put_object(Bucket=name, Key="repository-sibling/x", Body=b"must not be fetched")
    return client, name


@pytest.fixture()
def http_root(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join()
