"""Typed, path-aware reading of untrusted CR dicts for :mod:`.spec`.

Each getter checks the JSON type and range and raises :class:`SpecError` with the dotted path
of the field (``spec.predictor.minReplicas``), so users see where their YAML is wrong.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

# Container resources cannot be negative, so the sign the CRD's generic quantity pattern allows is refused.
_QUANTITY = re.compile(r"^\+?(?P<num>\d+(\.\d*)?|\.\d+)(?P<suffix>[eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
_SCALE = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal(10**3), "M": Decimal(10**6),
          "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15), "E": Decimal(10**18),
          **{p + "i": Decimal(2 ** (10 * (i + 1))) for i, p in enumerate("KMGTPE")}}
# The API server's name and label rules (apimachinery validation), checked here because a child
# object that breaks them is refused on every reconcile instead of being reported once.
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def quantity(text: str) -> Decimal | None:
    """The value of a non-negative Kubernetes quantity, or None when ``text`` is not one."""
    match = _QUANTITY.match(text)
    if not match:
        return None
    suffix = match["suffix"] or ""
    if suffix[:1] in ("e", "E"):
        return Decimal(match["num"] + suffix)
    return Decimal(match["num"]) * _SCALE.get(suffix, Decimal(1))


def label_value_problem(value: str) -> str | None:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        return f"{value!r} is not a valid label value (at most 63 of A-Z a-z 0-9 - _ . , alphanumeric at both ends)"
    return None


def label_key_problem(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if (prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix))) or not name or label_value_problem(name):
        return f"{key!r} is not a valid label key ([prefix/]name, name at most 63 of A-Z a-z 0-9 - _ .)"
    return None


def name_problem(name: str) -> str | None:
    if len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
        return f"{name!r} is not a valid object name (lowercase a-z 0-9 - ., alphanumeric at both ends)"
    return None


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

    def opt_name(self, key: str) -> str | None:
        """The name of another object (Secret, ServiceAccount): a DNS-1123 subdomain."""
        value = self.opt_str(key)
        problem = name_problem(value) if value is not None else None
        if problem:
            raise SpecError(f"{self.path}.{key}", problem)
        return value

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

    def label_map(self, key: str) -> Mapping[str, str]:
        """Labels (e.g. a nodeSelector): valid keys and values, as the API server checks them."""
        values = self.str_map(key)
        for name, item in values.items():
            problem = label_key_problem(name) or label_value_problem(item)
            if problem:
                raise SpecError(f"{self.path}.{key}.{name}", problem)
        return values

    def quantity_map(self, key: str) -> Mapping[str, str]:
        """Resource quantities; numbers are accepted as YAML writes them (``cpu: 1``)."""
        values = self._get(key, (Mapping,), "an object of quantities") or {}
        result = {}
        for name, item in values.items():
            text = str(item) if isinstance(item, (int, float)) and not isinstance(item, bool) else item
            if not isinstance(text, str) or quantity(text) is None:
                raise SpecError(
                    f"{self.path}.{key}.{name}", f"must be a quantity like 500m, 2 or 8Gi (non-negative), got {item!r}"
                )
            result[name] = text
        return result
