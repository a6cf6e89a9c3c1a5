"""The onnxruntime backend on a GPU: CUDAExecutionProvider instances, batched, answering as the CPU does.

Marker ``gpu``; skipped without onnxruntime-gpu (``pip install ferry[gpu]``) or a GPU NVML can see. The
model is the embedded ``mlp_onnx``; its answers are compared with a CPU session of the same file (loosely:
CUDA may compute in TF32). A TensorRT accelerator on a machine without TensorRT's libraries is a load error
naming the provider, and the server goes on.
"""

from __future__ import annotations

import ctypes
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving_pod.repository.instance_groups import visible_gpus
from support.server import assert_load_refused

pytestmark = pytest.mark.gpu
PROTOCOLS = ["http", "grpc"]
SOURCE = Path(__file__).parents[3] / "serving_pod" / "default_models" / "mlp_onnx"
TENSORRT = 'optimization { execution_accelerators { gpu_execution_accelerator : [ { name : "tensorrt" } ] } }'


def _ort_with_cuda() -> Any:
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("this onnxruntime has no CUDA (pip install ferry[gpu] on a CUDA machine)")
    if not visible_gpus():
        pytest.skip("no GPU visible to NVML here")
    return ort


def _mlp(repository: Path, name: str, groups: str) -> Path:
    model_dir = repository / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.onnx").write_bytes((SOURCE / "1" / "model.onnx").read_bytes())
    config = (SOURCE / "config.pbtxt").read_text().replace('name: "mlp_onnx"', f'name: "{name}"')
    lines = [line for line in config.splitlines() if not line.startswith("instance_group")]
    (model_dir / "config.pbtxt").write_text("\n".join(lines + [groups]) + "\n")
    return model_dir


def _tensorrt_present() -> bool:
    for soname in ("libnvinfer.so.10", "libnvinfer.so.8"):
        try:
            ctypes.CDLL(soname)
            return True
        except OSError:
            continue
    return False


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cuda_instances_answer_as_the_cpu_session_does(threaded_server: Any, tmp_path: Path, protocol: str) -> None:
    ort = _ort_with_cuda()
    _mlp(tmp_path, "mlp", "instance_group [ { count: 2 kind: KIND_GPU } ]")
    server = threaded_server([tmp_path])
    module, client = server.module(protocol), server.client(protocol)
    cpu = ort.InferenceSession(str(SOURCE / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    batches = [rng.standard_normal((1 + i % 3, 256)).astype(np.float32) for i in range(48)]

    def infer(x: np.ndarray) -> np.ndarray:
        tensor = module.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        return server.client(protocol).infer("mlp", [tensor]).as_numpy("OUTPUT0")

    with ThreadPoolExecutor(8) as pool:  # concurrent requests: the dynamic batcher joins them on the GPU
        answers = list(pool.map(infer, batches))
    for x, answer in zip(batches, answers):
        np.testing.assert_allclose(answer, cpu.run(None, {"INPUT0": x})[0], rtol=1e-2, atol=1e-2)
    stats = client.get_inference_statistics("mlp", as_json=True) if protocol == "grpc" else client.get_inference_statistics("mlp")
    (model,) = stats["model_stats"]
    assert int(model["inference_count"]) == sum(len(x) for x in batches)
    config = client.get_model_config("mlp", as_json=True) if protocol == "grpc" else client.get_model_config("mlp")
    group = config.get("config", config)["instance_group"][0]
    assert group["kind"] == "KIND_GPU" and [int(g) for g in group["gpus"]] == visible_gpus()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_tensorrt_accelerator_without_tensorrt_is_a_load_error_and_the_server_goes_on(
        threaded_server: Any, tmp_path: Path, protocol: str) -> None:
    _ort_with_cuda()
    if _tensorrt_present():
        pytest.skip("TensorRT's libraries are present here")
    _mlp(tmp_path, "trt", f"instance_group [ {{ kind: KIND_GPU }} ]\n{TENSORRT}")
    _mlp(tmp_path, "cuda", "instance_group [ { kind: KIND_GPU } ]")
    assert_load_refused(threaded_server([tmp_path], model_control_mode="explicit"), protocol,
                        "trt", "could not start TensorrtExecutionProvider", loads="cuda")
