"""The rest of tritonserver 2.51's flags (``serving_pod.cli_compat``): a tritonserver command line starts Ferry.

Every flag of ``tritonserver --help`` (2.51) that Ferry had refused as unrecognized is parsed here with a value
in tritonserver's format. The applied ones are checked end to end (custom model configs served, SO_REUSEPORT
on the listening sockets, headers forwarded as request parameters over HTTP and gRPC); the no-effect ones must be
reported; the features Ferry lacks must be refused
with the reason when a value would turn them on.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from typing import Any

import httpx
import pytest

from support.cli import cli_options, refusal
from support.server import test_model_config, write_model

#: flags of ``tritonserver --help`` (2.51) that ``ferry-server`` refused before, with a value each
TRITONSERVER_ONLY = [
    "--allow-sagemaker=false", "--allow-vertex-ai=false", "--backend-directory=/opt/tritonserver/backends",
    "--buffer-manager-thread-count=0", "--cache-directory=/opt/tritonserver/caches",
    "--cuda-memory-pool-byte-size=0:67108864", "--cuda-virtual-address-size=0:1073741824",
    "--enable-peer-access=true", "--host-policy=gpu0,numa-node=0", "--http-thread-count=8",
    "--metrics-config=summary_latencies=false", "--metrics-interval-ms=2000",
    "--min-supported-compute-capability=6.0", "--model-config-name=h100", "--model-load-gpu-limit=0:0.8",
    "--model-load-retry-count=0", "--model-load-thread-count=4", "--model-namespacing=false",
    "--pinned-memory-pool-byte-size=268435456", "--repoagent-directory=/opt/tritonserver/repoagents",
    "--reuse-grpc-port=false", "--reuse-http-port=false", "--sagemaker-port=8080",
    "--sagemaker-safe-port-range=8000-9000", "--sagemaker-thread-count=8", "--vertex-ai-port=8080",
    "--vertex-ai-thread-count=8", "--vertex-ai-default-model=m",
]


def test_every_tritonserver_flag_is_accepted():
    options = cli_options(*TRITONSERVER_ONLY)
    assert options.engine.model_config_name == "h100"
    assert (options.reuse_http_port, options.reuse_grpc_port) == (False, False)
    ignored = "; ".join(options.ignored_flags)
    for flag in ("--backend-directory", "--http-thread-count", "--pinned-memory-pool-byte-size",
                 "--cuda-memory-pool-byte-size", "--model-load-thread-count", "--metrics-interval-ms"):
        assert f"{flag} (no effect: " in ignored
    assert "--model-config-name" not in ignored and "--reuse-http-port" not in ignored  # those are applied
    assert cli_options().ignored_flags == ()


def test_metrics_config_reaches_the_engine():
    """Applied (``core.latency_metrics``): each setting in tritonserver's words; the ones ignored are warned of."""
    from serving_pod.core.latency_metrics import LatencyMetricsSettings

    assert cli_options().engine.latency_metrics == LatencyMetricsSettings()
    options = cli_options("--metrics-config=summary_latencies=true", "--metrics-config", "counter_latencies=false",
                       "--metrics-config=histogram_latencies=true", "--metrics-config=summary_quantiles=0.9:0.01")
    assert options.engine.latency_metrics == LatencyMetricsSettings(False, True, True, ((0.9, 0.01),))
    assert options.startup_warnings == ()
    assert cli_options("--model-load-retry-count=3").engine.model_load_retry_count == 3
    options = cli_options("--metrics-config=summary_latencies=yes", "--metrics-config=summary_quantiles=0.9")
    assert options.engine.latency_metrics == LatencyMetricsSettings()
    assert len(options.startup_warnings) == 2 and "summary_latencies=yes" in options.startup_warnings[0]


