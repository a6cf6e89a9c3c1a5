"""Model load with file overrides: ``"file:<version>/<name>"`` contents written into a fresh model dir.

Used by ``Engine.load_model`` for the repository extension's load parameters (base64 over HTTP,
bytes over gRPC). Every file lands inside a new temporary directory created for this load; a
path that could leave it (absolute, ``..``, empty parts, backslashes, NUL) is refused before
anything is written, files are created exclusively with ``O_NOFOLLOW`` so no symlink is ever
followed, and the final path is checked to resolve inside the directory. Triton once allowed
path traversal here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath

from serving_pod.core.errors import InvalidArgumentError

#: total bytes one override load may write (the request body is already bounded by the protocol).
MAX_TOTAL_BYTES = 2 * 1024**3


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise InvalidArgumentError(f"failed to load '{name}': invalid model name for a file override")


def safe_relative(path: str) -> PurePosixPath:
    """``<version>/<name>`` as a relative path that cannot leave the model directory."""
    if not path or "\\" in path or "\0" in path or path.startswith("/"):
        raise InvalidArgumentError(
            f"invalid file override 'file:{path}': the path must be relative to the model directory"
        )
    relative = PurePosixPath(path)
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise InvalidArgumentError(
            f"invalid file override 'file:{path}': '..', '.' and empty path components are not allowed"
        )
    return relative


def materialize_override(name: str, files: dict[str, bytes]) -> Path:
    """Write ``files`` (relative path -> bytes) into a fresh ``<tmp>/<name>`` dir and return it."""
    _check_name(name)
    relatives = {safe_relative(path): data for path, data in files.items()}
    total = sum(len(data) for data in relatives.values())
    if total > MAX_TOTAL_BYTES:
        raise InvalidArgumentError(f"file overrides for '{name}' hold {total} bytes, more than {MAX_TOTAL_BYTES}")
    base = Path(tempfile.mkdtemp(prefix="ferry-override-"))
    root = base / name
    try:
        root.mkdir()
        real_root = os.path.realpath(root)
        for relative, data in relatives.items():
            _write(root, real_root, relative, data)
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    return root


def _write(root: Path, real_root: str, relative: PurePosixPath, data: bytes) -> None:
    target = root.joinpath(*relative.parts)
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(f"invalid file override 'file:{relative}': {exc.strerror}") from None
    real_parent = os.path.realpath(parent)
    if os.path.commonpath([real_root, real_parent]) != real_root:
        raise InvalidArgumentError(f"invalid file override 'file:{relative}': it leaves the model directory")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(os.path.join(real_parent, target.name), flags, 0o644)
    except FileExistsError:
        raise InvalidArgumentError(f"invalid file override 'file:{relative}': given more than once") from None
    except OSError as exc:
        raise InvalidArgumentError(f"invalid file override 'file:{relative}': {exc.strerror}") from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def discard_override(directory: Path | None) -> None:
    """Remove an override model dir made by ``materialize_override`` (with its temp parent)."""
    if directory is not None and directory.parent.name.startswith("ferry-override-"):
        shutil.rmtree(directory.parent, ignore_errors=True)
