"""Process handling of the harness (benchmarks/servers.py) against a tiny real HTTP server, no mocks."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks import servers

# Answers 200 on /v2/health/ready after 0.3 s and on /v2/models/m/ready after 0.6 s; 404 otherwise.
FAKE = textwrap.dedent("""
    import http.server, sys, time
    began = time.monotonic()
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            age = time.monotonic() - began
            ok = {"/v2/health/ready": 0.3, "/v2/models/m/ready": 0.6}.get(self.path)
            self.send_response(200 if ok is not None and age >= ok else 400 if ok else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()
        def log_message(self, *args):
            pass
    print("fake server up", flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def test_free_ports_are_distinct() -> None:
    ports = servers.free_ports()
    assert len({ports.http, ports.grpc, ports.metrics}) == 3


def test_server_times_readiness_of_server_and_models_then_stops(tmp_path: Path) -> None:
    ports = servers.free_ports()
    spec = servers.ServerSpec("fake", (sys.executable, "-c", FAKE, str(ports.http)))
    with servers.Server(spec, ports, tmp_path / "fake.log") as srv:
        startup = srv.start(timeout=30, models=["m"])
        assert 0.6 <= startup < 10
        assert srv.alive() and srv.rss_bytes() > 1_000_000
    assert not srv.alive() and "fake server up" in srv.log_tail()
    assert servers.tree_rss_bytes(2**22 + 12345) == 0  # no such process


def test_server_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    ports = servers.free_ports()
    spec = servers.ServerSpec("broken", (sys.executable, "-c", "print('model failed to load'); raise SystemExit(3)"))
    with pytest.raises(servers.ServerError, match=r"broken exited with 3 before ready: model failed to load"):
        with servers.Server(spec, ports, tmp_path / "broken.log") as srv:
            srv.start(timeout=30)


def test_ferry_spec_uses_tritonserver_flag_names(tmp_path: Path) -> None:
    spec = servers.ferry_spec("ferry", [tmp_path], ["double_py"], servers.Ports(1, 2, 3), ["--log-verbose=1"])
    assert spec.argv[:3] == (sys.executable, "-m", "serving_pod.cli")
    assert spec.argv[3:] == (f"--model-repository={tmp_path}", "--model-control-mode=explicit",
                             "--load-model=double_py", "--http-port=1", "--grpc-port=2", "--metrics-port=3",
                             "--log-verbose=1")


def test_sample_answer_is_the_models_answer_every_time(threaded_server) -> None:
    handle = threaded_server([servers.BENCH_MODELS], model_control_mode="explicit", load_models=("double_py",))
    port = handle.server.http_port
    first = servers.sample_answer(port, "double_py")
    assert first == servers.sample_answer(port, "double_py") and len(first) == 16


# A server that answers like Triton 2.51's python backend under numpy 2: the output's shape, but no bytes.
EMPTY = textwrap.dedent("""
    import http.server, json, sys
    META = {"name": "m", "inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, 4]}],
            "outputs": [{"name": "Y", "datatype": "FP32", "shape": [-1, 4]}]}
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def _send(self, body, headers=()):
            self.send_response(200)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def do_GET(self):
            self._send(json.dumps(META).encode())
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"model_name": "m", "outputs": [{"name": "Y", "datatype": "FP32", "shape": [1, 4],
                                                               "parameters": {"binary_data_size": 0}}]}).encode()
            self._send(body, [("Inference-Header-Content-Length", str(len(body)))])
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def test_sample_answer_refuses_outputs_without_data(tmp_path: Path) -> None:
    ports = servers.free_ports()
    spec = servers.ServerSpec("empty", (sys.executable, "-c", EMPTY, str(ports.http)))
    with servers.Server(spec, ports, tmp_path / "empty.log") as srv:
        srv.start(timeout=30)
        with pytest.raises(servers.ServerError, match="answered output 'Y' of shape \\[1, 4\\] with no data"):
            servers.sample_answer(ports.http, "m")
