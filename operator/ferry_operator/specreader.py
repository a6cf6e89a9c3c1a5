"""Typed, path-aware reading of untrusted CR dicts for :mod:`.spec`.

Each getter checks the JSON type and range and raises :class:`SpecError` with the dotted path
of the field (``spec.predictor.minReplicas``), so users see where their YAML is wrong.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

_QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i?|[mkMGTPE]|u|n)?$")


class SpecError(ValueError):
    """An InferenceService spec that cannot be served; ``path`` names the field."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def json_names(cls: type) -> tuple[str, ...]:
    """The CRD property names a spec dataclass declares."""
    return tuple(f.metadata["json"] for f in dataclasses.fields(cls) if "json" in f.metadata)


class Reader:
    """Reads one JSON object at ``path``; a missing object reads as empty."""

    def __init__(self, data: Any, path: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise SpecError(path, f"must be an object, got {type(data).__name__}")
        self.data: Mapping[str, Any] = data
        self.path = path

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def known(self, names: tuple[str, ...]) -> None:
        unknown = sorted(set(self.data) - set(names))
        if unknown:
            raise SpecError(f"{self.path}.{unknown[0]}", f"unknown field (known: {', '.join(sorted(names))})")

    def child(self, key: str, *, required: bool = False) -> Reader:
        if required and not self.has(key):
            raise SpecError(f"{self.path}.{key}", "is required")
        return Reader(self.data.get(key), f"{self.path}.{key}")

    def _get(self, key: str, kinds: tuple[type, ...], what: str) -> Any:
        value = self.data.get(key)
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds):
            raise SpecError(f"{self.path}.{key}", f"must be {what}, got {value!r}")
        return value

    def opt_str(self, key: str) -> str | None:
        value = self._get(key, (str,), "a string")
        return value or None

    def text(self, key: str) -> str:
        value = self.opt_str(key)
        if value is None:
            raise SpecError(f"{self.path}.{key}", "is required")
        return value

    def opt_bool(self, key: str) -> bool | None:
        return self._get(key, (bool,), "true or false")

    def opt_int(self, key: str, *, minimum: int | None = None, maximum: int | None = None) -> int | None:
        value = self._get(key, (int,), "an integer")
        if value is not None and minimum is not None and value < minimum:
            raise SpecError(f"{self.path}.{key}", f"must be >= {minimum}, got {value}")
        if value is not None and maximum is not None and value > maximum:
            raise SpecError(f"{self.path}.{key}", f"must be <= {maximum}, got {value}")
        return value

    def integer(self, key: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
        value = self.opt_int(key, minimum=minimum, maximum=maximum)
        return default if value is None else value

    def opt_enum(self, key: str, allowed: tuple[str, ...]) -> str | None:
        value = self.opt_str(key)
        if value is not None and value not in allowed:
            raise SpecError(f"{self.path}.{key}", f"must be one of {', '.join(allowed)}, got {value!r}")
        return value

    def enum(self, key: str, allowed: tuple[str, ...], default: str) -> str:
        return self.opt_enum(key, allowed) or default

    def str_list(self, key: str) -> tuple[str, ...]:
        values = self._get(key, (list,), "a list of strings") or []
        for index, item in enumerate(values):
            if not isinstance(item, str):
                raise SpecError(f"{self.path}.{key}[{index}]", f"must be a string, got {item!r}")
        return tuple(values)

    def obj_list(self, key: str, *, required_key: str | None = None) -> tuple[Mapping[str, Any], ...]:
        values = self._get(key, (list,), "a list of objects") or []
        for index, item in enumerate(values):
            if not isinstance(item, Mapping):
                raise SpecError(f"{self.path}.{key}[{index}]", f"must be an object, got {item!r}")
            if required_key and not item.get(required_key):
                raise SpecError(f"{self.path}.{key}[{index}].{required_key}", "is required")
        return tuple(dict(item) for item in values)

    def opt_obj(self, key: str) -> Mapping[str, Any] | None:
        return self._get(key, (Mapping,), "an object")

    def str_map(self, key: str) -> Mapping[str, str]:
        values = self._get(key, (Mapping,), "an object of strings") or {}
        for name, item in values.items():
            if not isinstance(item, str):
                raise SpecError(f"{self.path}.{key}.{name}", f"must be a string, got {item!r}")
        return dict(values)

    def quantity_map(self, key: str) -> Mapping[str, str]:
        """Resource quantities; numbers are accepted as YAML writes them (``cpu: 1``)."""
        values = self._get(key, (Mapping,), "an object of quantities") or {}
        result = {}
        for name, item in values.items():
            text = str(item) if isinstance(item, (int, float)) and not isinstance(item, bool) else item
            if not isinstance(text, str) or not _QUANTITY.match(text):
                raise SpecError(f"{self.path}.{key}.{name}", f"must be a quantity like 500m, 2 or 8Gi, got {item!r}")
            result[name] = text
        return result