@pytest.mark.parametrize(("argv", "message"), [
    (["--allow-sagemaker=true"], "--allow-sagemaker=true: not supported (Ferry has no SageMaker endpoint)"),
    (["--allow-vertex-ai=1"], "--allow-vertex-ai=true: not supported (Ferry has no Vertex AI endpoint)"),
    (["--model-namespacing=true"], "--model-namespacing=true: not supported"),
    (["--model-load-retry-count=-1"], "value must be >= 0, got -1"),
    (["--grpc-max-connection-age=-5"], "value must be >= 0, got -5"),
    (["--metrics-config=nonsense"], "invalid setting 'nonsense': expected <setting>=<value>"),
    (["--cuda-memory-pool-byte-size=lots"], "invalid value 'lots': expected <device>:<value>"),
    (["--host-policy=numa"], "invalid --host-policy 'numa'"),
    (["--http-header-forward-pattern=("], "invalid regular expression '('"),
    (["--model-config-name=../etc"], "invalid --model-config-name '../etc'"),
    (["--http-thread-count=0"], "value must be >= 1"),
])
def test_values_ferry_cannot_honour_exit_2_with_the_reason(argv, message, capsys):
    assert message in refusal(capsys, *argv)


def test_no_effect_flags_are_logged_at_start(tmp_path):
    """The server says which given flags do nothing (and why) before it serves; checked on the real CLI."""
    from support.server import free_ports

    http, grpc, metrics = free_ports(3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "serving_pod.cli", f"--model-repository={tmp_path}", f"--http-port={http}",
         f"--grpc-port={grpc}", f"--metrics-port={metrics}", "--http-thread-count=8", "--backend-directory=/x",
         "--metrics-config=summary_quantiles=0.9"],
        stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while "flags accepted with no effect" not in line:
            line = proc.stderr.readline() if proc.stderr else ""
            assert line, "the server exited without the note"
        assert "--backend-directory (no effect: the backends are built into Ferry)" in line
        assert "--http-thread-count (no effect: HTTP requests run on the event loop" in line
        # then each --metrics-config setting ignored, as tritonserver logs them
        line = proc.stderr.readline() if proc.stderr else ""
        assert "summary_quantiles: invalid option [0.9]. No ':' delimiter found" in line
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_model_config_name_serves_the_custom_config(threaded_server, tmp_path):
    """``configs/<name>.pbtxt`` where a model has one (Triton's custom configurations), else config.pbtxt."""
    custom = write_model(tmp_path, "custom", test_model_config("custom", max_batch_size=8))
    (custom / "configs").mkdir()
    (custom / "configs" / "h100.pbtxt").write_text(test_model_config("custom", max_batch_size=2))
    (custom / "configs" / "a100.pbtxt").write_text(test_model_config("custom", max_batch_size=4))
    write_model(tmp_path, "plain", test_model_config("plain", max_batch_size=8))
    server = threaded_server([tmp_path], model_config_name="h100")
    config = httpx.get(f"http://{server.http_url}/v2/models/custom/config").json()
    assert config["max_batch_size"] == 2
    assert httpx.get(f"http://{server.http_url}/v2/models/plain/config").json()["max_batch_size"] == 8
    # without the flag the same repository serves config.pbtxt
    other = threaded_server([tmp_path])
    assert httpx.get(f"http://{other.http_url}/v2/models/custom/config").json()["max_batch_size"] == 8


def test_model_config_name_errors_name_the_file(threaded_server, tmp_path):
    broken = write_model(tmp_path, "broken", test_model_config("broken"))
    (broken / "configs").mkdir()
    (broken / "configs" / "h100.pbtxt").write_text('name: "other"\n')
    server = threaded_server([tmp_path], model_config_name="h100")
    index = {row["name"]: row for row in server.client("http").get_model_repository_index()}
    assert index["broken"]["state"] == "UNAVAILABLE"
    assert "model name 'other' in configs/h100.pbtxt does not match the model directory 'broken'" in (
        index["broken"]["reason"])


