"""TensorRT backend: load errors and auto-complete without TensorRT (always), real engines on a GPU (marker ``gpu``).

The GPU tests build a small engine from an ONNX model with TensorRT's own ONNX parser, then serve it
through the backend and compare with the expected arithmetic; they skip with the reason when
tensorrt, cuda-python or a GPU is missing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.backends.base import InstanceContext
from serving_pod.backends.registry import get_backend
from serving_pod.backends.tensorrt import NOT_INSTALLED, TensorRTBackend, plan_path
from serving_pod.core.errors import ModelLoadError
from serving_pod.core.types import InferRequest, RequestedOutput, Tensor
from serving_pod.repository.config import load_config, parse_config_text
from support.models import make_add_sub_model

HAVE_TENSORRT = importlib.util.find_spec("tensorrt") is not None
needs_no_tensorrt = pytest.mark.skipif(HAVE_TENSORRT, reason="tensorrt is installed here")

CONFIG = """
name: "plan"
platform: "tensorrt_plan"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


def plan_model(tmp_path: Path, config: str | None = CONFIG) -> Path:
    model = tmp_path / "plan"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.plan").write_bytes(b"not a real engine")
    if config is not None:
        (model / "config.pbtxt").write_text(config)
    return model


def context(model: Path, config: mc.ModelConfig, kind: str = "KIND_GPU") -> InstanceContext:
    return InstanceContext(model.name, "1", model, model / "1", config, f"{model.name}_0", kind=kind)


def test_backend_identity_and_lazy_registration() -> None:
    backend = get_backend("tensorrt")
    assert isinstance(backend, TensorRTBackend)
    assert backend.default_model_filename() == "model.plan"
    assert (backend.name, backend.platform) == ("tensorrt", "tensorrt_plan")


def test_auto_complete_is_a_no_op_for_a_complete_config(tmp_path: Path) -> None:
    model = plan_model(tmp_path)
    config = load_config(model, "plan")
    before = config.SerializeToString()
    TensorRTBackend().auto_complete(config, model, model / "1")
    assert config.SerializeToString() == before


@needs_no_tensorrt
def test_auto_complete_of_an_incomplete_config_needs_tensorrt(tmp_path: Path) -> None:
    model = plan_model(tmp_path, config='platform: "tensorrt_plan"\nmax_batch_size: 8\n')
    config = load_config(model, "plan")
    with pytest.raises(ModelLoadError) as info:
        TensorRTBackend().auto_complete(config, model, model / "1")
    assert NOT_INSTALLED in str(info.value)
    assert "'plan'" in str(info.value) and "must list every input and output" in str(info.value)


@needs_no_tensorrt
def test_load_without_tensorrt_is_a_clear_error(tmp_path: Path) -> None:
    model = plan_model(tmp_path)
    with pytest.raises(ModelLoadError, match=r"model 'plan': tensorrt is not installed: pip install ferry\[gpu\]"):
        TensorRTBackend().create_instance(context(model, load_config(model, "plan")))


def test_cpu_instances_are_refused(tmp_path: Path) -> None:
    model = plan_model(tmp_path)
    with pytest.raises(ModelLoadError, match="TensorRT plans run on GPUs only; instance 'plan_0' has kind KIND_CPU"):
        TensorRTBackend().create_instance(context(model, load_config(model, "plan"), kind="KIND_CPU"))


def test_missing_plan_file_is_named(tmp_path: Path) -> None:
    model = plan_model(tmp_path)
    (model / "1" / "model.plan").unlink()
    with pytest.raises(ModelLoadError, match="model 'plan': model file .*model.plan not found"):
        plan_path(parse_config_text('name: "plan"', "plan"), model / "1")


# --- real engines (GPU) --------------------------------------------------------------------------


def _gpu_tensorrt():  # type: ignore[no-untyped-def]
    trt = pytest.importorskip("tensorrt", reason="tensorrt is not installed (pip install ferry[gpu])")
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        cudart = pytest.importorskip("cuda.cudart", reason="cuda-python is not installed")
    error, count = cudart.cudaGetDeviceCount()
    if error != cudart.cudaError_t.cudaSuccess or count < 1:
        pytest.skip("no CUDA GPU")
    return trt


def _build_plan(trt, onnx_path: Path, plan: Path, max_batch: int) -> None:  # type: ignore[no-untyped-def]
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(onnx_path.read_bytes()), [parser.get_error(i) for i in range(parser.num_errors)]
    profile = builder.create_optimization_profile()
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        dims = list(tensor.shape)[1:]
        profile.set_shape(tensor.name, [1, *dims], [max_batch, *dims], [max_batch, *dims])
    build = builder.create_builder_config()
    build.add_optimization_profile(profile)
    plan.write_bytes(bytes(builder.build_serialized_network(network, build)))


@pytest.mark.gpu
def test_engine_autocompletes_and_serves_a_batch(tmp_path: Path) -> None:
    trt = _gpu_tensorrt()
    onnx_model = make_add_sub_model(tmp_path / "onnx", "TYPE_FP32", dims=(16,), max_batch=8)
    model = plan_model(tmp_path, config=None)
    _build_plan(trt, onnx_model / "1" / "model.onnx", model / "1" / "model.plan", max_batch=8)
    config = load_config(model, "plan")
    backend = TensorRTBackend()
    backend.auto_complete(config, model, model / "1")
    assert config.max_batch_size == 8
    assert [(t.name, list(t.dims)) for t in config.input] == [("INPUT0", [16]), ("INPUT1", [16])]
    instance = backend.create_instance(context(model, config))
    try:
        a = [np.random.default_rng(i).standard_normal((rows, 16)).astype(np.float32) for i, rows in enumerate((1, 3))]
        b = [np.ones_like(x) for x in a]
        requests = [
            InferRequest("plan", "", [Tensor("INPUT0", "FP32", x), Tensor("INPUT1", "FP32", y)], id=str(i))
            for i, (x, y) in enumerate(zip(a, b))
        ]
        requests[1].outputs = [RequestedOutput("OUTPUT1")]
        first, second = instance.execute(requests)
        np.testing.assert_allclose(first.outputs[0].data, a[0] + 1, rtol=1e-6)
        assert [t.name for t in second.outputs] == ["OUTPUT1"]
        np.testing.assert_allclose(second.outputs[0].data, a[1] - 1, rtol=1e-6)
    finally:
        instance.close()
