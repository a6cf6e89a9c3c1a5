"""Where a load generator runs: ``--client-cpus``, perf_analyzer confined to some CPUs.

On one machine the client competes with the server for its cores, and the kernel tends to pull the
client's threads onto the core of the server thread that wakes them (benchmarks/README.md shows HTTP
throughput falling through a run). Confining perf_analyzer to CPUs of its own measures the server as if
the client ran elsewhere; the server keeps every CPU. Shared by ``ferry-analyzer`` and the benchmarks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable


def parse_cpus(text: str, usable: Iterable[int]) -> tuple[int, ...]:
    """``"1"``, ``"2,3"`` or ``"2-3"`` as sorted CPU numbers, each one of ``usable``; ``""`` is none (any CPU).

    Raises ``ValueError`` naming the problem: not a number, a reversed range, a CPU this process may not use.
    """
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise ValueError(f"invalid CPU list {text!r}: use numbers and ranges such as 1 or 2-3") from None
        if first > last:
            raise ValueError(f"invalid CPU range {part!r}: {first} is above {last}")
        cpus.update(range(first, last + 1))
    allowed = set(usable)
    missing = sorted(cpus - allowed)
    if missing:
        raise ValueError(f"CPU(s) {missing} not available here (this process may use {sorted(allowed)})")
    return tuple(sorted(cpus))


def usable_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity mask)."""
    return set(os.sched_getaffinity(0))


def confined(cpus: Iterable[int]) -> dict:
    """``subprocess`` keyword arguments that run the child on ``cpus`` only; none for an empty list (any CPU)."""
    allowed = set(cpus)
    if not allowed:
        return {}
    return {"preexec_fn": lambda: os.sched_setaffinity(0, allowed)}
