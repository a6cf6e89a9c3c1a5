"""``ferry-server`` as users run it: tritonserver's flags and defaults, bad flags, the embedded default repository,
and the SIGTERM lifecycle (not ready -> drain in-flight -> finalize -> exit 0), as a real subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from serving_pod.cli import build_parser, default_repository, options_from_args
from support.server import free_ports, wait_ready

SLOW_MODEL = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.marker = args["model_repository"] + "/finalized"

    def execute(self, requests):
        time.sleep(1.5)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]

    def finalize(self):
        open(self.marker, "w").write("bye")
'''

SLOW_CONFIG = '''
name: "slow"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
'''


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "serving_pod", *args], capture_output=True, text=True, timeout=60)


def test_defaults_match_tritonserver():
    options = options_from_args(build_parser().parse_args([]))
    assert (options.http_port, options.grpc_port, options.metrics_port) == (8000, 8001, 8002)
    engine = options.engine
    assert engine.model_control_mode == "none" and engine.repository_poll_secs == 15.0
    assert engine.strict_readiness is True and engine.exit_timeout_secs == 30.0
    assert options.http_max_input_size == 64 * 1024 * 1024
    assert engine.server_id == "triton"
    assert engine.model_repositories == (default_repository(),)


def test_flags_parse_like_tritonserver():
    args = build_parser().parse_args([
        "--model-repository=/a", "--model-store", "/b", "--model-control-mode=explicit", "--load-model=x",
        "--load-model", "y", "--strict-readiness=false", "--allow-grpc=0", "--backend-config=onnxruntime,enable-global-threadpool=1",
        "--backend-config=default-max-batch-size=8", "--id=ferry", "--log-verbose=1", "--disable-auto-complete-config",
    ])
    options = options_from_args(args)
    engine = options.engine
    assert engine.model_repositories == ("/a", "/b")
    assert engine.load_models == ("x", "y") and engine.model_control_mode == "explicit"
    assert engine.strict_readiness is False and options.allow_grpc is False
    assert engine.backend_config == {"onnxruntime": {"enable-global-threadpool": "1"}, "": {"default-max-batch-size": "8"}}
    assert engine.server_id == "ferry" and engine.autocomplete is False


def test_default_instance_kind_flag_and_operator_env(monkeypatch, tmp_path):
    from serving_pod.core.errors import ModelLoadError
    from serving_pod.repository.instance_groups import visible_gpus
    from serving_pod.repository.prepare import prepare_config
    from support.server import test_model_config, write_model

    assert options_from_args(build_parser().parse_args([])).engine.default_instance_kind == "KIND_AUTO"
    monkeypatch.setenv("FERRY_INSTANCE_KIND", "KIND_GPU")  # what the operator sets on GPU pods
    assert options_from_args(build_parser().parse_args([])).engine.default_instance_kind == "KIND_GPU"
    model_dir = write_model(tmp_path, "m", test_model_config("m"))
    if visible_gpus():
        pytest.skip("a GPU is visible here; tests/serving_pod/repository/test_instance_groups.py covers this host")
    with pytest.raises(ModelLoadError, match="instance group m of model m has kind KIND_GPU but no GPUs are available"):
        prepare_config("m", model_dir, default_instance_kind="KIND_GPU")  # as Triton refuses KIND_GPU with no GPU
    config, _, _ = prepare_config("m", model_dir)
    assert config.instance_group[0].kind == 2  # KIND_CPU: no GPU visible here


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--http-port=eighty"], "Invalid option value. Got eighty"),  # tritonserver's words
        (["--http-port=70000"], "port 70000 is outside 0..65535"),
        (["--strict-readiness=maybe"], "invalid value for bool option: maybe"),
        (["--model-control-mode=sometimes"], "invalid argument for --model-control-mode"),
        (["--backend-config=nonsense"], "--backend-config option format is '<backend name>,<setting>=<value>'. Got nonsense"),
        (["--exit-timeout-secs=-1"], "value must be >= 0"),
    ],
)
def test_bad_flags_exit_2_with_a_clear_error(argv, fragment):
    result = _run_cli(*argv)
    assert result.returncode == 2
    assert fragment in result.stderr


def test_sigterm_drains_in_flight_requests_and_finalizes(tmp_path):
    model_dir = tmp_path / "slow"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(SLOW_CONFIG)
    (model_dir / "1" / "model.py").write_text(SLOW_MODEL)
    http, grpc_port, metrics = free_ports(3)
    process = subprocess.Popen(
        [sys.executable, "-m", "serving_pod", f"--model-repository={tmp_path}", f"--http-port={http}",
         f"--grpc-port={grpc_port}", f"--metrics-port={metrics}", "--http-address=127.0.0.1",
         "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1", "--exit-timeout-secs=20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        wait_ready(http, process)
        result: dict = {}

        def slow_request() -> None:
            body = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1.5, 2.5]}]}
            result["response"] = httpx.post(f"http://127.0.0.1:{http}/v2/models/slow/infer", json=body, timeout=30)

        worker = threading.Thread(target=slow_request)
        worker.start()
        time.sleep(0.5)  # the request is executing
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        ready = httpx.get(f"http://127.0.0.1:{http}/v2/health/ready", timeout=5)
        assert ready.status_code == 400  # not ready while draining
        refused = httpx.post(f"http://127.0.0.1:{http}/v2/models/slow/infer",
                             json={"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}, timeout=5)
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]
        worker.join(30)
        assert result["response"].status_code == 200
        assert result["response"].json()["outputs"][0]["data"] == [1.5, 2.5]
        assert process.wait(30) == 0
        assert (model_dir / "finalized").read_text() == "bye"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_default_repository_serves_out_of_the_box():
    """README command 1: ``ferry-server`` with no repository serves the embedded default models."""
    http, grpc_port, metrics = free_ports(3)
    process = subprocess.Popen(
        [sys.executable, "-m", "serving_pod", f"--http-port={http}", f"--grpc-port={grpc_port}",
         f"--metrics-port={metrics}", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
         "--metrics-address=127.0.0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ},
    )
    try:
        wait_ready(http, process)
        index = httpx.post(f"http://127.0.0.1:{http}/v2/repository/index", json={}, timeout=5).json()
        names = {row["name"] for row in index if row.get("state") == "READY"}
        expected = {p.name for p in Path(default_repository()).iterdir() if p.is_dir()}
        assert names == expected and {"simple", "add_sub_py"} <= names
        a = np.arange(16, dtype=np.int32)
        b = np.full(16, 2, dtype=np.int32)
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": a.tolist()},
                           {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": b.tolist()}]}
        outputs = {o["name"]: o["data"] for o in httpx.post(f"http://127.0.0.1:{http}/v2/models/simple/infer", json=body, timeout=10).json()["outputs"]}
        assert outputs["OUTPUT0"] == (a + b).tolist() and outputs["OUTPUT1"] == (a - b).tolist()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0


@pytest.mark.parametrize("disabled", [None, "--allow-grpc=false", "--allow-metrics=false"])
def test_start_lines_name_each_started_service_as_tritonserver(disabled, tmp_path):
    """tritonserver logs ``Started GRPCInferenceService at``, ``Started HTTPService at`` and ``Started Metrics
    Service at`` <address>:<port>, one line each, in that order, for the services it started only."""
    http, grpc_port, metrics = free_ports(3)
    (tmp_path / "empty").mkdir()
    argv = [sys.executable, "-m", "serving_pod", f"--model-repository={tmp_path / 'empty'}",
            f"--http-port={http}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics}",
            "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"]
    process = subprocess.Popen([*argv, *([disabled] if disabled else [])],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(http, process)
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    # tritonserver 2.51 writes each message as a JSON string: ``... server.py:192] "Started HTTPService at ..."``
    started = [json.loads(line.split("] ", 1)[-1]) for line in stderr.splitlines() if '] "Started ' in line]
    expected = [f"Started GRPCInferenceService at 127.0.0.1:{grpc_port}", f"Started HTTPService at 127.0.0.1:{http}",
                f"Started Metrics Service at 127.0.0.1:{metrics}"]
    dropped = {"--allow-grpc=false": expected[0], "--allow-metrics=false": expected[2]}.get(disabled or "")
    assert started == [line for line in expected if line != dropped], stderr
