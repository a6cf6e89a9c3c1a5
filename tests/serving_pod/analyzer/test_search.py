"""Search strategies against a synthetic server (a deterministic throughput/latency landscape).

The real load path is exercised by ``test_profile.py``; here the strategies' decisions are checked
exactly and fast: what quick mode measures, that it finds the landscape's optimum with fewer points
than brute mode, and how the concurrency ladder stops and bisects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serving_pod.analyzer.measure import Measurement
from serving_pod.analyzer.objectives import Constraints, Objective, best_of
from serving_pod.analyzer.search import Candidate, SearchSettings, concurrency_sweep, search
from serving_pod.analyzer.space import ConfigPoint, SearchSpace


@dataclass
class Landscape:
    """Throughput saturates at a capacity that depends on the point; latency = concurrency / throughput."""

    calls: list[tuple[str, int]] = field(default_factory=list)

    def capacity(self, p: ConfigPoint) -> float:
        capacity = 1000.0 * min(p.instance_count, 2)
        if p.dynamic_batching:
            capacity *= 2.0 + p.max_queue_delay_us / 1000
        return capacity * (1.0 if p.max_batch_size >= 32 else 0.5)

    def measure(self, candidate: Candidate, concurrency: int, trial: int = 0) -> Measurement:
        self.calls.append((candidate.key, concurrency, trial))
        capacity = self.capacity(candidate.point)
        throughput = capacity * concurrency / (concurrency + 1)
        p99 = concurrency / throughput * 1000 * 1.5
        return Measurement("m", candidate.key, concurrency, throughput, p99, trial=trial)


SPACE = SearchSpace(instance_counts=(1, 2, 3), max_batch_sizes=(8, 64), dynamic_batching=(True, False),
                    delays_us=(0, 1000), preferred=("none",), concurrencies=(1, 2, 4, 8, 16, 32, 64))
DEFAULT = Candidate("default", ConfigPoint(1, 8, False))


def test_quick_finds_the_brute_optimum_with_fewer_measurements() -> None:
    objective, constraints = Objective("throughput"), Constraints()
    quick, brute = Landscape(), Landscape()
    measured_quick = search(quick, SPACE, DEFAULT, objective, constraints, SearchSettings("quick"))
    measured_brute = search(brute, SPACE, DEFAULT, objective, constraints, SearchSettings("brute"))
    best_quick = best_of([x for ms in measured_quick.values() for x in ms], objective, constraints)
    best_brute = best_of([x for ms in measured_brute.values() for x in ms], objective, constraints)
    assert best_quick is not None and best_brute is not None
    assert best_quick.config_key == best_brute.config_key == "i2-b64-db1000"
    assert len(quick.calls) < len(brute.calls) * 0.7
    assert len(set(quick.calls)) == len(quick.calls)  # nothing measured twice
    verified = [(key, c) for key, c, trial in quick.calls if trial]
    assert len(verified) == 2 * 4  # 2 runs of the 3 best points and the default's best
    assert ("i2-b64-db1000", best_quick.concurrency) in verified and any(k == "default" for k, _ in verified)


def test_ladder_stops_when_throughput_saturates() -> None:
    runner = Landscape()
    sweep = concurrency_sweep(runner, DEFAULT, SPACE.concurrencies, Objective("throughput"), Constraints(),
                              SearchSettings("quick", saturation=0.05))
    assert [m.concurrency for m in sweep] == [1, 2, 4, 8, 16, 32]  # 64 is not worth measuring
    gains = [b.throughput / a.throughput - 1 for a, b in zip(sweep, sweep[1:])]
    assert gains[-1] < 0.05 <= min(gains[:-1])


def test_ladder_bisects_up_to_the_latency_budget() -> None:
    runner = Landscape()
    # p99 at concurrency c is 1.5*(c+1)/capacity*1000 ms, capacity 500: c=8 -> 27 ms, c=16 -> 51 ms
    sweep = concurrency_sweep(runner, DEFAULT, SPACE.concurrencies, Objective("throughput"),
                              Constraints(max_p99_ms=50.0), SearchSettings("quick", bisect_steps=3))
    levels = [m.concurrency for m in sweep]
    assert levels[:5] == [1, 2, 4, 8, 16]
    assert levels[5:] == [12, 14, 15]  # bisection between 8 (inside) and 16 (outside)
    best = best_of(sweep, Objective("throughput"), Constraints(max_p99_ms=50.0))
    assert best is not None and best.concurrency == 15 and best.p99_ms <= 50.0


def test_latency_objective_stops_at_the_first_level_meeting_the_floor() -> None:
    runner = Landscape()
    sweep = concurrency_sweep(runner, DEFAULT, SPACE.concurrencies, Objective("latency"),
                              Constraints(min_throughput=400.0), SearchSettings("quick"))
    assert [m.concurrency for m in sweep] == [1, 2, 4]  # 250/s, 333/s, then 400/s meets the floor
