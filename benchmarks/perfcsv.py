"""perf_analyzer 2.50 invocation and output parsing (pure functions, no processes).

:func:`perf_args` builds the command-line flags for one measurement point; :func:`parse_csv` reads the file
written by ``-f`` (one row per concurrency, latencies in microseconds); :func:`parse_server_breakdown` reads
the ``Server:`` block of its stdout, which perf_analyzer prints only when the server advertises the
``statistics`` extension. Neighbours: ``report`` (medians, ratios, tables), ``servers`` (processes).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass

PROTOCOLS = ("http", "grpc")
_REQUIRED = ("Concurrency", "Inferences/Second", "p99 latency")


class PerfOutputError(ValueError):
    """perf_analyzer output that cannot be read as expected."""


@dataclass(frozen=True)
class PerfSpec:
    """One perf_analyzer run: a model, a server endpoint, a protocol and one concurrency level.

    Runs are verbose (``-v``) so every window's throughput and p99 appear in stdout (see
    :func:`unstable_estimate`). ``cpus`` (empty: any) confines perf_analyzer to those CPUs (``--client-cpus``).
    """

    model: str
    url: str
    protocol: str
    concurrency: int
    measurement_interval_ms: int = 3000
    percentile: int | None = 99
    stability_percentage: float = 10.0
    max_trials: int = 10
    extra: tuple[str, ...] = ()
    cpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.measurement_interval_ms < 100:
            raise ValueError(f"measurement interval must be >= 100 ms, got {self.measurement_interval_ms}")


def perf_args(spec: PerfSpec, csv_path: str) -> list[str]:
    """Flags for perf_analyzer (the binary itself is prepended by the caller)."""
    args = ["-m", spec.model, "-u", spec.url, "-i", spec.protocol,
            "--concurrency-range", str(spec.concurrency),
            "--measurement-interval", str(spec.measurement_interval_ms),
            "--stability-percentage", f"{spec.stability_percentage:g}",
            "--max-trials", str(spec.max_trials), "-f", csv_path, "-v"]
    if spec.percentile is not None:
        args.append(f"--percentile={spec.percentile}")
    return [*args, *spec.extra]


@dataclass(frozen=True)
class PerfRow:
    """One CSV row; latencies in microseconds as perf_analyzer writes them."""

    concurrency: int
    throughput: float
    p50_us: float
    p90_us: float
    p95_us: float
    p99_us: float
    server_queue_us: float
    server_compute_infer_us: float
    client_send_us: float
    client_recv_us: float


def _number(row: dict[str, str], column: str, *, default: float | None = None) -> float:
    raw = row.get(column)
    if raw is None or raw.strip() == "":
        if default is not None:
            return default
        raise PerfOutputError(f"perf_analyzer CSV row has no {column!r} value: {row}")
    try:
        return float(raw)
    except ValueError:
        raise PerfOutputError(f"perf_analyzer CSV column {column!r} is not a number: {raw!r}") from None


def parse_csv(text: str) -> list[PerfRow]:
    """Rows of a perf_analyzer ``-f`` CSV file (first table only; a blank line ends it)."""
    lines = []
    for line in text.splitlines():
        if not line.strip():
            break
        lines.append(line)
    if not lines:
        raise PerfOutputError("perf_analyzer CSV is empty")
    reader = csv.DictReader(io.StringIO("\n".join(lines)))
    header = reader.fieldnames or []
    missing = [c for c in _REQUIRED if c not in header]
    if missing:
        raise PerfOutputError(f"perf_analyzer CSV lacks columns {missing}; header was {header}")
    rows = []
    for row in reader:
        rows.append(PerfRow(
            concurrency=int(_number(row, "Concurrency")),
            throughput=_number(row, "Inferences/Second"),
            p50_us=_number(row, "p50 latency", default=0.0),
            p90_us=_number(row, "p90 latency", default=0.0),
            p95_us=_number(row, "p95 latency", default=0.0),
            p99_us=_number(row, "p99 latency"),
            server_queue_us=_number(row, "Server Queue", default=0.0),
            server_compute_infer_us=_number(row, "Server Compute Infer", default=0.0),
            client_send_us=_number(row, "Client Send", default=0.0),
            client_recv_us=_number(row, "Client Recv", default=0.0),
        ))
    if not rows:
        raise PerfOutputError("perf_analyzer CSV has a header but no rows")
    return rows


@dataclass(frozen=True)
class ServerBreakdown:
    """The server-side statistics perf_analyzer derived from ModelStatistics for one window."""

    inference_count: int
    execution_count: int
    success_count: int
    request_latency_us: int
    overhead_us: int
    queue_us: int
    compute_input_us: int
    compute_infer_us: int
    compute_output_us: int


_SERVER_BLOCK = re.compile(
    r"Server:\s*\n"
    r"\s*Inference count:\s*(?P<inference>\d+)\s*\n"
    r"\s*Execution count:\s*(?P<execution>\d+)\s*\n"
    r"\s*Successful request count:\s*(?P<success>\d+)\s*\n"
    r"\s*Avg request latency:\s*(?P<latency>\d+) usec\s*\(overhead (?P<overhead>\d+) usec"
    r" \+ queue (?P<queue>\d+) usec \+ compute input (?P<cin>\d+) usec"
    r" \+ compute infer (?P<cinf>\d+) usec \+ compute output (?P<cout>\d+) usec\)")


def parse_server_breakdown(stdout: str) -> list[ServerBreakdown]:
    """Every ``Server:`` block in perf_analyzer's stdout (empty when the server gave no statistics)."""
    return [ServerBreakdown(int(m["inference"]), int(m["execution"]), int(m["success"]), int(m["latency"]),
                            int(m["overhead"]), int(m["queue"]), int(m["cin"]), int(m["cinf"]), int(m["cout"]))
            for m in _SERVER_BLOCK.finditer(stdout)]


