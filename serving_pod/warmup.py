"""Model warmup (``model_warmup`` in config.pbtxt): run sample requests through every instance before READY.

Neighbours: ``core.builder`` calls ``warm_up`` on the registry's loader thread right after a version's instances
exist, so the version only turns READY once every sample ran; ``core.builder.assemble`` then charges the runs it
returns to the version's statistics, as Triton 2.51 counts warmup executions (``inference_count``,
``execution_count``, ``batch_stats``, success and compute times; no response statistics).

Each sample, as Triton builds it (``GenerateWarmupData``): ``batch_size`` requests of one batch element each (a batch
dim of 1 on every input, control inputs too, when the model batches), executed together ``count`` times (0 means
once) per instance; samples with ``batch_size: 0`` are skipped. Inputs: ``zero_data``, ``random_data`` (BYTES get
empty strings, as Triton's zero buffer) or ``input_data_file`` read from ``<model>/warmup/<file>`` (raw row-major
bytes, extra bytes ignored; BYTES: the whole file, length-prefixed elements). Inputs the config does not declare
are Triton's override inputs, added after the request checks and handed to the model as they are (sequence control
and state inputs, of their config data type; any other name too: Triton's QA warms ``bls_model_loading``, a python
model with no inputs, with two); the declared ones are checked as Triton's core checks any request
(``core.validation``: inputs missing, data type, shape), in its words.

Refusals in Triton's words and statuses: a variable dim, no data kind, a short data file and a request check are
``Invalid argument``; an unreadable data file is ``Internal: failed to open text file for read <path>: ...``. A run
that fails is ``Invalid argument: failed to run warmup sample '<s>': `` then each failed request's message and
``"; "``. A decoupled model answers through responders; a sample's run ends with every request's final flag.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core import validation
from serving_pod.core.datatypes import (
    config_to_wire,
    deserialize_bytes,
    element_count,
    numpy_dtype,
)
from serving_pod.core.errors import (
    InternalError,
    ModelLoadError,
    ServerError,
    execution_error,
)
from serving_pod.core.model import Model
from serving_pod.core.types import InferRequest, Tensor

WARMUP_FOLDER = "warmup"
#: what Triton's ``LogRequest()`` prints for a warmup request (it has no id)
_NO_ID = "[request id: <id_unknown>] "
#: the data type a sequence control's value list implies (``ModelSequenceBatching.Control``)
_CONTROL_TYPES = (("int32_false_true", mc.TYPE_INT32), ("fp32_false_true", mc.TYPE_FP32),
                  ("bool_false_true", mc.TYPE_BOOL))


@dataclass
class WarmupRun:
    """One execution of a sample's requests by an instance, charged to the version's statistics once it exists
    (``InstancePool.charge``: times in monotonic ns)."""

    requests: list[InferRequest]
    results: list[Any]
    dispatch_ns: int
    start_ns: int
    end_ns: int
    done_ns: int


def _control_inputs(config: mc.ModelConfig) -> dict[str, int]:
    """Sequence control and state input name -> config data type (Triton's override inputs)."""
    known: dict[str, int] = {}
    batching = config.sequence_batching
    for control in batching.control_input:
        for item in control.control:
            implied = [data_type for field, data_type in _CONTROL_TYPES if len(getattr(item, field))]
            known.setdefault(control.name, implied[0] if implied else item.data_type)
    for state in batching.state:
        known.setdefault(state.input_name, state.data_type)
    return known


def _sample_input(model_dir: Path, name: str, spec: Any, rng: np.random.Generator) -> np.ndarray:
    """One input's data (without a batch dim), or Triton's refusal of its setting."""
    dims = tuple(spec.dims)
    if any(d < 0 for d in dims):
        raise ModelLoadError(f"warmup setting expects all variable-size dimensions are specified for input '{name}'")
    datatype = config_to_wire(mc.DataType.Name(spec.data_type))
    count = element_count(dims)
    kind = spec.WhichOneof("input_data_type")
    if kind is None:
        raise ModelLoadError(f"{_NO_ID}warmup setting expects input '{name}' to have input_data_type set")
    if datatype == "BYTES":
        if kind == "input_data_file":
            data = _read_file(model_dir, spec.input_data_file)
            try:
                return deserialize_bytes(data, count).reshape(dims)
            except ServerError as exc:
                raise ModelLoadError(f"{_NO_ID}warmup data file '{spec.input_data_file}' of input '{name}': "
                                     f"{exc}") from None
        array = np.empty(count, dtype=np.object_)
        array[:] = [b""] * count
        return array.reshape(dims)
    dtype = numpy_dtype(datatype)
    if kind == "zero_data":
        return np.zeros(dims, dtype)
    if kind == "random_data":  # Triton fills random bytes; finite values here (no NaN reaches a model)
        if dtype.kind == "f":
            return rng.random(dims).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, dims).astype(dtype)
        return np.frombuffer(rng.bytes(count * dtype.itemsize), dtype).reshape(dims).copy()
    data = _read_file(model_dir, spec.input_data_file)
    needed = count * dtype.itemsize
    if len(data) < needed:  # Triton's words, but for the space it leaves out before "only"
        raise ModelLoadError(f"{_NO_ID}warmup setting expects {needed} bytes, but the data provided from "
                             f"{spec.input_data_file} only has {len(data)} bytes")
    return np.frombuffer(data[:needed], dtype).reshape(dims).copy()


