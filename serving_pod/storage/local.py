"""Local sources: ``file://`` and plain paths, and ``pvc://claim/path``.

The operator mounts a pvc:// claim (read-only) at ``$FERRY_PVC_ROOT/<claim>`` (default
``/mnt/pvc``); here it is only checked and copied, so the serving container always reads
``/mnt/models`` whatever the source.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from serving_pod.storage.uris import ObjectInfo, StorageNotFoundError, StorageUri

DEFAULT_PVC_ROOT = "/mnt/pvc"


def source_path(uri: StorageUri) -> Path:
    """The filesystem path a local or pvc URI refers to."""
    if uri.scheme == "pvc":
        root = Path(os.environ.get("FERRY_PVC_ROOT", DEFAULT_PVC_ROOT))
        claim_root = root / uri.bucket
        if not claim_root.is_dir():
            raise StorageNotFoundError(
                f"{uri.raw}: claim {uri.bucket!r} is not mounted at {claim_root} "
                "(the operator mounts pvc:// claims there)"
            )
        return claim_root / uri.key if uri.key else claim_root
    return Path(uri.key)


def _existing(uri: StorageUri) -> Path:
    path = source_path(uri)
    if not path.exists():
        raise StorageNotFoundError(f"{uri.raw}: {path} does not exist")
    return path


def list_objects(uri: StorageUri) -> list[ObjectInfo]:
    path = _existing(uri)
    if path.is_file():
        stat = path.stat()
        return [ObjectInfo(key=path.name, size=stat.st_size, last_modified=stat.st_mtime)]
    found = []
    for item in sorted(path.rglob("*")):
        if item.is_file():
            stat = item.stat()
            found.append(
                ObjectInfo(key=item.relative_to(path).as_posix(), size=stat.st_size, last_modified=stat.st_mtime)
            )
    return found


def read(uri: StorageUri) -> bytes:
    return _existing(uri).read_bytes()


def download(uri: StorageUri, dest: Path) -> list[Path]:
    path = _existing(uri)
    if path.resolve() == dest.resolve():
        return sorted(p for p in dest.rglob("*") if p.is_file())  # already in place
    if path.is_file():
        target = dest / path.name
        shutil.copy2(path, target)
        return [target]
    shutil.copytree(path, dest, dirs_exist_ok=True, symlinks=False)
    return sorted(p for p in dest.rglob("*") if p.is_file())
