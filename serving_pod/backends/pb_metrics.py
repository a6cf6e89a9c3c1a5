"""``pb_utils.MetricFamily``: custom metrics defined by python models.

Models create families (COUNTER, GAUGE, HISTOGRAM) and labelled metrics and update them as
with Triton. Values are kept here, thread-safe; ``families()`` lists them so the server's
metrics endpoint can export them (not wired yet).
"""

from __future__ import annotations

import threading
_lock = threading.Lock()
_families: dict[str, "MetricFamily"] = {}


class Metric:
    """One labelled series of a family."""

    def __init__(self, family: "MetricFamily", labels: dict[str, str], buckets: list[float] | None) -> None:
        self.family = family
        self.labels = dict(labels)
        self.buckets = sorted(buckets) if buckets else None
        self._value = 0.0
        self._counts = [0] * (len(self.buckets) + 1) if self.buckets else []
        self._sum = 0.0

    def increment(self, value: float) -> None:
        if self.family.kind == MetricFamily.HISTOGRAM:
            raise ValueError("a histogram metric can only observe values")
        if self.family.kind == MetricFamily.COUNTER and value < 0:
            raise ValueError("a counter can only be incremented by a non-negative value")
        with _lock:
            self._value += value

    def set(self, value: float) -> None:
        if self.family.kind != MetricFamily.GAUGE:
            raise ValueError("only a gauge metric can be set")
        with _lock:
            self._value = float(value)

    def observe(self, value: float) -> None:
        if self.family.kind != MetricFamily.HISTOGRAM or self.buckets is None:
            raise ValueError("only a histogram metric (with buckets) can observe values")
        with _lock:
            index = next((i for i, bound in enumerate(self.buckets) if value <= bound), len(self.buckets))
            self._counts[index] += 1
            self._sum += value

    def value(self) -> float:
        if self.family.kind == MetricFamily.HISTOGRAM:
            raise ValueError("a histogram metric has no single value")
        return self._value


class MetricFamily:
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise ValueError(f"unknown metric kind {kind!r}")
        self.name, self.description, self.kind = name, description, kind
        self.metrics: list[Metric] = []
        with _lock:
            existing = _families.get(name)
            if existing is not None and existing.kind != kind:
                raise ValueError(f"metric family '{name}' already exists with another kind")
            _families[name] = self

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> Metric:  # noqa: N802
        if self.kind == self.HISTOGRAM and not buckets:
            raise ValueError("a histogram metric needs buckets")
        metric = Metric(self, labels or {}, buckets)
        with _lock:
            self.metrics.append(metric)
        return metric


def families() -> list[MetricFamily]:
    with _lock:
        return list(_families.values())
