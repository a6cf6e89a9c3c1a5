"""``--client-cpus``: the CPU list, a real child confined to it, and a real sweep whose perf_analyzer ran there."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from serving_pod.analyzer import placement
from serving_pod.analyzer.checkpoint import FILENAME
from support.perf_analyzer import cached_perf_analyzer

SHOW_AFFINITY = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]


@pytest.mark.parametrize(("text", "cpus"), [("1", (1,)), ("1,0", (0, 1)), ("0-1", (0, 1)), (" 1 , ", (1,)), ("", ())])
def test_parse_cpus(text: str, cpus: tuple[int, ...]) -> None:
    assert placement.parse_cpus(text, {0, 1}) == cpus


@pytest.mark.parametrize(("text", "message"), [
    ("x", "invalid CPU list 'x'"), ("1-x", "invalid CPU list"), ("3-1", "3 is above 1"),
    ("1,7", r"CPU\(s\) \[7\] not available here \(this process may use \[0, 1\]\)"),
])
def test_parse_cpus_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        placement.parse_cpus(text, {0, 1})


def test_confined_child_runs_only_on_the_cpus_asked_for() -> None:
    last = max(placement.usable_cpus())
    out = subprocess.run(SHOW_AFFINITY, capture_output=True, text=True, check=True, **placement.confined([last]))
    assert out.stdout.strip() == f"[{last}]"
    assert placement.confined([]) == {}


def test_sweep_runs_perf_analyzer_on_the_client_cpus(tmp_path: Path, run_profile,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A real one-point sweep with ``--client-cpus``: every perf_analyzer process it started ran on that CPU only
    (a wrapper records its affinity, then execs the real binary), and the checkpoint names the setting."""
    located = cached_perf_analyzer()
    if located.path is None:
        pytest.skip(f"perf_analyzer unavailable: {located.reason}")
    seen = tmp_path / "affinity.log"
    wrapper = tmp_path / "perf_analyzer"
    wrapper.write_text(f"#!/bin/sh\necho \"$1 $(grep Cpus_allowed_list /proc/self/status)\" >> {seen}\n"
                       f"exec {located.path} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    last = max(placement.usable_cpus())
    for name in ("LD_LIBRARY_PATH",):  # the real binary's libraries; the analyzer passes its environment on
        if name in located.env:
            monkeypatch.setenv(name, located.env[name])
    code, stdout = run_profile(
        tmp_path, "--run-config-search-mode", "brute", "--concurrency", "1", "--max-instance-count", "1",
        "--max-batch-sizes", "64", "--dynamic-batching", "on", "--delays-us", "0", "--preferred-batch-sizes", "none",
        "--verify-runs", "0", "--load-generator", "perf_analyzer", "--perf-analyzer", str(wrapper),
        "--client-cpus", str(last))
    assert code == 0, stdout
    probes, runs = [], []
    for line in seen.read_text().splitlines():
        (probes if line.startswith("--version ") else runs).append(line.split(" ", 1)[1])
    assert probes  # locating the binary runs ``--version`` (anywhere: it measures nothing)
    assert len(runs) >= 2  # the model's own config and the candidate, at least one point each
    assert set(runs) == {f"Cpus_allowed_list:\t{last}"}
    checkpoint = json.loads((tmp_path / "ck" / FILENAME).read_text())
    assert checkpoint["settings"]["window"].endswith(f"/client-cpus={last}")
    assert all(m["error"] == "" for m in checkpoint["models"]["mlp_onnx"]["measurements"])
