"""A model repository root in object storage (``s3://``, ``s3://host:port/...``, ``gs://``).

``CloudRoot.scan`` lists the objects below the root through :mod:`serving_pod.storage` (which owns
credentials and endpoints: ``AWS_*`` / ``S3_ENDPOINT`` / ``GOOGLE_APPLICATION_CREDENTIALS``), groups
them by their first path component (the model name), and localizes each model whose objects
changed into a fresh folder of a local cache. A model's ``ModelSource.signature`` is a hash of its
objects' keys, sizes and ETags, so poll mode reloads exactly the models whose objects changed.

A failed listing keeps the previous result (a network blip must not unload every model); listings
are reused for ``min_interval_s`` so repository-index requests do not hit the store each time.
Each localized version lives in its own folder; the two newest per model are kept.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from serving_pod import storage
from serving_pod.repository.repository import ModelSource

log = logging.getLogger("ferry.repository")
SCHEMES = ("s3", "gs")
KEEP_VERSIONS = 2


class CloudRoot:
    """A ``--model-repository`` in object storage, localized on demand into ``cache_dir``."""

    def __init__(self, location: str, *, cache_dir: Path | None = None, min_interval_s: float = 1.0) -> None:
        try:
            parsed = storage.parse_uri(location)
        except storage.StorageError as exc:
            raise ValueError(f"invalid model repository '{location}': {exc}") from None
        if parsed.scheme not in SCHEMES:
            raise ValueError(
                f"unsupported model repository '{location}': use a local path, s3:// or gs://"
            )
        self.location = location.rstrip("/")
        self.cache_dir = cache_dir or Path(tempfile.mkdtemp(prefix="ferry-repo-"))
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._listed_at = float("-inf")
        self._sources: dict[str, ModelSource] = {}
        self._localized: dict[str, list[ModelSource]] = {}

    def scan(self) -> dict[str, ModelSource]:
        with self._lock:
            if time.monotonic() - self._listed_at < self.min_interval_s:
                return dict(self._sources)
            try:
                objects = storage.list_objects(self.location)
            except storage.StorageError as exc:
                log.error("cannot list model repository %s: %s (keeping the last listing)", self.location, exc)
                return dict(self._sources)
            found: dict[str, ModelSource] = {}
            for name, entries in _group(objects).items():
                signature = _signature(entries)
                known = self._localized.get(name)
                if known and known[-1].signature == signature:
                    found[name] = known[-1]
                    continue
                try:
                    found[name] = self._localize(name, signature)
                except storage.StorageError as exc:
                    log.error("cannot fetch model '%s' from %s: %s", name, self.location, exc)
                    if known:
                        found[name] = known[-1]
            self._sources = found
            self._listed_at = time.monotonic()
            return dict(found)

    def _localize(self, name: str, signature: str) -> ModelSource:
        """Download model ``name`` into a new cache folder (complete before it becomes visible)."""
        final = self.cache_dir / signature[:20] / name
        if not final.is_dir():
            staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=self.cache_dir))
            try:
                storage.download(f"{self.location}/{name}", staging / name)
                final.parent.mkdir(parents=True, exist_ok=True)
                (staging / name).rename(final)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        source = ModelSource(name, final, signature)
        history = [s for s in self._localized.get(name, []) if s.signature != signature] + [source]
        for old in history[:-KEEP_VERSIONS]:
            shutil.rmtree(old.path.parent, ignore_errors=True)
        self._localized[name] = history[-KEEP_VERSIONS:]
        log.info("localized model '%s' from %s into %s", name, self.location, final)
        return source


def _group(objects: list[storage.ObjectInfo]) -> dict[str, list[storage.ObjectInfo]]:
    """Objects by model name (first key component); top-level files and hidden names are skipped."""
    groups: dict[str, list[storage.ObjectInfo]] = defaultdict(list)
    for item in objects:
        name, sep, rest = item.key.partition("/")
        if sep and rest and name and not name.startswith("."):
            groups[name].append(item)
    return dict(groups)


def _signature(objects: list[storage.ObjectInfo]) -> str:
    digest = hashlib.sha256()
    for item in sorted(objects, key=lambda o: o.key):
        marker = item.etag or f"{item.last_modified}"
        digest.update(f"{item.key}\0{item.size}\0{marker}\n".encode())
    return digest.hexdigest()
