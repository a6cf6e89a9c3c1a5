"""What one loopback request/response costs on this machine's kernel: the floor under every server here.

A server answering a client on the same machine pays, per response, a TCP loopback ``send`` that also runs the
client's receive path and wakes the client's thread. On bare metal that is a few microseconds; in a virtual
machine, waking a thread on another (halted) CPU takes an inter-processor interrupt through the hypervisor,
and the same ``send`` can cost ten times more. That cost falls on every request, batched or not, so it moves
every ratio the benchmarks report (batching on/off most: batching shares the model's work, not this).

``probe`` times it directly: a child process echoes one byte for each 300-byte message (the size of a small
infer response), first with the child on another CPU than the sender, then on the same CPU. It reports the
mean ``send`` and round trip in microseconds. ``compare_triton`` and ``batching`` print it and keep it in
their JSON, so figures from different machines can be told apart::

    python -m benchmarks.hostprobe
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

MESSAGE = b"x" * 300

# the echoing client: pinned to one CPU, one byte back for every message until the connection closes
_ECHO = """
import os, socket, sys
os.sched_setaffinity(0, {int(sys.argv[2])})
conn = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while conn.recv(4096):
    conn.send(b"y")
"""


@dataclass(frozen=True)
class LoopbackCost:
    """Mean microseconds of a loopback ``send`` to a client blocked in ``recv``, and of the round trip.

    ``cross``: the client on another CPU than the sender (NaN with one usable CPU); ``same``: both on one CPU.
    """

    send_cross_us: float
    roundtrip_cross_us: float
    send_same_us: float
    roundtrip_same_us: float

    def describe(self) -> str:
        return (f"loopback send to a sleeping client: {self.send_cross_us:.1f} us on another CPU "
                f"(round trip {self.roundtrip_cross_us:.0f} us), {self.send_same_us:.1f} us on the same CPU "
                f"(round trip {self.roundtrip_same_us:.0f} us)")

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def measure(sender_cpu: int, echo_cpu: int, count: int) -> tuple[float, float]:
    """(mean send µs, mean round trip µs) over ``count`` messages, this process pinned to ``sender_cpu``
    while it measures (its affinity is restored after) and the echoing child to ``echo_cpu``."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    child = subprocess.Popen([sys.executable, "-c", _ECHO, str(listener.getsockname()[1]), str(echo_cpu)])
    affinity = os.sched_getaffinity(0)
    conn = None
    try:
        listener.settimeout(10)
        conn, _ = listener.accept()
        conn.settimeout(10)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        os.sched_setaffinity(0, {sender_cpu})
        for _ in range(min(count, 200)):  # warm up: connection, caches, CPU frequency
            conn.send(MESSAGE)
            conn.recv(1)
        send_ns = 0
        start = time.perf_counter_ns()
        for _ in range(count):
            before = time.perf_counter_ns()
            conn.send(MESSAGE)
            send_ns += time.perf_counter_ns() - before
            conn.recv(1)
        total_ns = time.perf_counter_ns() - start
    finally:
        os.sched_setaffinity(0, affinity)
        if conn is not None:
            conn.close()
        listener.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return send_ns / count / 1000, total_ns / count / 1000


def probe(count: int = 3000) -> LoopbackCost:
    """Loopback cost across two CPUs and within one (the first two CPUs this process may use)."""
    if count < 1:
        raise ValueError("count must be at least 1")
    cpus = sorted(os.sched_getaffinity(0))
    cross = measure(cpus[0], cpus[1], count) if len(cpus) > 1 else (math.nan, math.nan)
    same = measure(cpus[0], cpus[0], count)
    return LoopbackCost(cross[0], cross[1], same[0], same[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.hostprobe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=3000, help="messages per measurement")
    args = p.parse_args(argv)
    if args.count < 1:
        p.error("--count must be at least 1")
    print(probe(args.count).describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
