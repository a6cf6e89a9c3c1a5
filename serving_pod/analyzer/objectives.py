"""Objectives, constraints and ranking, as in Triton's Model Analyzer.

An :class:`Objective` scores a measurement (higher is better): ``throughput`` maximizes inferences/s,
``latency`` minimizes p99, ``weighted`` maximizes ``w_t*ln(throughput) - w_l*ln(p99)`` (scale-free, so
it needs no reference point). :class:`Constraints` are hard limits: p99 budget, minimum throughput,
maximum server memory. A measurement that breaks one is never recommended; :func:`config_rank` still
orders infeasible configurations by how far they miss, so the search walks toward feasibility.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from serving_pod.analyzer.errors import InputError
from serving_pod.analyzer.measure import Measurement

OBJECTIVES = ("throughput", "latency", "weighted")


@dataclass(frozen=True)
class Objective:
    kind: str = "throughput"
    throughput_weight: float = 1.0
    latency_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise InputError(f"invalid --objective {self.kind!r}: use one of {', '.join(OBJECTIVES)}")
        if self.throughput_weight < 0 or self.latency_weight < 0 or \
                self.throughput_weight + self.latency_weight == 0:
            raise InputError("invalid --weights: both must be >= 0 and not both 0")

    def score(self, m: Measurement) -> float:
        if self.kind == "throughput":
            return m.throughput
        if self.kind == "latency":
            return -m.p99_ms
        return (self.throughput_weight * math.log(max(m.throughput, 1e-9))
                - self.latency_weight * math.log(max(m.p99_ms, 1e-9)))

    def gain(self, best: Measurement, default: Measurement) -> float:
        """How much better ``best`` is than ``default`` as a fraction (0.25 = 25 % better)."""
        if self.kind == "throughput":
            return best.throughput / default.throughput - 1 if default.throughput > 0 else math.inf
        if self.kind == "latency":
            return 1 - best.p99_ms / default.p99_ms if default.p99_ms > 0 else 0.0
        return math.exp(self.score(best) - self.score(default)) - 1

    @property
    def gain_meaning(self) -> str:
        return {"throughput": "more throughput", "latency": "lower p99 latency",
                "weighted": "better throughput/latency score"}[self.kind]

    def as_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "throughput_weight": self.throughput_weight,
                "latency_weight": self.latency_weight}


@dataclass(frozen=True)
class Constraints:
    max_p99_ms: float | None = None
    min_throughput: float | None = None
    max_memory_mb: float | None = None

    def __post_init__(self) -> None:
        for flag, value in (("--latency-budget-ms", self.max_p99_ms), ("--min-throughput", self.min_throughput),
                            ("--max-memory-mb", self.max_memory_mb)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise InputError(f"invalid {flag} {value:g}: must be a positive number")

    def violations(self, m: Measurement) -> list[str]:
        """Why ``m`` cannot be recommended (empty when it can)."""
        if not m.ok:
            return [f"measurement failed: {m.error or 'no figures'}"]
        out = []
        if self.max_p99_ms is not None and m.p99_ms > self.max_p99_ms:
            out.append(f"p99 {m.p99_ms:.3f} ms > budget {self.max_p99_ms:g} ms")
        if self.min_throughput is not None and m.throughput < self.min_throughput:
            out.append(f"throughput {m.throughput:.1f}/s < minimum {self.min_throughput:g}/s")
        if self.max_memory_mb is not None:
            if m.rss_mb is None:
                out.append("server memory unknown (remote server) but --max-memory-mb was given")
            elif m.rss_mb > self.max_memory_mb:
                out.append(f"server memory {m.rss_mb:.0f} MiB > maximum {self.max_memory_mb:g} MiB")
        return out

    def excess(self, m: Measurement) -> float:
        """Relative amount by which ``m`` misses the constraints (0 when feasible, inf when failed)."""
        if not m.ok:
            return math.inf
        total = 0.0
        if self.max_p99_ms is not None:
            total += max(0.0, m.p99_ms / self.max_p99_ms - 1)
        if self.min_throughput is not None:
            total += max(0.0, 1 - m.throughput / self.min_throughput)
        if self.max_memory_mb is not None:
            total += math.inf if m.rss_mb is None else max(0.0, m.rss_mb / self.max_memory_mb - 1)
        return total

    def describe(self) -> str:
        parts = []
        if self.max_p99_ms is not None:
            parts.append(f"p99 <= {self.max_p99_ms:g} ms")
        if self.min_throughput is not None:
            parts.append(f"throughput >= {self.min_throughput:g}/s")
        if self.max_memory_mb is not None:
            parts.append(f"server memory <= {self.max_memory_mb:g} MiB")
        return ", ".join(parts) or "none"

    def as_dict(self) -> dict[str, float | None]:
        return {"max_p99_ms": self.max_p99_ms, "min_throughput": self.min_throughput,
                "max_memory_mb": self.max_memory_mb}


def feasible(measurements: Iterable[Measurement], constraints: Constraints) -> list[Measurement]:
    return [m for m in measurements if m.ok and not constraints.violations(m)]


def rank(measurements: Iterable[Measurement], objective: Objective, constraints: Constraints) -> list[Measurement]:
    """Feasible measurements, best first (ties: lower p99, then higher throughput, then key)."""
    return sorted(feasible(measurements, constraints),
                  key=lambda m: (-objective.score(m), m.p99_ms, -m.throughput, m.config_key, m.concurrency))


def best_of(measurements: Iterable[Measurement], objective: Objective, constraints: Constraints) -> Measurement | None:
    ranked = rank(measurements, objective, constraints)
    return ranked[0] if ranked else None


def config_rank(measurements: Iterable[Measurement], objective: Objective,
                constraints: Constraints) -> tuple[int, float]:
    """Comparable rank of one configuration: ``(1, best score)`` when feasible, ``(0, -least excess)`` when
    it only misses constraints, ``(-1, 0)`` when nothing was measured successfully."""
    items = [m for m in measurements if m.ok]
    if not items:
        return (-1, 0.0)
    best = best_of(items, objective, constraints)
    if best is not None:
        return (1, objective.score(best))
    return (0, -min(constraints.excess(m) for m in items))


def recommendable(measurements: Iterable[Measurement], objective: Objective,
                  constraints: Constraints) -> list[Measurement]:
    """Feasible points, best first, trials combined (``measure.points``); when some feasible points were
    verified (measured several times), only those — a single lucky window cannot win."""
    from serving_pod.analyzer.measure import points

    ranked = rank(points(list(measurements)), objective, constraints)
    verified = [m for m in ranked if m.trial > 1]
    return verified or ranked


def closest(measurements: Iterable[Measurement], constraints: Constraints) -> Measurement | None:
    """The successful measurement that misses the constraints by the least (for "impossible" messages)."""
    items = [m for m in measurements if m.ok]
    return min(items, key=lambda m: (constraints.excess(m), m.p99_ms)) if items else None
