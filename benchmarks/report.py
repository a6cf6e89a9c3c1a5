"""Benchmark arithmetic and output: medians over rounds, ratios against a baseline, tables, JSON/CSV files.

Pure functions over :class:`Measurement` values, so the harness's figures are unit-tested
(tests/benchmarks/). Targets of the performance issue: throughput ratio >= 1.2 and p99 ratio <= 1.0
against Triton at every point. Neighbours: ``perfcsv`` (parsing), ``compare_triton`` (the driver).
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

THROUGHPUT_TARGET = 1.2
P99_TARGET = 1.0


@dataclass(frozen=True)
class Measurement:
    """One perf_analyzer point in one round; NaN figures mark a point that failed.

    ``stable=False``: perf_analyzer's windows never agreed, figures are medians of its windows.
    ``server_cpu_us``, ``client_cpu_us``, ``cpu_processes`` (name, µs per server process) and ``cores_busy``:
    CPU per inference as ``cpu.CpuShare`` measured it; NaN and () when unmeasured.
    """

    server: str
    protocol: str
    concurrency: int
    round: int
    throughput: float
    p99_us: float
    stable: bool = True
    server_cpu_us: float = math.nan
    client_cpu_us: float = math.nan
    cpu_processes: tuple[tuple[str, float], ...] = ()
    cores_busy: float = math.nan

    @property
    def ok(self) -> bool:
        return math.isfinite(self.throughput) and math.isfinite(self.p99_us)


@dataclass(frozen=True)
class Summary:
    """Medians over the successful rounds of one point; ``unstable`` of those rounds never stabilized."""

    server: str
    protocol: str
    concurrency: int
    throughput: float
    p99_us: float
    rounds: int
    unstable: int = 0
    server_cpu_us: float = math.nan
    client_cpu_us: float = math.nan


@dataclass(frozen=True)
class Ratio:
    """``server`` over ``baseline`` at one point; throughput wants >= 1.2, p99 wants <= 1.0.

    The ratios are of the medians over rounds; ``throughput_rounds`` and ``p99_rounds`` are the same ratios
    round by round (A B in the same round, side by side), for the rounds where both servers measured the
    point: their spread is what one run's ratio can be trusted to.
    """

    server: str
    baseline: str
    protocol: str
    concurrency: int
    throughput_ratio: float
    p99_ratio: float
    throughput_rounds: tuple[float, ...] = ()
    p99_rounds: tuple[float, ...] = ()

    @property
    def throughput_ok(self) -> bool:
        return self.throughput_ratio >= THROUGHPUT_TARGET

    @property
    def p99_ok(self) -> bool:
        return self.p99_ratio <= P99_TARGET


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def summarize(measurements: Iterable[Measurement]) -> list[Summary]:
    """Group by point (keeping first-seen order) and take medians of the rounds that succeeded."""
    groups: dict[tuple[str, str, int], list[Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.server, m.protocol, m.concurrency), []).append(m)
    out = []
    for (server, protocol, concurrency), items in groups.items():
        good = [m for m in items if m.ok]
        out.append(Summary(server, protocol, concurrency, median([m.throughput for m in good]),
                           median([m.p99_us for m in good]), len(good), sum(not m.stable for m in good),
                           _finite_median([m.server_cpu_us for m in good]),
                           _finite_median([m.client_cpu_us for m in good])))
    return out


def _finite_median(values: Sequence[float]) -> float:
    return median([v for v in values if math.isfinite(v)])


def _divide(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


def ratios(summaries: Sequence[Summary], baseline: str, measurements: Iterable[Measurement] = ()) -> list[Ratio]:
    """Every non-baseline server against ``baseline`` at the points both measured; with ``measurements``,
    also the ratio in each round where both succeeded (``Ratio.throughput_rounds``)."""
    base = {(s.protocol, s.concurrency): s for s in summaries if s.server == baseline}
    rounds: dict[tuple[str, str, int], dict[int, Measurement]] = {}
    for m in measurements:
        if m.ok:
            rounds.setdefault((m.server, m.protocol, m.concurrency), {})[m.round] = m
    out = []
    for s in summaries:
        ref = base.get((s.protocol, s.concurrency))
        if s.server == baseline or ref is None:
            continue
        mine = rounds.get((s.server, s.protocol, s.concurrency), {})
        theirs = rounds.get((baseline, s.protocol, s.concurrency), {})
        pairs = [(mine[r], theirs[r]) for r in sorted(mine) if r in theirs]
        out.append(Ratio(s.server, baseline, s.protocol, s.concurrency,
                         _divide(s.throughput, ref.throughput), _divide(s.p99_us, ref.p99_us),
                         tuple(_divide(m.throughput, b.throughput) for m, b in pairs),
                         tuple(_divide(m.p99_us, b.p99_us) for m, b in pairs)))
    return out


def _fmt(value: float, spec: str) -> str:
    return format(value, spec) if math.isfinite(value) else "n/a"


def _fmt_all(values: Sequence[float]) -> str:
    return " ".join(_fmt(v, ".2f") for v in values)


def format_table(summaries: Sequence[Summary], ratio_rows: Sequence[Ratio]) -> str:
    """Plain-text table: one line per point and server, then the ratios with the targets' verdicts."""
    lines = [f"{'server':<16} {'proto':<5} {'conc':>4} {'infer/s':>10} {'p99 ms':>8} {'rounds':>6} "
             f"{'server CPU us/inf':>17} {'client CPU us/inf':>17}"]
    order = sorted(summaries, key=lambda s: (s.protocol, s.concurrency))
    for s in order:
        rounds = f"{s.rounds}" + (f" ({s.unstable} unstable)" if s.unstable else "")
        lines.append(f"{s.server:<16} {s.protocol:<5} {s.concurrency:>4} {_fmt(s.throughput, '.1f'):>10} "
                     f"{_fmt(s.p99_us / 1000, '.2f'):>8} {rounds:>6} {_fmt(s.server_cpu_us, '.0f'):>17} "
                     f"{_fmt(s.client_cpu_us, '.0f'):>17}")
    if ratio_rows:
        by_round = any(r.throughput_rounds for r in ratio_rows)
        lines += ["", f"{'ratio':<24} {'proto':<5} {'conc':>4} {'thr x':>7} {'p99 x':>7}  "
                      f"targets (thr >= {THROUGHPUT_TARGET}, p99 <= {P99_TARGET})"
                      + ("  round by round: thr x | p99 x" if by_round else "")]
        for r in sorted(ratio_rows, key=lambda r: (r.server, r.protocol, r.concurrency)):
            verdict = (f"thr {'OK' if r.throughput_ok else 'MISS'}, p99 {'OK' if r.p99_ok else 'MISS'}")
            rounds = (f"  {_fmt_all(r.throughput_rounds)} | {_fmt_all(r.p99_rounds)}"
                      if r.throughput_rounds else "")
            lines.append(f"{r.server + '/' + r.baseline:<24} {r.protocol:<5} {r.concurrency:>4} "
                         f"{_fmt(r.throughput_ratio, '.2f'):>7} {_fmt(r.p99_ratio, '.2f'):>7}  {verdict}{rounds}")
    return "\n".join(lines)


def growth(before: float, after: float) -> float:
    """Relative change ``after / before - 1`` (NaN when ``before`` is not positive)."""
    return after / before - 1.0 if before > 0 else math.nan


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    """JSON with NaN written as null (strict JSON readers reject NaN)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_jsonable(payload), indent=2, sort_keys=False) + "\n")


def write_csv(path: Path, rows: Sequence[Any]) -> None:
    """Dataclass rows as CSV with a header from the first row's fields."""
    path.parent.mkdir(parents=True, exist_ok=True)
    dicts = [asdict(r) for r in rows]
    with path.open("w", newline="") as handle:
        if not dicts:
            return
        writer = csv.DictWriter(handle, fieldnames=list(dicts[0]))
        writer.writeheader()
        writer.writerows(dicts)
