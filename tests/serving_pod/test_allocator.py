"""``serving_pod.allocator``: glibc keeps the memory of large tensors for reuse in ``ferry-server``'s processes.

Each case that changes the allocator runs in a child interpreter, so this process keeps glibc's defaults.
"""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from serving_pod.allocator import keep_freed_memory
from support.server import free_ports, wait_ready

ROOT = Path(__file__).resolve().parents[2]
glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's")

# three written 1 MiB blocks freed together, as a request's body, its output and its response are, 100 times;
# prints the page faults the 100 rounds took
CHURN = """
import resource, sys
import numpy as np
from serving_pod.allocator import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory({}) is None
def churn():
    blocks = [np.ones(262144, np.float32) for _ in range(3)]
    del blocks
churn()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(100):
    churn()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", CHURN, mode], capture_output=True, text=True, cwd=ROOT,
                          timeout=60, check=True)
    return int(done.stdout)


@glibc
def test_freed_megabyte_blocks_are_reused_instead_of_faulting_in_fresh_pages() -> None:
    # glibc's defaults hand such blocks back to the kernel, so each round touches fresh pages (256 per MiB)
    assert _faults("default") >= 100 * 256
    assert _faults("keep") < 256  # less than one MiB's pages over all 100 rounds


@pytest.mark.parametrize(("environ", "named"), [
    ({"MALLOC_TRIM_THRESHOLD_": "1048576"}, "MALLOC_TRIM_THRESHOLD_"),
    ({"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TOP_PAD_": "0"}, "MALLOC_MMAP_THRESHOLD_, MALLOC_TOP_PAD_"),
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000"}, "GLIBC_TUNABLES"),
    ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "LD_PRELOAD"),
])
def test_a_users_own_allocator_settings_are_left_alone(environ: dict[str, str], named: str) -> None:
    assert keep_freed_memory(environ) == f"the environment sets {named}"


@glibc
def test_unrelated_settings_do_not_stop_it() -> None:
    code = ("from serving_pod.allocator import keep_freed_memory; "
            "print(keep_freed_memory({'LD_PRELOAD': 'libgomp.so.1', 'GLIBC_TUNABLES': 'glibc.pthread.rseq=0'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                          check=True)
    assert done.stdout.strip() == "None"


def test_not_glibc_is_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert keep_freed_memory({}) == "the C library is not glibc"


@glibc
@pytest.mark.parametrize(("extra_env", "line"), [
    ({}, "malloc: freed blocks up to 32 MiB kept for reuse"),
    ({"MALLOC_TRIM_THRESHOLD_": "1048576"}, "malloc: left as it is: the environment sets MALLOC_TRIM_THRESHOLD_"),
], ids=["default", "user-tuned"])
def test_ferry_server_sets_it_at_start(extra_env: dict[str, str], line: str, tmp_path: Path) -> None:
    http, grpc_port, metrics = free_ports(3)
    argv = [sys.executable, "-m", "serving_pod", f"--model-repository={tmp_path}", "--log-verbose=1",
            f"--http-port={http}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics}"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, **extra_env})
    try:
        wait_ready(http, process)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert f'"{line}"' in stderr, stderr[-2000:]