def _read_file(model_dir: Path, name: str) -> bytes:
    """A sample's data file, in ``<model>/warmup/`` only (Triton reads any path a ``..`` leads to)."""
    path = os.path.join(model_dir, WARMUP_FOLDER, name)
    folder = (model_dir / WARMUP_FOLDER).resolve()
    if folder not in Path(path).resolve().parents:
        raise ModelLoadError(f"warmup setting names input_data_file '{name}' outside the model's "
                             f"'{WARMUP_FOLDER}' folder")
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise InternalError(f"failed to open text file for read {path}: {exc.strerror}") from None


def build_requests(config: mc.ModelConfig, model_dir: Path, version: str, sample: mc.ModelWarmup) -> list[InferRequest]:
    """The ``batch_size`` requests of one sample, checked as Triton checks them."""
    where = f"warmup sample '{sample.name}' of model '{config.name}'"
    limit = max(1, config.max_batch_size)
    if sample.batch_size > limit:  # Triton's python backend fails each run, or its load never ends
        raise ModelLoadError(f"{where}: batch_size {sample.batch_size} exceeds max_batch_size {config.max_batch_size}")
    originals = {tensor.name for tensor in config.input}
    controls = _control_inputs(config)
    rng = np.random.default_rng()
    given: list[Tensor] = []
    overrides: list[Tensor] = []
    for name in sorted(sample.inputs):
        spec = sample.inputs[name]
        array = _sample_input(model_dir, name, spec, rng)
        if config.max_batch_size > 0:
            array = array.reshape((1,) + array.shape)
        tensor = Tensor(name, config_to_wire(mc.DataType.Name(spec.data_type)), array)
        if name in originals:
            given.append(tensor)
            continue
        if name in controls and spec.data_type != controls[name]:
            raise ModelLoadError(f"{where}: input '{name}' is {mc.DataType.Name(spec.data_type)}, the model "
                                 f"expects {mc.DataType.Name(controls[name])}")
        overrides.append(tensor)
    first = InferRequest(config.name, version, given)
    try:
        validation.check(Model(config, int(version), None, None), first)  # type: ignore[arg-type]
    except ServerError as exc:
        raise ModelLoadError(str(exc)) from None
    tensors = given + overrides
    return [
        InferRequest(config.name, version, [Tensor(t.name, t.datatype, t.data) for t in tensors])
        for _ in range(sample.batch_size)
    ]


class _Finals:
    """Responders for a decoupled model's warmup requests: the errors they get, and when every final flag came."""

    def __init__(self, requests: list[InferRequest]) -> None:
        self.errors: list[Any] = [None] * len(requests)
        self._left = len(requests)
        self._done = threading.Event()
        self._lock = threading.Lock()
        for index, request in enumerate(requests):
            request.responder = self._responder(index)

    def _responder(self, index: int) -> Any:
        def respond(item: Any, final: bool) -> None:
            with self._lock:
                if isinstance(item, ServerError) and self.errors[index] is None:
                    self.errors[index] = item
                if final:
                    self._left -= 1
                    if not self._left:
                        self._done.set()

        return respond

    def wait(self) -> None:
        self._done.wait()


def _run(instance: Any, requests: list[InferRequest], decoupled: bool) -> WarmupRun:
    for request in requests:
        request.arrival_ns = time.monotonic_ns()
    finals = _Finals(requests) if decoupled else None
    start_ns = time.monotonic_ns()
    try:
        results = list(instance.execute(requests))
        if len(results) != len(requests):
            results = [execution_error(f"backend returned {len(results)} responses for {len(requests)} requests")
                       ] * len(requests)
    except ServerError as exc:
        results = [exc] * len(requests)
    except Exception as exc:  # a backend bug or a model's exception fails the sample, never the server
        results = [execution_error(f"{type(exc).__name__}: {exc}")] * len(requests)
    results = [r.result() if type(r) is Future else r for r in results]  # answered later by a response sender
    if finals is not None and not any(isinstance(r, ServerError) for r in results):
        finals.wait()
        results = [error if error is not None else result for error, result in zip(finals.errors, results)]
    end_ns = time.monotonic_ns()
    return WarmupRun(requests, results, start_ns, start_ns, end_ns, end_ns)


def warm_up(config: mc.ModelConfig, model_dir: Path, version: str, instances: Sequence[Any]) -> list[WarmupRun]:
    """Run every warmup sample on every instance; the runs to charge, or Triton's ModelLoadError on failure."""
    samples = [
        (sample, build_requests(config, model_dir, version, sample))
        for sample in config.model_warmup
        if sample.batch_size > 0
    ]
    decoupled = config.model_transaction_policy.decoupled
    runs: list[WarmupRun] = []
    for instance in instances:
        for sample, requests in samples:
            for _ in range(max(1, sample.count)):
                run = _run(instance, [_copy(r) for r in requests], decoupled)
                errors = "".join(f"{r}; " for r in run.results if isinstance(r, BaseException))
                if errors:
                    raise ModelLoadError(f"failed to run warmup sample '{sample.name}': {errors}")
                runs.append(run)
    return runs


def _copy(request: InferRequest) -> InferRequest:
    """A fresh request over the sample's tensors (a run sets its own arrival time and responder)."""
    return InferRequest(request.model_name, request.model_version,
                        [Tensor(t.name, t.datatype, t.data) for t in request.inputs])
