"""Every example in examples/ runs, and every example model answers the same in-process as over HTTP and gRPC."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from types import ModuleType

import numpy as np
import pytest

from serving_pod.pyapi import ModelClient, Server
from support.server import DEFAULT_MODELS, ROOT, TRITON_EXAMPLES

EXAMPLES = ROOT / "examples"
BOUND = ["add_sub", "temperature", "padded", "strings", "streaming"]


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"ferry_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_is_covered() -> None:
    assert sorted(p.stem for p in EXAMPLES.glob("*.py")) == sorted(BOUND + ["in_process_repository"])


@pytest.mark.parametrize(
    "name, expected",
    [
        ("temperature", ["logits 1 at T=0.5: [2. 2. 2. 2.]", "logits 6 at T=2.0: [3. 3. 3. 3.]", "8 requests in"]),
        ("padded", ["3 rows -> [3, 12, 21]", "5 rows -> [3, 12, 21, 30, 39]", "the function saw batches of [4, 4, 8]"]),
        ("strings", ["[b'FERRY!', b'BOAT!'] [5, 4]"]),
        ("streaming", ["[10]\n[11]\n[12]"]),
        ("in_process_repository", ["simple OUTPUT0 (sum): [1, 2, 3, 4]", "simple ready after unload: False",
                                   'nv_inference_count{model="double_py",version="1"} 2']),
    ],
)
def test_example_main_runs(name: str, expected: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    module = example(name)
    module.main() if name != "in_process_repository" else module.main([])
    out = capsys.readouterr().out
    for text in expected:
        assert text in out
    if name == "temperature":  # concurrent requests with mixed temperatures: grouped per call, batched per execution
        executions = int(out.split(" requests in ")[1].split()[0])
        assert executions < 8 and all(rows >= 1 for _, rows in module.CALLS)
        assert {t for t, _ in module.CALLS} == {0.5, 2.0}


def test_add_sub_example_serves_until_interrupted() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    process = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "add_sub.py"), "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        line = process.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("serving add_sub at "), line
        http_url, grpc_url = line.split(" at ")[1].split(" and ")
        for url in (http_url.strip(), grpc_url.strip()):
            with ModelClient(url, "add_sub") as client:
                result = client.infer_sample(a=np.ones(3, np.float32), b=np.full(3, 2.0, np.float32))
                assert result["add"].tolist() == [3.0] * 3 and result["sub"].tolist() == [-1.0] * 3
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=30)
        assert process.returncode == 0, out
        assert "stopped" in out
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def served():
    """One server with the repository models and every bound example model."""
    with Server(DEFAULT_MODELS, http_port=0, grpc_port=0, metrics_port=0) as server:
        for name in BOUND:
            example(name).bind_models(server)
        yield server


def _cases() -> list[tuple[str, str]]:
    cases = [(name, model) for name in BOUND for model in example(name).sample_inputs()]
    cases += [("in_process_repository", model) for model in example("in_process_repository").sample_inputs()]
    return cases


def _same(left: dict[str, np.ndarray], right: dict[str, np.ndarray]) -> None:
    assert sorted(left) == sorted(right)
    for name in left:
        assert left[name].dtype == right[name].dtype, name
        assert left[name].shape == right[name].shape, name
        assert left[name].tolist() == right[name].tolist(), name


@pytest.mark.parametrize("example_name, model", _cases())
def test_in_process_matches_http_and_grpc(served: Server, example_name: str, model: str) -> None:
    inputs = example(example_name).sample_inputs()[model]
    if served.model_config(model).get("model_transaction_policy", {}).get("decoupled"):
        local = [r for r in served.stream(model, inputs)]
        _same_stream(local, _grpc_stream(served, model, inputs))
        return
    local = served.infer(model, inputs)
    for url in (served.http_url, served.grpc_url):
        with ModelClient(url, model) as client:
            _same(local, client.infer_batch(**inputs))


def _grpc_stream(server: Server, model: str, inputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    import queue

    import tritonclient.grpc as grpcclient

    received: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    client.start_stream(callback=lambda result, error: received.put(error or result))
    items = []
    for name, array in inputs.items():
        item = grpcclient.InferInput(name, list(array.shape), "INT32")
        item.set_data_from_numpy(array)
        items.append(item)
    client.async_stream_infer(model, items, enable_empty_final_response=True)
    responses = []
    while True:
        result = received.get(timeout=10)
        assert not isinstance(result, Exception), result
        response = result.get_response()
        if response.outputs:
            responses.append({o.name: result.as_numpy(o.name) for o in response.outputs})
        if response.parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    return responses


def _same_stream(left: list[dict[str, np.ndarray]], right: list[dict[str, np.ndarray]]) -> None:
    assert len(left) == len(right) > 1
    for a, b in zip(left, right):
        _same(a, b)


def _triton_example_inputs(server: Server, model: str) -> dict[str, np.ndarray]:
    metadata = server.model_metadata(model)
    inputs = {}
    for entry in metadata["inputs"]:
        shape = [1 if i == 0 and server.model_config(model)["max_batch_size"] else (3 if d == -1 else d)
                 for i, d in enumerate(entry["shape"])]
        count = int(np.prod(shape))
        if entry["datatype"] == "BYTES":
            inputs[entry["name"]] = np.array([str(i).encode() for i in range(count)], dtype=object).reshape(shape)
        else:
            dtype = {"INT8": np.int8, "INT32": np.int32, "FP32": np.float32}[entry["datatype"]]
            inputs[entry["name"]] = (np.arange(count) % 50).astype(dtype).reshape(shape)
    return inputs


@pytest.mark.skipif(not TRITON_EXAMPLES.is_dir(), reason="Triton's example models are not present")
def test_triton_example_models_match_in_process_and_served() -> None:
    with Server(TRITON_EXAMPLES, http_port=0, grpc_port=0, metrics_port=0) as server:
        models = [row["name"] for row in server.models() if row.get("state") == "READY"]
        plain = [m for m in models if "sequence_batching" not in server.model_config(m)]
        assert {"simple", "simple_identity", "simple_int8", "simple_string"} <= set(plain)
        for model in plain:
            inputs = _triton_example_inputs(server, model)
            local = server.infer(model, inputs)
            for url in (server.http_url, server.grpc_url):
                with ModelClient(url, model) as client:
                    _same(local, client.infer_batch(**inputs))
