"""S3 (and S3-compatible: MinIO, Ceph, moto) listing, reading and downloading with boto3.

Credentials come from the usual ``AWS_*`` variables (boto3's default chain); set
``AWS_ANONYMOUS=true`` for public buckets. The endpoint is, in order: the ``host:port`` of a
Triton-style ``s3://host:port/bucket/path`` URI (http unless ``S3_USE_HTTPS=1``),
``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, then KServe's ``S3_ENDPOINT`` (scheme from
``S3_USE_HTTPS``, default https). Custom endpoints use path-style addressing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from serving_pod.storage.uris import ObjectInfo, StorageError, StorageNotFoundError, StorageUri, safe_relative


def endpoint_url(uri: StorageUri, env: Mapping[str, str] | None = None) -> str | None:
    """The endpoint to talk to for ``uri``, or None for AWS itself."""
    env = os.environ if env is None else env
    https = env.get("S3_USE_HTTPS", "").lower() in ("1", "true", "yes")
    if uri.endpoint:
        return f"{'https' if https else 'http'}://{uri.endpoint}"
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if env.get(name):
            return env[name]
    endpoint = env.get("S3_ENDPOINT")
    if endpoint:
        if "://" in endpoint:
            return endpoint
        https = env.get("S3_USE_HTTPS", "1").lower() in ("1", "true", "yes")
        return f"{'https' if https else 'http'}://{endpoint}"
    return None


def client(uri: StorageUri, env: Mapping[str, str] | None = None) -> Any:
    """A boto3 S3 client for ``uri`` (imported here: boto3 is an optional dependency)."""
    env = os.environ if env is None else env
    try:
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config
    except ImportError as exc:  # pragma: no cover - boto3 is installed with ferry[s3]
        raise StorageError("s3:// URIs need boto3: pip install 'ferry[s3]'") from exc
    endpoint = endpoint_url(uri, env)
    options: dict[str, Any] = {"retries": {"max_attempts": 5, "mode": "standard"}}
    if endpoint:
        options["s3"] = {"addressing_style": "path"}
    if env.get("AWS_ANONYMOUS", "").lower() in ("1", "true", "yes"):
        options["signature_version"] = UNSIGNED
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "us-east-1"
    return boto3.client("s3", endpoint_url=endpoint, region_name=region, config=Config(**options))


def _errors() -> tuple[type[BaseException], ...]:
    from botocore.exceptions import BotoCoreError, ClientError

    return (BotoCoreError, ClientError)


def _fail(uri: StorageUri, action: str, exc: BaseException) -> StorageError:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
    if code in ("NoSuchBucket", "NoSuchKey", "404"):
        return StorageNotFoundError(f"{uri.raw}: not found while {action} ({code})")
    return StorageError(f"{uri.raw}: failed while {action}: {exc}")


def list_objects(uri: StorageUri, s3: Any | None = None) -> list[ObjectInfo]:
    """Every object below ``uri`` (recursively), keys relative to it; one exact object lists itself."""
    return _listing(uri, s3 or client(uri))[0]


def _listing(uri: StorageUri, s3: Any) -> tuple[list[ObjectInfo], bool]:
    """(objects, exact): ``exact`` when ``uri`` names one object rather than a prefix."""
    prefix = uri.key + "/" if uri.key else ""
    found: list[ObjectInfo] = []
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=uri.bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                if item["Key"].endswith("/"):
                    continue  # folder markers written by consoles
                found.append(_info(item["Key"][len(prefix):], item))
        if found or not uri.key:
            return found, False
        head = s3.head_object(Bucket=uri.bucket, Key=uri.key)
    except _errors() as exc:
        raise _fail(uri, "listing", exc) from exc
    return [_info(uri.key.rsplit("/", 1)[-1], head, size_key="ContentLength")], True


def _info(key: str, item: Mapping[str, Any], size_key: str = "Size") -> ObjectInfo:
    modified = item.get("LastModified")
    return ObjectInfo(
        key=key,
        size=int(item.get(size_key, 0)),
        etag=str(item.get("ETag", "")).strip('"') or None,
        last_modified=modified.timestamp() if modified is not None else None,
    )


def read(uri: StorageUri, s3: Any | None = None) -> bytes:
    """The bytes of the single object at ``uri``."""
    s3 = s3 or client(uri)
    try:
        return s3.get_object(Bucket=uri.bucket, Key=uri.key)["Body"].read()
    except _errors() as exc:
        raise _fail(uri, "reading", exc) from exc


def download(uri: StorageUri, dest: Path) -> list[Path]:
    """Copy every object below ``uri`` into ``dest`` keeping relative paths; returns the files."""
    s3 = client(uri)
    objects, exact = _listing(uri, s3)
    if not objects:
        raise StorageNotFoundError(f"{uri.raw}: no objects found")
    written: list[Path] = []
    for obj in objects:
        key = uri.key if exact else "/".join(part for part in (uri.key, obj.key) if part)
        target = dest / safe_relative(obj.key)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            s3.download_file(uri.bucket, key, str(target))
        except _errors() as exc:
            raise _fail(uri, f"downloading {key}", exc) from exc
        written.append(target)
    return written
