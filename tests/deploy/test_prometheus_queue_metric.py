"""Queue-time autoscaling signal, proven with a real Prometheus scraping a real ferry-server.

Starts `ferry-server` (subprocess, free ports, 127.0.0.1) on a repository with a deliberately slow
python model (data/slow_models), starts Debian's `prometheus` scraping its metrics port every second
with the `namespace`/`pod` labels Kubernetes discovery would add, then evaluates the exact PromQL
prometheus-adapter sends for `avg_time_queue_us` (the chart's rule, adapter_rules.py) through
Prometheus' HTTP API: ~0 while idle, far above the HPA target while concurrent clients queue.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from support.server import free_ports, stop_process

from . import adapter_rules

DATA = Path(__file__).parent / "data" / "slow_models"
MODEL = "slow_identity"
NAMESPACE, POD = "ferry-test", "ferry-server-0"
HPA_TARGET_US = 50  # Triton's chart: AverageValue 50 µs of queue per request
CLIENTS, LOAD_SECONDS = 8, 6.0


def _get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return bytes(response.read())


def _wait_until(predicate, what: str, timeout: float, proc: subprocess.Popen[bytes] | None = None) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: process exited with {proc.returncode}")
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@dataclass(frozen=True)
class Server:
    http: int
    metrics: int


@pytest.fixture(scope="module")
def ferry_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    try:
        import serving_pod.cli  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"serving_pod.cli (ferry-server) is not importable: {exc}")
    log = tmp_path_factory.mktemp("ferry") / "server.log"
    http_port, metrics_port, grpc_port = free_ports(3)
    server = Server(http=http_port, metrics=metrics_port)
    args = [sys.executable, "-c", "import sys; from serving_pod.cli import main; sys.exit(main())",
            f"--model-repository={DATA}", f"--http-port={server.http}", f"--grpc-port={grpc_port}",
            f"--metrics-port={server.metrics}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1"]
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        ready = f"http://127.0.0.1:{server.http}/v2/health/ready"
        try:
            _wait_until(lambda: _get(ready) is not None, "ferry-server ready", 60, proc)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- server log ---\n{log.read_text()[-4000:]}") from None
        yield server
    finally:
        stop_process(proc)


@dataclass(frozen=True)
class Prometheus:
    url: str

    def query(self, promql: str, at: float | None = None) -> list[dict[str, object]]:
        params = {"query": promql} | ({"time": f"{at:.3f}"} if at is not None else {})
        body = json.loads(_get(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=5))
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def scalar(self, promql: str, at: float | None = None) -> float | None:
        result = self.query(promql, at)
        assert len(result) <= 1, f"expected one series per pod, got {result}"
        return float(result[0]["value"][1]) if result else None  # type: ignore[index]


@pytest.fixture(scope="module")
def prometheus(ferry_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("Debian's prometheus server is not installed (apt-get install -y prometheus)")
    workdir = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
        "scrape_configs": [{
            "job_name": "ferry",
            "static_configs": [{"targets": [f"127.0.0.1:{ferry_server.metrics}"],
                                "labels": {"namespace": NAMESPACE, "pod": POD}}],
        }],
    }
    (workdir / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    (port,) = free_ports(1)
    args = [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    with (workdir / "prometheus.log").open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    try:
        prom = Prometheus(f"http://127.0.0.1:{port}")
        _wait_until(lambda: _get(f"{prom.url}/-/ready"), "prometheus ready", 30, proc)
        yield prom
    finally:
        stop_process(proc)


def _load(http_port: int, stop_at: float) -> int:
    """One client sending back-to-back requests until `stop_at`; returns how many succeeded."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}", network_timeout=30)
    data = np.arange(4, dtype=np.float32)
    sent = 0
    try:
        while time.monotonic() < stop_at:
            tensor = httpclient.InferInput("INPUT0", [4], "FP32")
            tensor.set_data_from_numpy(data)
            result = client.infer(MODEL, [tensor])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
            sent += 1
    finally:
        client.close()
    return sent


def test_adapter_promql_expansion() -> None:
    rule = adapter_rules.load_rules()["avg_time_queue_us"]
    assert rule.promql("ns", ["a", "b"]) == (
        'avg(delta(nv_inference_queue_duration_us{namespace="ns",pod=~"a|b"}[30s])'
        '/(1+delta(nv_inference_request_success{namespace="ns",pod=~"a|b"}[30s]))) by (pod)'
    )
    with pytest.raises(ValueError, match="empty pod list"):
        rule.promql("ns", [])


def test_queue_metric_rises_under_load_and_is_zero_idle(ferry_server: Server, prometheus: Prometheus) -> None:
    rules = adapter_rules.load_rules()
    queue_query = rules["avg_time_queue_us"].promql(NAMESPACE, [POD])
    ratio_query = rules["queue_compute_ratio"].promql(NAMESPACE, [POD])
    success = f'sum(nv_inference_request_success{{namespace="{NAMESPACE}",pod="{POD}",model="{MODEL}"}})'

    # Idle: the series exists (the model is loaded) and the adapter's query gives ~0.
    _wait_until(lambda: prometheus.scalar(success) is not None, "first scrape of the model's series", 20)
    time.sleep(3)  # a few idle samples inside the 30 s delta window
    idle = prometheus.scalar(queue_query)
    assert idle is not None and idle < 1.0, f"idle avg_time_queue_us should be ~0, got {idle}"
    before = prometheus.scalar(success) or 0.0

    # Load: CLIENTS concurrent clients on one slow instance -> each request queues behind the others.
    stop_at = time.monotonic() + LOAD_SECONDS
    with ThreadPoolExecutor(CLIENTS) as pool:
        sent = sum(pool.map(lambda _: _load(ferry_server.http, stop_at), range(CLIENTS)))
    loaded_at = time.time()
    assert sent > CLIENTS, f"only {sent} requests completed"

    # Prometheus sees every request (counter exactness) and the adapter's query crosses the target.
    _wait_until(lambda: (prometheus.scalar(success) or 0.0) - before >= sent, f"{sent} successes scraped", 10)
    under_load = prometheus.scalar(queue_query, at=loaded_at)
    assert under_load is not None and under_load > 100 * HPA_TARGET_US, (
        f"avg_time_queue_us under load = {under_load} µs, expected queueing well above {HPA_TARGET_US} µs"
    )
    # With 8 clients on one instance, a request waits ~7 executions: queue time >> compute time.
    ratio = prometheus.scalar(ratio_query, at=loaded_at)
    assert ratio is not None and ratio > 1.0, f"queue_compute_ratio under load = {ratio}"
    # The idle value, re-evaluated at its old timestamp, stays ~0: the rise comes from the load.
    assert idle < 1.0 < under_load
