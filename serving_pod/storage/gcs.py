"""Google Cloud Storage (``gs://``) through google-cloud-storage, when it is installed.

Credentials: Application Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS`` or the
workload identity of the pod); ``GCS_ANONYMOUS=true`` uses an anonymous client for public
buckets. Without the package every call fails with a message saying what to install.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from serving_pod.storage.uris import ObjectInfo, StorageError, StorageNotFoundError, StorageUri, safe_relative

INSTALL_HINT = "gs:// URIs need google-cloud-storage: pip install 'ferry[gcs]'"


def client() -> Any:
    try:
        from google.cloud import storage
    except ImportError as exc:
        raise StorageError(INSTALL_HINT) from exc
    if os.environ.get("GCS_ANONYMOUS", "").lower() in ("1", "true", "yes"):
        return storage.Client.create_anonymous_client()
    return storage.Client()


def _blobs(uri: StorageUri, gcs: Any) -> tuple[list[Any], bool]:
    prefix = uri.key + "/" if uri.key else ""
    try:
        blobs = [b for b in gcs.list_blobs(uri.bucket, prefix=prefix) if not b.name.endswith("/")]
        if blobs or not uri.key:
            return blobs, False
        blob = gcs.bucket(uri.bucket).get_blob(uri.key)
    except Exception as exc:  # google.api_core errors have no common import-free base
        raise StorageError(f"{uri.raw}: failed while listing: {exc}") from exc
    return ([blob], True) if blob is not None else ([], False)


def _relative(uri: StorageUri, name: str, exact: bool) -> str:
    return name.rsplit("/", 1)[-1] if exact else name[len(uri.key) + 1 if uri.key else 0:]


def list_objects(uri: StorageUri) -> list[ObjectInfo]:
    blobs, exact = _blobs(uri, client())
    return [
        ObjectInfo(
            key=_relative(uri, b.name, exact),
            size=int(b.size or 0),
            etag=b.etag,
            last_modified=b.updated.timestamp() if b.updated else None,
        )
        for b in blobs
    ]


def read(uri: StorageUri) -> bytes:
    blobs, exact = _blobs(uri, client())
    if not exact:
        raise StorageNotFoundError(f"{uri.raw}: no such object")
    return blobs[0].download_as_bytes()


def download(uri: StorageUri, dest: Path) -> list[Path]:
    blobs, exact = _blobs(uri, client())
    if not blobs:
        raise StorageNotFoundError(f"{uri.raw}: no objects found")
    written = []
    for blob in blobs:
        target = dest / safe_relative(_relative(uri, blob.name, exact))
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            blob.download_to_filename(str(target))
        except Exception as exc:
            raise StorageError(f"{uri.raw}: failed while downloading {blob.name}: {exc}") from exc
        written.append(target)
    return written
