"""``--http-workers``: extra HTTP protocol processes share the one engine (one set of statistics, one model
control), every route works through them, and they go away with the server."""

from __future__ import annotations

import concurrent.futures
import signal
import subprocess
import sys
import time

import httpx
import pytest

from support.server import free_ports, test_model_config, wait_ready, write_model


@pytest.fixture
def server(tmp_path):
    write_model(tmp_path, "m", test_model_config("m"))
    http, grpc_port, metrics = free_ports(3)
    process = subprocess.Popen(
        [sys.executable, "-m", "serving_pod", f"--model-repository={tmp_path}", f"--http-port={http}",
         f"--grpc-port={grpc_port}", f"--metrics-port={metrics}", "--http-address=127.0.0.1",
         "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1", "--http-workers=3",
         "--model-control-mode=explicit", "--load-model=m", "--http-max-input-size=100000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    wait_ready(http, process)
    yield process, http
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


def _workers_of(process: subprocess.Popen) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(process.pid), "-f", "serving_pod.http.workers"],
                         capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def test_requests_through_every_worker_reach_one_engine(server):
    process, http = server
    assert len(_workers_of(process)) == 2
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}

    def one(_: int) -> list:
        # a fresh connection each time, so the kernel spreads them over the accepting processes
        with httpx.Client() as client:
            response = client.post(f"http://127.0.0.1:{http}/v2/models/m/infer", json=body, timeout=30)
        assert response.status_code == 200, response.text
        return response.json()["outputs"][0]["data"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(200)))
    assert all(r == [1, 2, 3, 4] for r in results)
    stats = httpx.get(f"http://127.0.0.1:{http}/v2/models/m/stats", timeout=10).json()["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 200  # one engine counted every request
    # errors, other routes and model control work through the workers too
    bad = httpx.post(f"http://127.0.0.1:{http}/v2/models/absent/infer", json=body, timeout=10)
    assert bad.status_code == 404 and "Request for unknown model: 'absent' is not found" in bad.json()["error"]
    assert httpx.post(f"http://127.0.0.1:{http}/v2/models/m/infer", content=b"{" + b" " * 200000 + b"}",
                      timeout=10).status_code == 400
    assert httpx.post(f"http://127.0.0.1:{http}/v2/repository/models/m/unload", timeout=10).status_code == 200
    for _ in range(10):  # whichever process answers, the model is gone everywhere
        assert httpx.get(f"http://127.0.0.1:{http}/v2/models/m/ready", timeout=10).status_code == 400


def test_workers_exit_with_the_server(server):
    process, http = server
    workers = _workers_of(process)
    assert workers
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(subprocess.run(["kill", "-0", str(p)], capture_output=True).returncode == 0 for p in workers):
        time.sleep(0.1)
    assert not any(subprocess.run(["kill", "-0", str(p)], capture_output=True).returncode == 0 for p in workers)


def test_http_workers_flag_validation():
    result = subprocess.run([sys.executable, "-m", "serving_pod", "--http-workers=0"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "value must be >= 1" in result.stderr