def _can_bind_again(port: int) -> bool:
    """Whether another socket with SO_REUSEPORT can bind ``port`` (only if the listener set it too)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        sock.close()


@pytest.mark.parametrize("grpc_server", ["native", "grpcio"])
def test_reuse_port_flags(threaded_server, tmp_path, grpc_server):
    write_model(tmp_path, "m", test_model_config("m"))
    shared = threaded_server([tmp_path], reuse_http_port=True, reuse_grpc_port=True, grpc_server=grpc_server)
    assert _can_bind_again(shared.server.http_port) and _can_bind_again(shared.server.grpc_port)
    alone = threaded_server([tmp_path], grpc_server=grpc_server)
    assert not _can_bind_again(alone.server.http_port) and not _can_bind_again(alone.server.grpc_port)


ECHO_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "PARAMS", np.array([request.parameters().encode()], dtype=np.object_))]) for request in requests]
"""
ECHO_CONFIG = """
name: "echo"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


@pytest.fixture
def echo_repo(tmp_path):
    model = write_model(tmp_path, "echo", ECHO_CONFIG)
    (model / "1" / "model.py").write_text(ECHO_MODEL)
    return tmp_path


def _http_params(server, path: str, headers: dict[str, str]) -> tuple[int, Any]:
    body = {"inputs": [{"name": "X", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    response = httpx.post(f"http://{server.http_url}{path}", json=body, headers=headers, timeout=30)
    if response.status_code != 200:
        return response.status_code, response.json()["error"]
    return 200, json.loads(response.json()["outputs"][0]["data"][0])


@pytest.mark.parametrize("path", ["/v2/models/echo/infer", "/v2/models/echo/infer?via=asgi"], ids=["direct", "asgi"])
def test_http_headers_matching_the_pattern_become_parameters(threaded_server, echo_repo, path):
    server = threaded_server([echo_repo], http_header_forward="^[Xx]-")
    status, params = _http_params(server, path, {"X-Tenant": "acme", "x-trace": "t1", "Other": "no"})
    assert status == 200 and params == {"X-Tenant": "acme", "x-trace": "t1"}  # names as sent, as Triton keeps them
    # and matched as sent: Triton's pattern is case-sensitive
    lower = threaded_server([echo_repo], http_header_forward="^x-")
    assert _http_params(lower, path, {"X-Tenant": "acme", "x-trace": "t1"}) == (200, {"x-trace": "t1"})
    plain = threaded_server([echo_repo])  # no pattern: nothing forwarded
    assert _http_params(plain, path, {"X-Tenant": "acme"}) == (200, {})
    # a header named like a reserved parameter is refused, as Triton does
    everything = threaded_server([echo_repo], http_header_forward=".*")
    status, error = _http_params(everything, path, {"timeout": "5"})
    assert status == 400 and error == "Header 'timeout' is reserved for Triton usage and cannot be forwarded."
    assert _http_params(everything, path, {"Timeout": "5"})[1]["Timeout"] == "5"  # another name to Triton


@pytest.mark.parametrize("path", ["/v2/models/echo/infer", "/v2/models/echo/infer?via=asgi"], ids=["direct", "asgi"])
def test_http_headers_of_an_upgrade_request_are_forwarded_as_sent(threaded_server, echo_repo, path):
    """An upgrade request (``curl --http2``'s ``Upgrade: h2c``) is read again without its upgrade (``http.limits``);
    its headers keep the names as sent, so the pattern matches them as for any other request."""
    server = threaded_server([echo_repo], http_header_forward="^[Xx]-")
    headers = {"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c", "HTTP2-Settings": "AAMAAABkAARAAAAAAAIAAAAA",
               "X-Tenant": "acme"}
    assert _http_params(server, path, headers) == (200, {"X-Tenant": "acme"})


@pytest.mark.parametrize("grpc_server", ["native", "grpcio"])
def test_grpc_metadata_matching_the_pattern_becomes_parameters(threaded_server, echo_repo, grpc_server):
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    server = threaded_server([echo_repo], grpc_header_forward="^x-", grpc_server=grpc_server)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("X", [1], "FP32")
    tensor.set_data_from_numpy(np.ones(1, np.float32))
    result = client.infer("echo", [tensor], headers={"x-tenant": "acme", "other": "no"})
    assert json.loads(result.as_numpy("PARAMS")[0]) == {"x-tenant": "acme"}
    strict = threaded_server([echo_repo], grpc_header_forward="^triton", grpc_server=grpc_server)
    with pytest.raises(InferenceServerException) as info:
        grpcclient.InferenceServerClient(strict.grpc_url).infer("echo", [tensor], headers={"triton_x": "1"})
    assert "Header 'triton_x' is reserved for Triton usage and cannot be forwarded." in info.value.message()
