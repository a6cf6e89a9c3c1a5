"""``pb_utils.MetricFamily`` / ``Metric``: Triton's custom metrics API for python models.

Thin handles on a metric store: the engine's ``core.custom_metrics.CustomMetrics`` (found as
BLS finds the engine, ``pb_request.current_engine``) when the model runs in the server process,
or the proxy store ``python_stub`` gives an isolated model, which forwards every call to the
server over the model's IPC channel (``serve`` answers them there). Either way the values live
in the server, which exports them on ``/metrics``, and a family is registered to the model
instance that created it, so unloading the instance removes its series.

A family is deleted with its python object, as in Triton (its ``Metric`` objects keep it alive
here, which Triton does not do). Errors are ``TritonModelException`` with Triton's wording.
"""

from __future__ import annotations

import enum
import sys
from typing import Any

from serving_pod.backends.pb_request import current_engine, current_owner, instance_name
from serving_pod.backends.pb_tensor import TritonModelException, bind_arguments, incompatible_arguments
from serving_pod.core.custom_metrics import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    CustomMetrics,
    MetricError,
    check_operation,
)

_default: list[CustomMetrics] = []


def metric_store(engine: Any) -> Any:
    """The engine's store, or one private to this process for instances without an engine."""
    store = getattr(engine, "custom_metrics", None)
    if store is None:
        if not _default:
            _default.append(CustomMetrics())
        store = _default[0]
    return store


def _failure(prefix: str, owner: str, exc: MetricError) -> TritonModelException:
    """Triton words an error the server reported with the instance that asked."""
    name = instance_name(owner)
    if name:
        return TritonModelException(
            f"{prefix}: Failed to process the request for model '{name}', message: {exc.message}"
        )
    return TritonModelException(f"{prefix}: {exc.message}")


class Metric:
    """One labelled series of a family: ``increment``, ``set``, ``observe``, ``value``."""

    __slots__ = ("_family", "_handle")

    def __init__(self, family: "MetricFamily", handle: int) -> None:
        self._family = family
        self._handle = handle

    def _apply(self, operation: str, value: float, prefix: str) -> None:
        family = self._family
        try:
            check_operation(family.kind, operation, value)
            family._store.update(self._handle, operation, value)
        except MetricError as exc:
            raise _failure(prefix, family._owner, exc) from None

    def increment(self, value: float) -> None:
        self._apply("increment", float(value), "Failed to increment metric value")

    def set(self, value: float) -> None:
        self._apply("set", float(value), "Failed to set metric value")

    def observe(self, value: float) -> None:
        self._apply("observe", float(value), "Failed to observe metric value")

    def value(self) -> float:
        family = self._family
        try:
            check_operation(family.kind, "value")
            return float(family._store.value(self._handle))
        except MetricError as exc:
            raise _failure("Failed to get metric value", family._owner, exc) from None


class _MetricKind(enum.IntEnum):
    """``pb_utils.MetricFamily.COUNTER`` / ``GAUGE`` / ``HISTOGRAM``: Triton's pybind11 enum ``MetricKind``; a member
    compares and hashes as its number, and only a member is a kind (a bare number is pybind11's ``TypeError``)."""

    COUNTER = COUNTER
    GAUGE = GAUGE
    HISTOGRAM = HISTOGRAM

    def __str__(self) -> str:
        return f"MetricKind.{self.name}"


_MetricKind.__name__ = "MetricKind"  # its repr: <MetricKind.COUNTER: 0> (__qualname__ kept for pickle)
_FAMILY_SIGNATURE = ("c_python_backend_utils.MetricFamily(name: str, description: str, "
                     "kind: c_python_backend_utils.MetricKind)")


class MetricFamily:
    """``MetricFamily(name, description, kind)`` with kind ``COUNTER``, ``GAUGE`` or ``HISTOGRAM``."""

    COUNTER = _MetricKind.COUNTER
    GAUGE = _MetricKind.GAUGE
    HISTOGRAM = _MetricKind.HISTOGRAM

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        name, description, kind = bind_arguments(("name", "description", "kind"), (), args, kwargs, _FAMILY_SIGNATURE)
        if not isinstance(name, str) or not isinstance(description, str) or type(kind) is not _MetricKind:
            raise incompatible_arguments(_FAMILY_SIGNATURE, args, kwargs)
        frame = sys._getframe(1)
        self._store: Any = None
        self._owner = current_owner(frame)
        store = metric_store(current_engine(frame))
        try:
            self._handle = store.new_family(name, description, int(kind), self._owner)
        except MetricError as exc:
            raise _failure("Error when creating MetricFamily", self._owner, exc) from None
        self._store = store
        self.name, self.description, self.kind = name, description, int(kind)

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:  # noqa: N802
        if labels is not None and not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            if self.kind != HISTOGRAM:
                raise TritonModelException("Failed to create metric. Unexpected buckets found.")
            buckets = [float(b) for b in buckets]
        elif self.kind == HISTOGRAM:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        try:
            handle = self._store.new_metric(self._handle, dict(labels or {}), buckets)
        except MetricError as exc:
            raise _failure("Error when creating Metric", self._owner, exc) from None
        return Metric(self, handle)

    def __del__(self) -> None:
        store = getattr(self, "_store", None)
        if store is not None:
            store.delete_family_later(self._handle)


# --------------------------------------------------------------------------- server side of isolated models


def serve(store: Any, owner: str, operation: str, args: tuple) -> Any:
    """Answer an isolated model's store call (``python_isolated``); ``owner`` is its process."""
    if operation == "new_family":
        name, description, kind = args
        return store.new_family(name, description, kind, owner)
    if operation == "new_metric":
        return store.new_metric(*args)
    if operation == "update":
        return store.update(*args)
    if operation == "value":
        return store.value(*args)
    if operation == "delete_family":
        return store.delete_family(*args)
    raise MetricError(f"Unknown metric request '{operation}'")
