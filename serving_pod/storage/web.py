"""http(s):// downloads: one file per URI (archives are unpacked by :mod:`.operations`)."""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

from serving_pod.storage.uris import StorageError, StorageNotFoundError, StorageUri

TIMEOUT_S = 60.0


def _open(uri: StorageUri):  # type: ignore[no-untyped-def]
    request = urllib.request.Request(uri.raw, headers={"User-Agent": "ferry-storage-initializer"})
    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT_S)  # noqa: S310 - scheme checked
    except urllib.error.HTTPError as exc:
        kind = StorageNotFoundError if exc.code == 404 else StorageError
        raise kind(f"{uri.raw}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise StorageError(f"{uri.raw}: cannot connect: {exc}") from exc


def read(uri: StorageUri) -> bytes:
    with _open(uri) as response:
        return response.read()


def download(uri: StorageUri, dest: Path) -> list[Path]:
    name = PurePosixPath(unquote(uri.key)).name
    if not name:
        raise StorageError(f"{uri.raw}: an http(s) storage URI must name a file, not a folder")
    target = dest / name
    with _open(uri) as response, open(target, "wb") as out:
        shutil.copyfileobj(response, out, length=1 << 20)
    return [target]
