"""Model repository discovery: which models exist on disk (or in object storage) and whether they changed.

Knows nothing about what is loaded; the registry asks it for ``ModelSource``s and compares
signatures to decide what to (re)load in poll mode. One repository may span several
``--model-repository`` roots; a model name found in two roots is an error for that model.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A model directory found in a repository root; ``signature`` changes when any file changes."""

    name: str
    path: Path
    signature: str


class RepositoryRoot(Protocol):
    """One ``--model-repository`` location (a local folder, or object storage localized to a folder)."""

    location: str

    def scan(self) -> dict[str, ModelSource]: ...


class LocalRoot:
    """A repository root on the local filesystem."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.location = str(path)

    def scan(self) -> dict[str, ModelSource]:
        if not self.path.is_dir():
            return {}
        found: dict[str, ModelSource] = {}
        for entry in sorted(self.path.iterdir()):
            if entry.is_dir() and not entry.name.startswith("."):
                found[entry.name] = ModelSource(entry.name, entry, directory_signature(entry))
        return found


def directory_signature(path: Path) -> str:
    """Hash of every folder's and file's relative path, and each file's size and mtime, below ``path``."""
    digest = hashlib.sha1()
    for root, dirs, files in os.walk(path):
        dirs.sort()
        digest.update(f"{os.path.relpath(root, path)}/\n".encode())
        for name in sorted(files):
            file_path = os.path.join(root, name)
            try:
                stat = os.stat(file_path)
            except OSError:
                continue
            rel = os.path.relpath(file_path, path)
            digest.update(f"{rel}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


class ModelRepository:
    """All repository roots together."""

    def __init__(self, roots: list[RepositoryRoot]) -> None:
        self.roots = roots

    def scan(self) -> tuple[dict[str, ModelSource], dict[str, str]]:
        """Models found, and errors for names that appear in more than one root."""
        models: dict[str, ModelSource] = {}
        duplicates: dict[str, str] = {}
        for root in self.roots:
            for name, source in root.scan().items():
                if name in models:
                    duplicates[name] = (
                        f"model '{name}' appears in multiple model repositories: "
                        f"{models[name].path.parent} and {root.location}"
                    )
                else:
                    models[name] = source
        for name in duplicates:
            models.pop(name, None)
        return models, duplicates


def open_root(location: str) -> RepositoryRoot:
    """A repository root for a ``--model-repository`` value (local path, or a cloud URI)."""
    if "://" in location and not location.startswith("file://"):
        from serving_pod.repository.cloud import CloudRoot  # object storage, imported on demand

        return CloudRoot(location)
    if location.startswith("file://"):
        location = location[len("file://"):]
    return LocalRoot(Path(location).expanduser().resolve())
