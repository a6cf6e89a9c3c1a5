"""Acceptance 3 of the serving pod issue: NVIDIA's perf_analyzer 2.50 runs unchanged against ``ferry-server``.

``ferry-server`` runs as a real subprocess on free ports with the benchmark's ``double_py`` (python backend)
and ``mlp_onnx`` (onnxruntime) models. perf_analyzer must exit 0 over HTTP and gRPC and print the server-side
breakdown (it does only when the server advertises ``statistics`` and its statistics pass perf_analyzer's own
checks); afterwards Triton's statistics invariants are checked through tritonclient. perf_analyzer is
installed into ``.tools/`` by ``support.perf_analyzer`` or the tests skip with the installer's reason.
"""

from __future__ import annotations

import csv
import http.client
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.perf_analyzer import perf_analyzer_cmd

pytestmark = [pytest.mark.perf_analyzer, pytest.mark.timeout(240)]

BENCH_MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "models"
MODELS = ("double_py", "mlp_onnx")


@dataclass(frozen=True)
class FerryProcess:
    http_port: int
    grpc_port: int
    metrics_port: int
    log: Path

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.http_port if protocol == 'http' else self.grpc_port}"


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _ready(port: int, path: str) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@pytest.fixture(scope="module")
def ferry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FerryProcess]:
    perf_analyzer_cmd()  # skip before starting a server when perf_analyzer cannot be had
    root = tmp_path_factory.mktemp("perf_analyzer")
    repo = root / "models"
    for name in MODELS:
        shutil.copytree(BENCH_MODELS / name, repo / name)
    http_port, grpc_port, metrics_port = _free_ports(3)
    log = root / "ferry-server.log"
    argv = [sys.executable, "-m", "serving_pod.cli", f"--model-repository={repo}", "--model-control-mode=explicit",
            *(f"--load-model={m}" for m in MODELS), f"--http-port={http_port}", f"--grpc-port={grpc_port}",
            f"--metrics-port={metrics_port}", f"--trace-config=triton,file={root / 'trace.json'}"]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        paths = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in MODELS)]
        while not all(_ready(http_port, path) for path in paths):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ferry-server not ready (exit {proc.poll()}):\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
        yield FerryProcess(http_port, grpc_port, metrics_port, log)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _statistics(ferry: FerryProcess, model: str) -> dict:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(ferry.url("http"))
    try:
        (stats,) = client.get_inference_statistics(model)["model_stats"]
    finally:
        client.close()
    return stats


def _assert_invariants(stats: dict) -> None:
    """Triton's invariants, the ones perf_analyzer relies on (triton-compat.md)."""
    infer = stats["inference_stats"]
    assert stats["version"].isdigit(), stats
    success, queue = infer["success"]["count"], infer["queue"]["count"]
    hits = infer["cache_hit"]["count"]
    assert queue == success, f"queue.count {queue} != success.count {success}"
    computes = {k: infer[k]["count"] for k in ("compute_input", "compute_infer", "compute_output")}
    assert set(computes.values()) == {success - hits}, f"compute counts {computes}, success {success}, hits {hits}"
    assert stats["inference_count"] >= stats["execution_count"] > 0, stats
    assert all(infer[k]["ns"] > 0 for k in ("success", "queue", "compute_infer")), infer


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_reports_server_breakdown(ferry: FerryProcess, protocol: str, model: str,
                                                tmp_path: Path) -> None:
    binary, env = perf_analyzer_cmd()
    before = _statistics(ferry, model)["inference_stats"]["success"]["count"]
    csv_path = tmp_path / "perf.csv"
    argv = [str(binary), "-m", model, "-u", ferry.url(protocol), "-i", protocol, "--concurrency-range", "2",
            "--measurement-interval", "1000", "--stability-percentage", "100", "-f", str(csv_path)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"perf_analyzer exit {proc.returncode}:\n{output[-3000:]}"
    assert "Server:" in output, f"no server-side breakdown (statistics extension?):\n{output[-3000:]}"
    for line in ("Inference count:", "Execution count:", "Successful request count:", "queue", "compute input",
                 "compute infer", "compute output"):
        assert line in output.split("Server:")[1], f"{line!r} missing from the server breakdown:\n{output}"
    (row,) = list(csv.DictReader(csv_path.open()))
    assert int(row["Concurrency"]) == 2 and float(row["Inferences/Second"]) > 0
    assert float(row["Server Queue"]) >= 0 and float(row["Server Compute Infer"]) > 0

    stats = _statistics(ferry, model)
    _assert_invariants(stats)
    served = stats["inference_stats"]["success"]["count"] - before
    reported = int(output.split("Server:")[1].split("Successful request count:")[1].split()[0])
    assert served >= reported > 0, f"server counted {served} new requests, perf_analyzer reported {reported}"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_trace_settings_as_tritonserver_takes_them(ferry: FerryProcess, protocol: str) -> None:
    """``--trace-level`` sets the server's trace settings before the run. After a run whose ``--trace-count`` ran
    out, ``--trace-level`` alone keeps that count of 0 and is refused (exit 99) with tritonserver 2.51's words, an
    empty reason after the colon (recorded live against Triton 2.51 with perf_analyzer 2.50); tracing is then
    turned off again for the other tests."""
    import tritonclient.http as httpclient

    binary, env = perf_analyzer_cmd()
    base = [str(binary), "-m", "double_py", "-u", ferry.url(protocol), "-i", protocol, "--measurement-interval",
            "500", "--max-trials", "3", "--stability-percentage", "999", "--trace-level", "TIMESTAMPS"]
    try:
        first = subprocess.run([*base, "--trace-rate", "1", "--trace-count", "1"], env=env, capture_output=True,
                               text=True, timeout=120)
        assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
        again = subprocess.run(base, env=env, capture_output=True, text=True, timeout=120)
        assert again.returncode == 99, again.stdout[-2000:] + again.stderr[-2000:]
        words = "failed to create triton client backend: Attempting to set invalid trace setting :\n"
        assert words in again.stdout + again.stderr, again.stdout[-2000:] + again.stderr[-2000:]
    finally:
        client = httpclient.InferenceServerClient(ferry.url("http"))
        try:
            client.update_trace_settings(settings={"trace_level": ["OFF"], "trace_count": None, "trace_rate": None})
        finally:
            client.close()
