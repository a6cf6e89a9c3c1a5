"""``benchmarks.loadgen``: the client CPU confinement (``--client-cpus``) applied to a real child process."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from benchmarks import loadgen, perfcsv

SHOW_AFFINITY = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]


def spec(cpus: tuple[int, ...]) -> perfcsv.PerfSpec:
    return perfcsv.PerfSpec("m", "127.0.0.1:1", "http", 1, cpus=cpus)


def test_client_runs_only_on_the_cpus_asked_for() -> None:
    last = max(os.sched_getaffinity(0))
    out = subprocess.run(SHOW_AFFINITY, capture_output=True, text=True, check=True, **loadgen.popen_kwargs(spec((last,))))
    assert out.stdout.strip() == f"[{last}]"


def test_without_cpus_the_client_keeps_every_cpu() -> None:
    assert loadgen.popen_kwargs(spec(())) == {}
    out = subprocess.run(SHOW_AFFINITY, capture_output=True, text=True, check=True, **loadgen.popen_kwargs(spec(())))
    assert out.stdout.strip() == str(sorted(os.sched_getaffinity(0)))


def test_client_cpus_option() -> None:
    parser = argparse.ArgumentParser()
    loadgen.add_client_cpus(parser)
    last = max(os.sched_getaffinity(0))
    assert parser.parse_args(["--client-cpus", str(last)]).client_cpus == (last,)
    assert parser.parse_args([]).client_cpus == ()
    with pytest.raises(SystemExit):  # argparse: "not available here", exit 2
        parser.parse_args(["--client-cpus", str(last + 64)])
