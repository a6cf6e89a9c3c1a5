"""Objectives, constraints and ranking (pure functions over measurements)."""

from __future__ import annotations

import math

import pytest

from serving_pod.analyzer.errors import InputError
from serving_pod.analyzer.measure import Measurement, failed
from serving_pod.analyzer.objectives import Constraints, Objective, best_of, closest, config_rank, rank


def m(key: str, concurrency: int, throughput: float, p99: float, rss: float | None = 100.0) -> Measurement:
    return Measurement("model", key, concurrency, throughput, p99, rss_mb=rss)


MEASUREMENTS = [m("a", 1, 100, 2.0), m("a", 8, 400, 9.0), m("b", 1, 150, 1.5, rss=300.0), m("b", 8, 700, 20.0),
                failed("model", "c", 1, "boom", "w")]


def test_throughput_objective_picks_the_fastest() -> None:
    assert best_of(MEASUREMENTS, Objective("throughput"), Constraints()) == MEASUREMENTS[3]


def test_latency_objective_picks_the_lowest_p99() -> None:
    assert best_of(MEASUREMENTS, Objective("latency"), Constraints()) == MEASUREMENTS[2]


def test_weighted_objective_balances_both() -> None:
    # scores: ln(t) - ln(p99): a1 3.91, a8 3.79, b1 4.60, b8 3.56
    assert best_of(MEASUREMENTS, Objective("weighted"), Constraints()) == MEASUREMENTS[2]
    throughput_heavy = Objective("weighted", throughput_weight=4, latency_weight=1)
    assert best_of(MEASUREMENTS, throughput_heavy, Constraints()) == MEASUREMENTS[3]


def test_latency_budget_is_never_violated() -> None:
    budget = Constraints(max_p99_ms=10.0)
    ranked = rank(MEASUREMENTS, Objective("throughput"), budget)
    assert ranked and all(x.p99_ms <= 10.0 for x in ranked)
    assert ranked[0] == MEASUREMENTS[1]


def test_memory_and_throughput_floor() -> None:
    constraints = Constraints(max_memory_mb=200, min_throughput=120)
    ranked = rank(MEASUREMENTS, Objective("latency"), constraints)
    assert [x.config_key + str(x.concurrency) for x in ranked] == ["a8", "b8"]
    assert Constraints(max_memory_mb=200).violations(m("x", 1, 1, 1, rss=None))  # unknown memory cannot qualify


def test_impossible_budget_has_no_best_but_a_closest() -> None:
    impossible = Constraints(max_p99_ms=0.001)
    assert best_of(MEASUREMENTS, Objective("throughput"), impossible) is None
    assert closest(MEASUREMENTS, impossible) == MEASUREMENTS[2]
    assert "p99 1.500 ms > budget 0.001 ms" in impossible.violations(MEASUREMENTS[2])[0]


def test_config_rank_orders_feasible_before_near_misses_before_failures() -> None:
    budget, objective = Constraints(max_p99_ms=5.0), Objective("throughput")
    feasible = config_rank(MEASUREMENTS[:2], objective, budget)
    near = config_rank([m("d", 1, 10, 6.0)], objective, budget)
    far = config_rank([m("e", 1, 10, 60.0)], objective, budget)
    broken = config_rank([MEASUREMENTS[4]], objective, budget)
    assert feasible > near > far > broken


def test_gain() -> None:
    best, default = m("b", 8, 700, 20.0), m("a", 8, 400, 10.0)
    assert Objective("throughput").gain(best, default) == pytest.approx(0.75)
    assert Objective("latency").gain(m("x", 1, 1, 5.0), default) == pytest.approx(0.5)
    assert Objective("weighted").gain(best, default) == pytest.approx((700 / 20) / (400 / 10) - 1)


@pytest.mark.parametrize("kwargs", [{"max_p99_ms": 0}, {"min_throughput": -1}, {"max_memory_mb": math.nan}])
def test_invalid_constraints(kwargs) -> None:
    with pytest.raises(InputError, match="must be a positive number"):
        Constraints(**kwargs)


def test_invalid_objective() -> None:
    with pytest.raises(InputError, match="use one of throughput, latency, weighted"):
        Objective("cheapest")
    with pytest.raises(InputError, match="--weights"):
        Objective("weighted", 0, 0)
