"""Scheme dispatch for :func:`download`, :func:`list_objects` and :func:`read`.

The public entry points of :mod:`serving_pod.storage`; each parses the URI, picks the module of
its scheme and lets that module do the work, so callers never branch on schemes themselves.
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import ModuleType

from serving_pod.storage import archives
from serving_pod.storage.uris import ObjectInfo, StorageError, StorageUri, parse_uri

log = logging.getLogger(__name__)


def _module(uri: StorageUri) -> ModuleType:
    # Imported lazily so that, e.g., reading a local path never imports boto3.
    if uri.scheme == "s3":
        from serving_pod.storage import s3

        return s3
    if uri.scheme == "gs":
        from serving_pod.storage import gcs

        return gcs
    if uri.scheme in ("http", "https"):
        from serving_pod.storage import web

        return web
    from serving_pod.storage import local

    return local


def download(uri: str, dest: Path) -> None:
    """Fetch the model repository (or single file) at ``uri`` into the folder ``dest``.

    ``dest`` is created when missing. A URI naming one archive (.tar.gz, .tgz, .tar, .zip),
    whatever its scheme, is unpacked into ``dest`` and the archive removed. Raises :class:`StorageError` with a message naming the URI and the cause.
    """
    parsed = parse_uri(uri)
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise StorageError(f"destination {dest} exists and is not a folder")
    dest.mkdir(parents=True, exist_ok=True)
    files = _module(parsed).download(parsed, dest)
    if len(files) == 1 and archives.is_archive(parsed.key) and files[0].parent == dest:
        archives.extract(files[0], dest)
        files = sorted(p for p in dest.rglob("*") if p.is_file())
    log.info("downloaded %s into %s: %d files", uri, dest, len(files))


def list_objects(uri: str) -> list[ObjectInfo]:
    """Objects below ``uri`` with sizes and change markers (etag / mtime), keys relative to it.

    Not available for http(s) URIs, which name a single file.
    """
    parsed = parse_uri(uri)
    module = _module(parsed)
    if not hasattr(module, "list_objects"):
        raise StorageError(f"{uri}: listing is not supported for {parsed.scheme}:// URIs")
    return module.list_objects(parsed)


def read(uri: str) -> bytes:
    """The bytes of the one object or file at ``uri``."""
    parsed = parse_uri(uri)
    return _module(parsed).read(parsed)
