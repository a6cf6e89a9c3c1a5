"""Storage URIs: parsing and the values shared by every scheme.

``s3://bucket/path`` and Triton's ``s3://host:port/bucket/path`` (explicit endpoint),
``gs://bucket/path``, ``http(s)://...`` (one file), ``pvc://claim/path`` (a PersistentVolumeClaim
the operator mounts under ``$FERRY_PVC_ROOT``, default ``/mnt/pvc``), ``file:///abs/path`` and
plain local paths. Parsing is pure; nothing here touches the network or the disk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from urllib.parse import urlsplit

SCHEMES = ("s3", "gs", "http", "https", "pvc", "file", "local")

_HOST_PORT = re.compile(r"^[A-Za-z0-9.\-]+:\d{1,5}$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,254}$")


class StorageError(Exception):
    """A storage URI that cannot be parsed or fetched; the message says which and why."""


class StorageNotFoundError(StorageError):
    """The URI is well formed but nothing exists there."""


@dataclass(frozen=True)
class StorageUri:
    """A parsed storage URI.

    ``bucket`` is the bucket (s3, gs), the claim name (pvc) or empty; ``key`` is the object key
    or path inside it, without a leading slash (for local paths: the absolute path itself).
    ``endpoint`` is set only for ``s3://host:port/...`` URIs.
    """

    raw: str
    scheme: str
    bucket: str = ""
    key: str = ""
    endpoint: str | None = None


@dataclass(frozen=True)
class ObjectInfo:
    """One object below a listed prefix. ``key`` is relative to the listed URI's key."""

    key: str
    size: int
    etag: str | None = None
    last_modified: float | None = None


def parse_uri(uri: str) -> StorageUri:
    """Parse ``uri`` or raise :class:`StorageError` naming what is wrong with it."""
    if not isinstance(uri, str) or not uri.strip():
        raise StorageError("storage URI is empty")
    uri = uri.strip()
    if "://" not in uri:
        if uri.startswith("/") or uri.startswith("."):
            return StorageUri(raw=uri, scheme="local", key=uri)
        raise StorageError(
            f"unsupported storage URI {uri!r}: expected one of s3://, gs://, http(s)://, "
            "pvc://, file:// or an absolute local path"
        )
    scheme = uri.split("://", 1)[0].lower()
    if scheme not in SCHEMES or scheme == "local":
        raise StorageError(
            f"unsupported storage URI scheme {scheme + '://'!r} in {uri!r}: expected one of "
            "s3://, gs://, http(s)://, pvc://, file://"
        )
    if scheme in ("http", "https"):
        parts = urlsplit(uri)
        if not parts.netloc:
            raise StorageError(f"storage URI {uri!r} has no host")
        return StorageUri(raw=uri, scheme=scheme, bucket=parts.netloc, key=parts.path.lstrip("/"))
    if scheme == "file":
        path = uri[len("file://"):]
        if not path.startswith("/"):
            raise StorageError(f"file URI {uri!r} must hold an absolute path (file:///path)")
        return StorageUri(raw=uri, scheme="file", key=path)
    rest = uri.split("://", 1)[1]
    first, _, key = rest.partition("/")
    endpoint = None
    if scheme == "s3" and _HOST_PORT.match(first):
        endpoint = first
        first, _, key = key.partition("/")
    if not first:
        raise StorageError(f"storage URI {uri!r} has no {'claim' if scheme == 'pvc' else 'bucket'} name")
    if scheme in ("s3", "gs") and not _BUCKET.match(first):
        raise StorageError(f"invalid bucket name {first!r} in storage URI {uri!r}")
    key = key.strip("/")
    _check_key(key, uri)
    return StorageUri(raw=uri, scheme=scheme, bucket=first, key=key, endpoint=endpoint)


def _check_key(key: str, uri: str) -> None:
    if any(part == ".." for part in PurePosixPath(key).parts):
        raise StorageError(f"storage URI {uri!r} must not contain '..'")


def safe_relative(key: str) -> PurePosixPath:
    """An object key as a relative path that cannot escape the destination directory."""
    path = PurePosixPath(key.lstrip("/"))
    if not key or any(part in ("..", "") for part in path.parts) or path.is_absolute():
        raise StorageError(f"refusing object key {key!r}: it would escape the destination")
    return path
