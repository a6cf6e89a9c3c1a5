"""CPU per inference around a point (benchmarks/cpu.py): the arithmetic, a real process tree, real statistics."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient

from benchmarks import cpu, loadgen, perfcsv, servers
from support.perf_analyzer import perf_analyzer_cmd
from support.server import ServerThread, make_options, test_model_config, write_model


def test_share_divides_each_process_and_the_client_by_the_inferences() -> None:
    before = cpu.CpuSample(10.0, {1: ("server", 1.0), 2: ("python", 0.5), 3: ("gone", 0.1)}, 2.0, 1000)
    after = cpu.CpuSample(12.0, {1: ("server", 1.6), 2: ("python", 0.7), 4: ("late", 0.3)}, 2.5, 11_000)
    used = cpu.share(before, after, cpus=2)
    # 10,000 inferences: 0.6 s and 0.2 s of server CPU, 0.5 s of client CPU; processes not in both are left out
    assert used.processes == (("server", pytest.approx(60.0)), ("python", pytest.approx(20.0)))
    assert used.server_us == pytest.approx(80.0) and used.client_us == pytest.approx(50.0)
    assert used.busy == pytest.approx(1.3 / 4.0)  # 1.3 CPU seconds over 2 s on 2 cores
    assert used.describe() == "CPU us/infer: server 80 (server 60 + python 20), client 50; cores 32% busy"


@pytest.mark.parametrize("before_count, after_count", [(-1, 50), (50, 50), (50, -1)])
def test_share_is_nan_without_counted_inferences(before_count: int, after_count: int) -> None:
    before = cpu.CpuSample(0, {1: ("server", 0)}, 0, before_count)
    used = cpu.share(before, cpu.CpuSample(1, {1: ("server", 1)}, 1, after_count))
    assert math.isnan(used.server_us) and math.isnan(used.client_us) and used.processes == ()
    assert used.describe() == "CPU n/a"


def test_process_cpu_reads_each_process_of_a_real_tree() -> None:
    # a parent that starts a child; the child burns 0.3 s of CPU, says so, and waits
    child = ("import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
             "print('burnt', flush=True)\ntime.sleep(30)\n")
    parent = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {child!r}])\n"
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "burnt"
        tree = cpu.process_cpu(proc.pid)
        (root_pid, (root_name, root_s)), (child_pid, (child_name, child_s)) = tree.items()
        assert root_pid == proc.pid and root_name == "server" and root_s < 0.25
        assert child_pid != proc.pid and child_name.startswith("python") and child_s >= 0.25
    finally:
        for leftover in psutil.Process(proc.pid).children(recursive=True):
            leftover.kill()
        proc.kill()
        proc.wait()
    assert cpu.process_cpu(proc.pid) == {}  # gone


def test_waited_child_cpu_is_counted_for_the_client() -> None:
    before = cpu.sample(2**22 + 12345, servers.free_ports().http, "m")  # no server there: count -1
    assert before.inferences == -1 and before.processes == {}
    subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.2\n"
                    "while time.process_time() < end: pass\n"], check=True)
    after = cpu.sample(2**22 + 12345, servers.free_ports().http, "m")
    assert after.children - before.children >= 0.15  # the waited child's CPU seconds


def test_inference_count_from_a_real_server(tmp_path: Path) -> None:
    write_model(tmp_path, "fp32", test_model_config("fp32"))
    thread = ServerThread(make_options([tmp_path]))
    handle = thread.start()
    try:
        port = handle.server.http_port
        assert cpu.inference_count(port, "fp32") == 0
        client = httpclient.InferenceServerClient(handle.http_url)
        tensor = httpclient.InferInput("INPUT0", [3, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((3, 4), np.float32))
        client.infer("fp32", [tensor])
        client.close()
        assert cpu.inference_count(port, "fp32") == 3  # a batch of 3 counts 3 inferences, as in Triton
        assert cpu.inference_count(port, "no_such_model") == -1
    finally:
        thread.stop()


@contextlib.contextmanager
def _serving_fp32(tmp_path: Path) -> Iterator[Any]:
    """An in-process server with the test model ``fp32``: this process is the server, perf_analyzer the client."""
    write_model(tmp_path / "repo", "fp32", test_model_config("fp32"))
    thread = ServerThread(make_options([tmp_path / "repo"]))
    try:
        yield thread.start()
    finally:
        thread.stop()


@pytest.mark.perf_analyzer
def test_measure_point_gives_cpu_per_inference_of_a_real_run(tmp_path: Path) -> None:
    """perf_analyzer against an in-process server: this process is the server, perf_analyzer the client."""
    binary, env = perf_analyzer_cmd()
    with _serving_fp32(tmp_path) as handle:
        spec = perfcsv.PerfSpec("fp32", handle.http_url, "http", 2, 500, 99, max_trials=3,
                                cpus=(max(os.sched_getaffinity(0)),))  # --client-cpus
        res, measurement, used = loadgen.measure_point(
            [str(binary)], env, spec, tmp_path / "logs", "point", server="ferry", round_no=1,
            server_pid=os.getpid(), http_port=handle.server.http_port)
    assert res.ok and res.throughput > 0
    assert (measurement.server, measurement.protocol, measurement.concurrency) == ("ferry", "http", 2)
    assert measurement.server_cpu_us == used.server_us > 0 and measurement.client_cpu_us == used.client_us > 0
    assert used.processes[0][0] == "server" and 0 < used.busy <= 1.0 + 1e-6


@pytest.mark.perf_analyzer
def test_warm_up_loads_the_server_for_the_time_asked_and_zero_skips_it(tmp_path: Path) -> None:
    binary, env = perf_analyzer_cmd()
    with _serving_fp32(tmp_path) as handle:
        port = handle.server.http_port
        spec = perfcsv.PerfSpec("fp32", handle.http_url, "http", 2)
        loadgen.warm_up([str(binary)], env, spec, tmp_path / "logs", "skipped", 0)
        assert cpu.inference_count(port, "fp32") == 0 and not (tmp_path / "logs" / "skipped.log").exists()
        loadgen.warm_up([str(binary)], env, spec, tmp_path / "logs", "warm", 0.5)
        assert cpu.inference_count(port, "fp32") > 0
    # one window of the asked length, whatever perf_analyzer made of its stability
    log = (tmp_path / "logs" / "warm.log").read_text()
    assert "--measurement-interval 500" in log and "--max-trials 1" in log
