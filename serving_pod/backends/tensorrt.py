"""TensorRT backend (name ``tensorrt``, platform ``tensorrt_plan``, file ``model.plan``).

Neighbours: ``backends/base.py`` (the interface), ``graph_signature.py`` (auto-complete and
config-vs-engine checks, shared with onnxruntime), ``batched.py`` (batch execution: merge, one
``execute_async_v3``, split).

Uses the TensorRT 10 Python API (named I/O tensors) and CUDA through ``cuda-python``
(``cuda.bindings.runtime``, or the older ``cuda.cudart``); both are imported only when a plan is
read, and their absence is a clear load error ("tensorrt is not installed: pip install ferry[gpu]").
Each instance owns an execution context and a CUDA stream on its GPU, and device buffers that grow to
the largest batch seen and are then reused. Engines with dynamic shapes use optimization profile 0;
a batch outside it fails with INVALID_ARG naming the input. TensorRT plans run on GPUs only, so
KIND_CPU instances are refused at load, as Triton does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.backends import graph_signature as signature
from serving_pod.backends.base import InstanceContext
from serving_pod.backends.batched import BatchedInstance, build_plan
from serving_pod.backends.graph_signature import Infos, TensorInfo
from serving_pod.core.datatypes import WIRE_TO_NUMPY, config_to_wire
from serving_pod.core.errors import InternalError, InvalidArgumentError, ModelLoadError, UnsupportedError

NOT_INSTALLED = "tensorrt is not installed: pip install ferry[gpu]"

#: TensorRT DataType names -> Triton config types.
TRT_TO_CONFIG: dict[str, str] = {
    "FLOAT": "TYPE_FP32",
    "HALF": "TYPE_FP16",
    "BF16": "TYPE_BF16",
    "INT8": "TYPE_INT8",
    "UINT8": "TYPE_UINT8",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "BOOL": "TYPE_BOOL",
}


def load_tensorrt(model: str) -> Any:
    try:
        import tensorrt
    except ImportError:
        raise ModelLoadError(f"model '{model}': {NOT_INSTALLED}") from None
    return tensorrt


def load_cudart(model: str) -> Any:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        try:
            from cuda import cudart  # cuda-python < 12.6
        except ImportError:
            raise ModelLoadError(f"model '{model}': cuda-python is not installed: pip install ferry[gpu]") from None
    return cudart


def plan_path(config: mc.ModelConfig, version_dir: Path) -> Path:
    path = version_dir / (config.default_model_filename or "model.plan")
    if not path.is_file():
        raise ModelLoadError(f"model '{config.name}': model file {path} not found")
    return path


def deserialize(trt: Any, path: Path, model: str) -> Any:
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise ModelLoadError(
            f"failed to load model '{model}': TensorRT could not deserialize {path} (built for another "
            "TensorRT version or GPU?)"
        )
    return engine


def engine_tensors(trt: Any, engine: Any) -> tuple[Infos, Infos, int]:
    """(inputs, outputs, largest batch of profile 0 or 0) of a deserialized engine."""
    inputs: Infos = {}
    outputs: Infos = {}
    max_batch = 0
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        dtype = engine.get_tensor_dtype(name).name
        info = TensorInfo(
            name=name,
            config_type=TRT_TO_CONFIG.get(dtype, ""),
            shape=tuple(int(dim) for dim in engine.get_tensor_shape(name)),
            source_type=f"TensorRT {dtype}",
        )
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            inputs[name] = info
            if info.shape and info.shape[0] == -1 and engine.num_optimization_profiles > 0:
                profile_max = engine.get_tensor_profile_shape(name, 0)[2]
                max_batch = int(profile_max[0]) if not max_batch else min(max_batch, int(profile_max[0]))
        else:
            outputs[name] = info
    return inputs, outputs, max_batch


class TensorRTBackend:
    """Creates TensorRT instances (one execution context and CUDA stream each)."""

    name = "tensorrt"
    platform = "tensorrt_plan"

    def default_model_filename(self) -> str:
        return "model.plan"

    def auto_complete(self, config: mc.ModelConfig, model_dir: Path, version_dir: Path | None) -> None:
        if version_dir is None or signature.is_complete(config):
            return
        try:
            trt = load_tensorrt(config.name)
        except ModelLoadError as exc:
            raise ModelLoadError(
                f"{exc}; without it the configuration must list every input and output"
            ) from None
        engine = deserialize(trt, plan_path(config, version_dir), config.name)
        inputs, outputs, profile_batch = engine_tensors(trt, engine)
        signature.autocomplete(config, inputs, outputs, profile_batch or 1)

    def create_instance(self, context: InstanceContext) -> TensorRTInstance:
        model = context.model_name
        if context.kind not in ("KIND_GPU", "KIND_MODEL"):
            raise ModelLoadError(
                f"model '{model}': TensorRT plans run on GPUs only; instance '{context.name}' has kind "
                f"{context.kind}, use KIND_GPU"
            )
        trt = load_tensorrt(model)
        cudart = load_cudart(model)
        _check(cudart, cudart.cudaSetDevice(context.device_id), f"cudaSetDevice({context.device_id})", model)
        engine = deserialize(trt, plan_path(context.config, context.version_dir), model)
        inputs, outputs, _ = engine_tensors(trt, engine)
        signature.check_against_graph(context.config, inputs, outputs)
        return TensorRTInstance(engine, context, inputs, outputs, cudart)


def _check(cudart: Any, result: Any, what: str, model: str) -> Any:
    """Unpack a cuda-python ``(error, *values)`` result; raise on a CUDA error."""
    error, *values = result if isinstance(result, tuple) else (result,)
    if error != cudart.cudaError_t.cudaSuccess:
        _, text = cudart.cudaGetErrorString(error)
        raise InternalError(f"model '{model}': CUDA {what} failed: {text.decode() if isinstance(text, bytes) else text}")
    return values[0] if len(values) == 1 else values


class TensorRTInstance(BatchedInstance):
    """An execution context with its own stream and reusable device buffers."""

    #: copies and ``execute_async_v3`` run in native code without the GIL (``schedulers.instances``)
    releases_gil = True

    def __init__(self, engine: Any, context: InstanceContext, inputs: Infos, outputs: Infos, cudart: Any) -> None:
        self._plan = build_plan(context, inputs, outputs)
        self._cudart = cudart
        self._device = context.device_id
        self._engine = engine
        self._context = engine.create_execution_context()
        if self._context is None:
            raise ModelLoadError(f"model '{context.model_name}': TensorRT could not create an execution context")
        self._stream = _check(cudart, cudart.cudaStreamCreate(), "cudaStreamCreate", context.model_name)
        self._input_dtypes = {name: WIRE_TO_NUMPY[config_to_wire(info.config_type)] for name, info in inputs.items()}
        self._output_dtypes = {name: WIRE_TO_NUMPY[config_to_wire(info.config_type)] for name, info in outputs.items()}
        #: name -> (device pointer, capacity in bytes)
        self._buffers: dict[str, tuple[int, int]] = {}
        self._device_set = False

    def _infer(self, feeds: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
        cudart, context, model = self._cudart, self._context, self._plan.model_name
        if not self._device_set:  # the worker thread is not the loader thread
            _check(cudart, cudart.cudaSetDevice(self._device), "cudaSetDevice", model)
            self._device_set = True
        host_inputs = []
        for name, dtype in self._input_dtypes.items():
            if name not in feeds:
                raise InvalidArgumentError(f"input '{name}' is required by model '{model}'")
            array = np.ascontiguousarray(feeds[name], dtype=dtype)
            host_inputs.append(array)  # alive until the stream is synchronized
            if not context.set_input_shape(name, array.shape):
                raise InvalidArgumentError(
                    f"input '{name}' of model '{model}' has shape {list(array.shape)}, outside the "
                    "engine's optimization profile"
                )
            pointer = self._buffer(name, array.nbytes)
            self._copy(pointer, array.ctypes.data, array.nbytes, "HostToDevice")
            context.set_tensor_address(name, pointer)
        shapes = {}
        for name, dtype in self._output_dtypes.items():
            shape = tuple(int(dim) for dim in context.get_tensor_shape(name))
            if any(dim < 0 for dim in shape):
                raise UnsupportedError(f"model '{model}': output '{name}' has a data-dependent shape {list(shape)}")
            shapes[name] = shape
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            context.set_tensor_address(name, self._buffer(name, nbytes))
        if not context.execute_async_v3(int(self._stream)):
            raise InternalError(f"TensorRT failed to execute model '{model}'")
        results = []
        for name in names:
            out = np.empty(shapes[name], dtype=self._output_dtypes[name])
            self._copy(out.ctypes.data, self._buffers[name][0], out.nbytes, "DeviceToHost")
            results.append(out)
        _check(cudart, cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize", model)
        return results

    def _buffer(self, name: str, nbytes: int) -> int:
        pointer, capacity = self._buffers.get(name, (0, 0))
        if nbytes > capacity or not pointer:
            if pointer:
                _check(self._cudart, self._cudart.cudaFree(pointer), "cudaFree", self._plan.model_name)
            size = max(nbytes, 256)
            pointer = int(_check(self._cudart, self._cudart.cudaMalloc(size), "cudaMalloc", self._plan.model_name))
            self._buffers[name] = (pointer, size)
        return pointer

    def _copy(self, dst: int, src: int, nbytes: int, kind: str) -> None:
        if nbytes:
            cudart = self._cudart
            memcpy_kind = getattr(cudart.cudaMemcpyKind, f"cudaMemcpy{kind}")
            _check(cudart, cudart.cudaMemcpyAsync(dst, src, nbytes, memcpy_kind, self._stream), "cudaMemcpyAsync", self._plan.model_name)

    def close(self) -> None:
        cudart = self._cudart
        for pointer, _ in self._buffers.values():
            cudart.cudaFree(pointer)
        self._buffers.clear()
        if self._stream is not None:
            cudart.cudaStreamDestroy(self._stream)
            self._stream = None
        self._context = None
        self._engine = None


def create_backend() -> TensorRTBackend:
    """Entry point used by ``backends.registry``."""
    return TensorRTBackend()
