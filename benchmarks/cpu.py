"""CPU time per inference around one perf_analyzer point: the server's processes, one by one, and the client.

Throughput alone cannot say where a small machine's time went. Around a point, ``sample`` reads the CPU
seconds (user + system) of the server's process tree (each process apart: Ferry's engine process and its
``--http-workers``, Triton and its python stubs), of this process's finished children (perf_analyzer, which
the point waited for), and the model's ``inference_count`` from the statistics extension that both servers
answer. ``CpuShare`` divides them: microseconds of CPU per inference, and how busy the machine's cores were.
Neighbours: ``servers`` (the process tree and its statistics), ``loadgen.measure_point`` (caller).
"""

from __future__ import annotations

import contextlib
import math
import os
import resource
import time
from dataclasses import dataclass

import psutil

from benchmarks import servers


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds at one instant: per server process (pid -> (name, seconds)) and of finished children."""

    wall: float
    processes: dict[int, tuple[str, float]]
    children: float
    inferences: int


@dataclass(frozen=True)
class CpuShare:
    """CPU per inference between two samples; NaN when no inference was counted.

    ``processes``: (name, µs per inference) for each server process alive at both samples, the root first.
    ``busy``: CPU seconds of server and client over the wall time of every core (1.0: all cores full).
    """

    server_us: float
    client_us: float
    processes: tuple[tuple[str, float], ...]
    busy: float

    def describe(self) -> str:
        if not math.isfinite(self.server_us):
            return "CPU n/a"
        parts = " + ".join(f"{name} {us:.0f}" for name, us in self.processes)
        return (f"CPU us/infer: server {self.server_us:.0f} ({parts}), client {self.client_us:.0f}; "
                f"cores {100 * self.busy:.0f}% busy")


def process_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """(name, CPU seconds) of ``pid`` and its descendants; processes that vanish meanwhile are left out."""
    out: dict[int, tuple[str, float]] = {}
    for proc in servers.process_tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            times = proc.cpu_times()
            name = "server" if proc.pid == pid else proc.name()
            out[proc.pid] = (name, times.user + times.system)
    return out


def inference_count(http_port: int, model: str) -> int:
    """The model's ``inference_count`` summed over versions (-1 when the statistics cannot be read)."""
    try:
        stats = servers.model_stats(http_port, model)
    except (OSError, ValueError, KeyError):
        return -1
    return sum(int(m.get("inference_count", 0)) for m in stats)


def sample(pid: int, http_port: int, model: str) -> CpuSample:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return CpuSample(time.monotonic(), process_cpu(pid), usage.ru_utime + usage.ru_stime,
                     inference_count(http_port, model))


def share(before: CpuSample, after: CpuSample, cpus: int | None = None) -> CpuShare:
    """CPU per inference from ``before`` to ``after`` (see ``CpuShare``)."""
    count = after.inferences - before.inferences
    if before.inferences < 0 or count <= 0:
        return CpuShare(math.nan, math.nan, (), math.nan)
    processes = tuple((name, (seconds - before.processes[pid][1]) * 1e6 / count)
                      for pid, (name, seconds) in after.processes.items() if pid in before.processes)
    server = sum(us for _, us in processes)
    client = (after.children - before.children) * 1e6 / count
    wall = (after.wall - before.wall) * (cpus or os.cpu_count() or 1)
    busy = (server + client) * count / 1e6 / wall if wall > 0 else math.nan
    return CpuShare(server, client, processes, busy)
