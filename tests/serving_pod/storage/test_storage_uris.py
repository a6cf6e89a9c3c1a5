"""URI parsing: every scheme, Triton's s3://host:port form, and clear errors for bad URIs."""

from __future__ import annotations

import pytest

from serving_pod.storage import StorageError, parse_uri
from serving_pod.storage.s3 import endpoint_url
from serving_pod.storage.uris import safe_relative


@pytest.mark.parametrize(
    ("uri", "scheme", "bucket", "key", "endpoint"),
    [
        ("s3://bucket/path/to/repo", "s3", "bucket", "path/to/repo", None),
        ("s3://bucket", "s3", "bucket", "", None),
        ("s3://bucket/repo/", "s3", "bucket", "repo", None),
        ("s3://minio.local:9000/bucket/repo", "s3", "bucket", "repo", "minio.local:9000"),
        ("s3://127.0.0.1:9000/bucket", "s3", "bucket", "", "127.0.0.1:9000"),
        ("gs://kfserving-examples/models/torchscript", "gs", "kfserving-examples", "models/torchscript", None),
        ("pvc://my-claim/models/resnet", "pvc", "my-claim", "models/resnet", None),
        ("https://host.example/a/model.tar.gz", "https", "host.example", "a/model.tar.gz", None),
        ("file:///srv/models", "file", "", "/srv/models", None),
        ("/srv/models", "local", "", "/srv/models", None),
    ],
)
def test_parse(uri: str, scheme: str, bucket: str, key: str, endpoint: str | None) -> None:
    parsed = parse_uri(uri)
    assert (parsed.scheme, parsed.bucket, parsed.key, parsed.endpoint) == (scheme, bucket, key, endpoint)


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("", "empty"),
        ("hf://org/model", "unsupported storage URI scheme 'hf://'"),
        ("models/relative", "unsupported storage URI"),
        ("s3://", "no bucket"),
        ("s3://Bad_Bucket!/x", "invalid bucket name"),
        ("pvc:///path", "no claim"),
        ("file://relative/path", "absolute path"),
        ("s3://bucket/../etc", "must not contain '..'"),
        ("https:///nohost", "no host"),
    ],
)
def test_bad_uris_are_named(uri: str, message: str) -> None:
    with pytest.raises(StorageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_uri(uri)


def test_endpoint_precedence() -> None:
    plain = parse_uri("s3://bucket/x")
    assert endpoint_url(plain, {}) is None
    assert endpoint_url(plain, {"S3_ENDPOINT": "minio:9000"}) == "https://minio:9000"
    assert endpoint_url(plain, {"S3_ENDPOINT": "minio:9000", "S3_USE_HTTPS": "0"}) == "http://minio:9000"
    assert endpoint_url(plain, {"S3_ENDPOINT": "minio:9000", "AWS_ENDPOINT_URL": "http://a:1"}) == "http://a:1"
    assert endpoint_url(plain, {"AWS_ENDPOINT_URL": "http://a:1", "AWS_ENDPOINT_URL_S3": "http://b:2"}) == "http://b:2"
    explicit = parse_uri("s3://minio:9000/bucket/x")
    assert endpoint_url(explicit, {"AWS_ENDPOINT_URL": "http://a:1"}) == "http://minio:9000"
    assert endpoint_url(explicit, {"S3_USE_HTTPS": "1"}) == "https://minio:9000"


@pytest.mark.parametrize("key", ["../x", "/../etc/passwd", "a/../../b", ""])
def test_keys_cannot_escape(key: str) -> None:
    with pytest.raises(StorageError, match="escape"):
        safe_relative(key)


def test_leading_slash_stays_inside() -> None:
    assert str(safe_relative("/etc/passwd")) == "etc/passwd"
