"""Search strategies: ``quick`` (coordinate descent + concurrency ladder) and ``brute`` (the full grid).

quick — start at the model's own configuration, then for each dimension in turn (instances, dynamic
batching, max batch size, queue delay, preferred sizes) try every value with the others fixed and move
to the best; repeat while a pass improves (at most ``max_passes``). Each configuration's concurrency is
searched by doubling up the ladder until throughput saturates (< ``saturation`` gain) or the p99 budget
is crossed, then bisected between the last level inside the budget and the first outside it. The
latency objective stops at the lowest level that meets the throughput floor.
brute — every configuration of the grid at every concurrency level.
verify — then, in both modes, the best point of the ``verify_top`` best configurations and the default's
best point are measured ``verify_runs`` more times, round-robin; ``profile`` ranks the medians
(``measure.combine``), so one lucky window on a busy machine cannot pick the winner.
Both only talk to a :class:`Runner`, which loads configurations and measures (or finds the checkpoint's
figures), so resuming replays the same decisions without measuring again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from serving_pod.analyzer.measure import Measurement
from serving_pod.analyzer.objectives import Constraints, Objective, best_of, config_rank
from serving_pod.analyzer.space import DIMENSIONS, ConfigPoint, SearchSpace, neighbours

MODES = ("quick", "brute")


@dataclass(frozen=True)
class Candidate:
    """A configuration under test: ``key`` names it in the checkpoint (``point.key``, or ``"default"`` for a
    model config the space cannot express exactly)."""

    key: str
    point: ConfigPoint


class Runner(Protocol):
    def measure(self, candidate: Candidate, concurrency: int, trial: int = 0) -> Measurement: ...


@dataclass(frozen=True)
class SearchSettings:
    mode: str = "quick"
    max_passes: int = 2
    saturation: float = 0.05
    bisect_steps: int = 2
    verify_top: int = 3
    verify_runs: int = 2


def concurrency_sweep(runner: Runner, candidate: Candidate, levels: Sequence[int], objective: Objective,
                      constraints: Constraints, settings: SearchSettings) -> list[Measurement]:
    """Measurements of ``candidate`` over the concurrency ladder (see the module docstring)."""
    if settings.mode == "brute":
        return [runner.measure(candidate, level) for level in levels]
    budget = constraints.max_p99_ms
    results: list[Measurement] = []
    best_throughput = 0.0
    inside: int | None = None  # highest level measured within the p99 budget
    for level in levels:
        m = runner.measure(candidate, level)
        results.append(m)
        if not m.ok:
            break
        if budget is not None and m.p99_ms > budget:
            if inside is not None and objective.kind != "latency":
                results += _bisect(runner, candidate, inside, level, budget, settings.bisect_steps)
            break
        inside = level
        if objective.kind == "latency" and (constraints.min_throughput is None
                                            or m.throughput >= constraints.min_throughput):
            break  # more concurrency only queues more: the lowest level meeting the floor is the answer
        if best_throughput and m.throughput < best_throughput * (1 + settings.saturation):
            break
        best_throughput = max(best_throughput, m.throughput)
    return results


def _bisect(runner: Runner, candidate: Candidate, low: int, high: int, budget: float,
            steps: int) -> list[Measurement]:
    found = []
    for _ in range(steps):
        if high - low <= 1:
            break
        mid = (low + high) // 2
        m = runner.measure(candidate, mid)
        found.append(m)
        if m.ok and m.p99_ms <= budget:
            low = mid
        else:
            high = mid
    return found


def search(runner: Runner, space: SearchSpace, default: Candidate, objective: Objective,
           constraints: Constraints, settings: SearchSettings) -> dict[str, list[Measurement]]:
    """Every configuration measured, by key (the default's first)."""
    levels = space.concurrencies
    measured: dict[str, list[Measurement]] = {}
    candidates: dict[str, Candidate] = {}

    def evaluate(candidate: Candidate) -> tuple[int, float]:
        candidates.setdefault(candidate.key, candidate)
        if candidate.key not in measured:
            measured[candidate.key] = concurrency_sweep(runner, candidate, levels, objective, constraints, settings)
        return config_rank(measured[candidate.key], objective, constraints)

    default_rank = evaluate(default)
    if settings.mode == "brute":
        for point in space.grid():
            evaluate(Candidate(point.key, point))  # the default's own point, when exact, is cached already
        verify(runner, candidates, measured, default.key, objective, constraints, settings)
        return measured
    current, current_rank = default.point, default_rank
    for _ in range(settings.max_passes):
        moved = False
        for dimension in DIMENSIONS:
            best, best_rank = current, current_rank
            for point in neighbours(space, current, dimension):
                rank = evaluate(Candidate(point.key, point))
                if rank > best_rank:
                    best, best_rank = point, rank
            if best != current:
                current, current_rank, moved = best, best_rank, True
        if not moved:
            break
    verify(runner, candidates, measured, default.key, objective, constraints, settings)
    return measured


def verify(runner: Runner, candidates: dict[str, Candidate], measured: dict[str, list[Measurement]],
           default_key: str, objective: Objective, constraints: Constraints,
           settings: SearchSettings) -> list[Measurement]:
    """Repeat the best points (and the default's best) ``verify_runs`` times, round-robin."""
    bests = [b for ms in measured.values() if (b := best_of(ms, objective, constraints)) is not None]
    bests.sort(key=lambda m: (-objective.score(m), m.config_key))
    chosen = bests[: settings.verify_top]
    default_best = best_of(measured.get(default_key, []), objective, constraints)
    if default_best is not None and default_best not in chosen:
        chosen.append(default_best)
    repeats = []
    for trial in range(1, settings.verify_runs + 1):
        for m in chosen:
            repeats.append(runner.measure(candidates[m.config_key], m.concurrency, trial))
    return repeats
