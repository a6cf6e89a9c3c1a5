"""The checkpoint: one JSON file holding every measurement of a sweep, saved after each one.

``<checkpoint-directory>/ferry-analyzer.json``. A rerun of ``profile`` with the same directory reuses the
measurements it finds (an interrupted sweep resumes where it stopped; a finished one can be re-ranked
under other objectives without measuring again). The report reads nothing else, so every figure it shows
comes from here. Measurements taken under different settings (load generator, window) are never mixed:
such a checkpoint is refused with a clear message. Writes are atomic (temp file + rename).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from serving_pod.analyzer.errors import InputError
from serving_pod.analyzer.measure import Measurement

FORMAT = "ferry-analyzer-checkpoint/1"
FILENAME = "ferry-analyzer.json"


class Checkpoint:
    """In-memory view of the checkpoint file; :meth:`save` persists it."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    # ------------------------------------------------------------------------------------------- files

    @classmethod
    def open(cls, directory: Path, *, settings: dict[str, Any] | None = None, create: bool = True) -> Checkpoint:
        """Load ``directory``'s checkpoint (or start one when ``create``); ``settings`` must match its own."""
        path = Path(directory) / FILENAME
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                raise InputError(f"checkpoint {path} is unreadable: {exc}") from None
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise InputError(f"{path} is not a ferry-analyzer checkpoint (format {FORMAT} expected)")
            if settings is not None and data.get("settings") and data["settings"] != settings:
                raise InputError(
                    f"checkpoint {path} was measured with other settings ({_describe(data['settings'])}) than "
                    f"this run ({_describe(settings)}); use another --checkpoint-directory or delete the file")
            if settings is not None:
                data["settings"] = settings
            return cls(path, data)
        if not create:
            raise InputError(f"no checkpoint in {directory} (expected {path}); run `ferry-analyzer profile` first")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot create checkpoint directory {directory}: {exc}") from None
        return cls(path, {"format": FORMAT, "settings": settings or {}, "models": {}})

    def save(self) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".ferry-analyzer.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(self.data, handle, indent=1, sort_keys=True, allow_nan=False)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    # ------------------------------------------------------------------------------------------- models

    def model(self, name: str) -> dict[str, Any]:
        return self.data["models"].setdefault(name, {"configs": {}, "measurements": [], "result": None})

    def model_names(self) -> list[str]:
        return list(self.data["models"])

    def add_config(self, model: str, key: str, point: dict[str, Any], config: dict[str, Any]) -> None:
        self.model(model)["configs"].setdefault(key, {"point": point, "config": config, "error": ""})

    def config_error(self, model: str, key: str, error: str) -> None:
        self.model(model)["configs"][key]["error"] = error
        self.save()

    def measurements(self, model: str) -> list[Measurement]:
        return [Measurement.from_dict(item) for item in self.model(model)["measurements"]]

    def find(self, model: str, key: str, concurrency: int, trial: int = 0) -> Measurement | None:
        """A successful measurement of this point (and verification trial), if one was taken already."""
        for item in self.model(model)["measurements"]:
            if item["config_key"] == key and item["concurrency"] == concurrency and \
                    item.get("trial", 0) == trial and not item.get("error"):
                return Measurement.from_dict(item)
        return None

    def record(self, measurement: Measurement) -> None:
        """Add (or replace a failed attempt of) this point, then save."""
        items = self.model(measurement.model)["measurements"]
        items[:] = [i for i in items if not (i["config_key"] == measurement.config_key
                                            and i["concurrency"] == measurement.concurrency
                                            and i.get("trial", 0) == measurement.trial)]
        items.append(measurement.as_dict())
        self.save()

    def set_result(self, model: str, result: dict[str, Any]) -> None:
        self.model(model)["result"] = result
        self.save()


def _describe(settings: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(settings.items()))
