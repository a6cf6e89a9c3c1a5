"""Model warmup (``model_warmup`` in config.pbtxt): run sample requests through every instance before READY.

Neighbours: ``core.registry`` calls ``warm_up`` on its loader thread right after a version's
instances exist, so the version only turns READY once every sample ran; an error fails the load
with a ``ModelLoadError`` naming the sample. Statistics are not charged (as in Triton).

Each sample, as Triton builds it: ``batch_size`` requests of one batch element each (no batch dim
when the model does not batch), executed together ``count`` times (0 means once) per instance;
samples with ``batch_size: 0`` are skipped. Inputs: ``zero_data``, ``random_data`` (BYTES get empty
strings, as Triton's zero buffer) or ``input_data_file`` read from ``<model>/warmup/<file>``
(raw row-major bytes; BYTES elements length-prefixed; extra bytes are ignored). Every dim must be
fixed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core.datatypes import config_to_wire, deserialize_bytes, element_count, numpy_dtype
from serving_pod.core.errors import ModelLoadError, ServerError
from serving_pod.core.types import InferRequest, Tensor

WARMUP_FOLDER = "warmup"


def _known_inputs(config: mc.ModelConfig) -> dict[str, int]:
    """Input name -> config data type, including sequence control and state inputs."""
    known = {tensor.name: tensor.data_type for tensor in config.input}
    batching = config.sequence_batching
    for control in batching.control_input:
        for item in control.control:
            known.setdefault(control.name, item.data_type)
    for state in batching.state:
        known.setdefault(state.input_name, state.data_type)
    return known


def _sample_input(
    config: mc.ModelConfig, model_dir: Path, sample: mc.ModelWarmup, name: str, spec: Any, rng: np.random.Generator
) -> np.ndarray:
    where = f"warmup sample '{sample.name}' of model '{config.name}'"
    dims = tuple(spec.dims)
    if any(d < 0 for d in dims):
        raise ModelLoadError(
            f"{where}: warmup setting expects all variable-size dimensions are specified for input '{name}'"
        )
    datatype = config_to_wire(mc.DataType.Name(spec.data_type))
    count = element_count(dims)
    kind = spec.WhichOneof("input_data_type")
    if kind is None:
        raise ModelLoadError(f"{where}: input '{name}' sets none of zero_data, random_data, input_data_file")
    if datatype == "BYTES":
        if kind == "input_data_file":
            data = _read_file(model_dir, spec.input_data_file, where)
            try:
                return deserialize_bytes(data, count).reshape(dims)
            except ServerError as exc:
                raise ModelLoadError(f"{where}: file '{spec.input_data_file}': {exc}") from None
        array = np.empty(count, dtype=np.object_)
        array[:] = [b""] * count
        return array.reshape(dims)
    dtype = numpy_dtype(datatype)
    if kind == "zero_data":
        return np.zeros(dims, dtype)
    if kind == "random_data":
        if dtype.kind == "f":
            return rng.random(dims).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, dims).astype(dtype)
        return np.frombuffer(rng.bytes(count * dtype.itemsize), dtype).reshape(dims).copy()
    data = _read_file(model_dir, spec.input_data_file, where)
    needed = count * dtype.itemsize
    if len(data) < needed:
        raise ModelLoadError(
            f"{where}: warmup setting expects {needed} bytes, but the data provided from "
            f"{spec.input_data_file} only has {len(data)} bytes"
        )
    return np.frombuffer(data[:needed], dtype).reshape(dims).copy()


def _read_file(model_dir: Path, name: str, where: str) -> bytes:
    folder = (model_dir / WARMUP_FOLDER).resolve()
    path = (folder / name).resolve()
    if folder not in path.parents:
        raise ModelLoadError(f"{where}: input_data_file '{name}' must name a file inside {folder}")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"{where}: cannot read input_data_file '{name}': {exc.strerror}") from None


def build_requests(config: mc.ModelConfig, model_dir: Path, version: str, sample: mc.ModelWarmup) -> list[InferRequest]:
    """The ``batch_size`` requests of one sample (validated against the config)."""
    where = f"warmup sample '{sample.name}' of model '{config.name}'"
    limit = max(1, config.max_batch_size)
    if sample.batch_size > limit:
        raise ModelLoadError(f"{where}: batch_size {sample.batch_size} exceeds max_batch_size {config.max_batch_size}")
    known = _known_inputs(config)
    rng = np.random.default_rng()
    tensors: list[Tensor] = []
    for name in sorted(sample.inputs):
        spec = sample.inputs[name]
        if name not in known:
            raise ModelLoadError(f"{where}: model has no input '{name}'")
        if spec.data_type != known[name]:
            raise ModelLoadError(
                f"{where}: input '{name}' is {mc.DataType.Name(spec.data_type)}, the model expects "
                f"{mc.DataType.Name(known[name])}"
            )
        array = _sample_input(config, model_dir, sample, name, spec, rng)
        if config.max_batch_size > 0 and any(t.name == name for t in config.input):
            array = array.reshape((1,) + array.shape)
        tensors.append(Tensor(name, config_to_wire(mc.DataType.Name(spec.data_type)), array))
    return [
        InferRequest(
            config.name,
            version,
            [Tensor(t.name, t.datatype, t.data) for t in tensors],
            id=f"warmup_{sample.name}_{index}",
            arrival_ns=time.monotonic_ns(),
        )
        for index in range(sample.batch_size)
    ]


def warm_up(config: mc.ModelConfig, model_dir: Path, version: str, instances: Sequence[Any], names: Sequence[str]) -> None:
    """Run every warmup sample on every instance; ModelLoadError naming the sample on failure."""
    samples = [
        (sample, build_requests(config, model_dir, version, sample))
        for sample in config.model_warmup
        if sample.batch_size > 0
    ]
    for instance, instance_name in zip(instances, names):
        for sample, requests in samples:
            for _ in range(max(1, sample.count)):
                try:
                    results = list(instance.execute(list(requests)))
                except Exception as exc:  # a backend bug or a model exception fails the load
                    results = [exc]
                errors = [str(r) for r in results if isinstance(r, BaseException)]
                if errors:
                    raise ModelLoadError(
                        f"failed to load '{config.name}': instance '{instance_name}' failed to run "
                        f"warmup sample '{sample.name}': {'; '.join(errors)}"
                    )
