"""A model directory's modification times as Triton 2.51 keeps them (``ModelTimestamp``, model_repository_manager.cc).

The registry compares the times read when a version was loaded with the times read now, to decide what a load of a
loaded model does: nothing at all when nothing in the model directory is newer, a fresh load of a version whose
folder (or a file beside the config, outside every version folder) is newer, and otherwise an update in place.
Times are per top-level entry of the model directory (its newest time below), plus the directory's own under ``""``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Mapping


def _newest(path: str) -> int:
    """``path``'s modification time in ns, or the newest below it for a folder (0 where it cannot be read, as Triton:
    an unreadable path must not look modified on every load)."""
    try:
        newest = os.stat(path).st_mtime_ns
        if not os.path.isdir(path):
            return newest
        for child in os.listdir(path):
            newest = max(newest, _newest(os.path.join(path, child)))
        return newest
    except OSError:
        return 0


@dataclass(frozen=True)
class ModelTimestamp:
    """Modification times (ns) by top-level entry name; ``config_entry`` names the entry holding the config."""

    times: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    config_entry: str = ""

    @classmethod
    def read(cls, model_dir: Path, config_file: Path) -> ModelTimestamp:
        try:
            times = {"": os.stat(model_dir).st_mtime_ns}
            names = os.listdir(model_dir)
        except OSError:
            return cls()  # as Triton: all times presumed 0
        config_entry = ""
        for name in names:
            path = os.path.join(model_dir, name)
            if str(config_file).startswith(path):
                config_entry = name
            times[name] = _newest(path)
        return cls(MappingProxyType(times), config_entry)

    def newest(self) -> int:
        return max(self.times.values(), default=0)

    def modified(self, now: ModelTimestamp) -> bool:
        """Whether anything in the model directory is newer in ``now`` (Triton: ``IsModified``)."""
        return now.newest() > self.newest()

    def _version_time(self, version: int) -> int:
        """The newest of a version folder and the entries that are neither the config, a version folder nor the
        directory itself (``GetModelVersionModifiedTime`` / ``GetNonModelConfigNorVersionNorDirModifiedTime``)."""
        others = (t for name, t in self.times.items() if not name.isdigit() and name and name != self.config_entry)
        return max(self.times.get(str(version), 0), max(others, default=0))

    def version_modified(self, now: ModelTimestamp, version: int) -> bool:
        """Whether ``version``'s own files are newer in ``now`` (Triton: ``IsModelVersionModified``)."""
        return now._version_time(version) > self._version_time(version)

    def with_config_time(self, time_ns: int) -> ModelTimestamp:
        """As after a load with a ``config`` override: the config counts as modified at ``time_ns`` (so a later load
        without the override finds nothing newer and keeps it, as Triton 2.51 does)."""
        if not self.config_entry:
            return self
        return replace(self, times=MappingProxyType({**self.times, self.config_entry: time_ns}))
