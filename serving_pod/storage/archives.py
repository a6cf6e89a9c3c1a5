"""Unpacking downloaded model archives (.tar, .tar.gz, .tgz, .zip) without escaping ``dest``."""

from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path

from serving_pod.storage.uris import StorageError, safe_relative

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


def is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def extract(archive: Path, dest: Path) -> None:
    """Extract ``archive`` into ``dest`` and delete it; members leaving ``dest`` are refused."""
    name = archive.name.lower()
    try:
        if name.endswith(".zip"):
            with zipfile.ZipFile(archive) as zf:
                for member in zf.namelist():
                    if not member.endswith("/"):
                        safe_relative(member)
                zf.extractall(dest)
        else:
            with tarfile.open(archive) as tf:
                # The 'data' filter refuses absolute paths, '..', links out of dest and devices.
                tf.extractall(dest, filter="data")
    except (tarfile.TarError, zipfile.BadZipFile, OSError) as exc:
        raise StorageError(f"cannot extract archive {archive.name}: {exc}") from exc
    archive.unlink()