_PASS = re.compile(r"Pass \[(\d+)\] throughput: ([0-9.]+) infer/sec\. p99 latency: (\d+) usec")


def parse_passes(stdout: str) -> list[tuple[float, float]]:
    """``(throughput, p99_us)`` of every window perf_analyzer printed with ``-v`` and ``--percentile=99``."""
    return [(float(m[2]), float(m[3])) for m in _PASS.finditer(stdout)]


def unstable_estimate(stdout: str) -> tuple[float, float] | None:
    """Medians over the windows of a run that never stabilized, the first (warm-up) window left out.

    On a busy machine p99 jumps between windows even when throughput is steady; the medians are the
    honest figure then, and callers flag them as unstable.
    """
    import statistics

    passes = parse_passes(stdout)
    passes = passes[1:] if len(passes) > 2 else passes
    if not passes:
        return None
    return statistics.median(t for t, _ in passes), statistics.median(p for _, p in passes)


def unstable(stdout: str) -> bool:
    """perf_analyzer gave up because windows never agreed within the stability percentage (exit code 2)."""
    return "Failed to obtain stable measurement" in stdout


def concurrency_list(text: str) -> list[int]:
    """Parse ``"1,2,4"`` or ``"1..64"`` (powers of two) into concurrency levels; clear error otherwise."""
    text = text.strip()
    if ".." in text:
        low_s, _, high_s = text.partition("..")
        low, high = _positive(low_s), _positive(high_s)
        if low > high:
            raise ValueError(f"concurrency range {text!r}: start {low} is above end {high}")
        levels, level = [], low
        while level < high:
            levels.append(level)
            level *= 2
        return [*levels, high]
    levels = [_positive(part) for part in text.split(",") if part.strip()]
    if not levels:
        raise ValueError("concurrency list is empty")
    return levels


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"concurrency must be a positive integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"concurrency must be a positive integer, got {value}")
    return value


def join_command(parts: Sequence[str]) -> str:
    """Shell-quoted command for logs and the README."""
    import shlex

    return " ".join(shlex.quote(p) for p in parts)
