"""A dependency-free backend for tests of every layer above the backends.

``backend: "ferry_test"``. Each output ``OUTPUTn`` is ``INPUTn`` (identity; a missing input gives
zeros of the declared shape), so any data type and shape can be exercised. Config parameters:

- ``execute_delay_ms``: sleep this long in every execution (a slow model, for batching tests);
- ``fail_on_value``: an execution whose first input holds this value raises (a model that fails);
- ``fail_load``: "true" makes instance creation fail (a model that fails to load).

Every execution is appended to ``instance.executions`` as the list of batch sizes it ran, so tests
can see exactly how requests were grouped; ``most_running`` is the most executions it ever ran at once, and
``closed`` says whether it was finalized.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from serving_pod.backends.base import InstanceContext
from serving_pod.core.datatypes import config_to_wire, numpy_dtype
from serving_pod.core.errors import InternalError, ModelLoadError, ServerError
from serving_pod.core.types import InferRequest, InferResponse, Tensor


def _param(config, key: str, default: str = "") -> str:
    entry = config.parameters.get(key)
    return entry.string_value if entry is not None else default


class TestInstance:
    """Identity instance with an optional delay and failure trigger."""

    #: never blocks on the engine: may run on the event loop when fast (schedulers/instances.py)
    inline_safe = True

    def __init__(self, context: InstanceContext) -> None:
        config = context.config
        self.context = context
        self.delay_s = float(_param(config, "execute_delay_ms", "0") or 0) / 1000.0
        fail = _param(config, "fail_on_value")
        self.fail_on = float(fail) if fail else None
        self.outputs = [
            (out.name, config_to_wire(_type_name(out.data_type)), tuple(out.dims))
            for out in config.output
        ]
        self.batching = config.max_batch_size > 0
        self.executions: list[list[int]] = []
        self.lock = threading.Lock()
        self.running = self.most_running = 0
        self.closed = False

    def execute(self, requests: list[InferRequest]) -> list[InferResponse | ServerError]:
        with self.lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            return self._execute(requests)
        finally:
            with self.lock:
                self.running -= 1

    def _execute(self, requests: list[InferRequest]) -> list[InferResponse | ServerError]:
        if self.delay_s:
            time.sleep(self.delay_s)
        sizes = [r.inputs[0].data.shape[0] if self.batching and r.inputs else 1 for r in requests]
        with self.lock:
            self.executions.append(sizes)
        results: list[InferResponse | ServerError] = []
        for request in requests:
            inputs = {t.name: t for t in request.inputs}
            first = request.inputs[0].data if request.inputs else None
            if (
                self.fail_on is not None
                and first is not None
                and first.dtype.kind in "iuf"
                and np.any(first == self.fail_on)
            ):
                results.append(InternalError(f"ferry_test model failed on value {self.fail_on}"))
                continue
            outputs = []
            for index, (name, datatype, dims) in enumerate(self.outputs):
                source = inputs.get(f"INPUT{index}") or inputs.get(name.replace("OUTPUT", "INPUT"))
                if source is not None:
                    outputs.append(Tensor(name, datatype, source.data))
                else:
                    shape = ((sizes[0],) if self.batching else ()) + tuple(max(d, 1) for d in dims)
                    outputs.append(Tensor(name, datatype, np.zeros(shape, numpy_dtype(datatype))))
            results.append(InferResponse(request.model_name, request.model_version, outputs, request.id))
        return results

    def close(self) -> None:
        self.closed = True


def _type_name(value: int) -> str:
    from tritonclient.grpc import model_config_pb2 as mc

    return mc.DataType.Name(value)


class TestBackend:
    name = "ferry_test"

    def __init__(self) -> None:
        self.instances: list[TestInstance] = []

    def default_model_filename(self) -> str:
        return ""

    def auto_complete(self, config, model_dir: Path, version_dir: Path | None) -> None:
        return None

    def create_instance(self, context: InstanceContext) -> TestInstance:
        if _param(context.config, "fail_load") == "true":
            raise ModelLoadError(f"model '{context.model_name}': ferry_test asked to fail loading")
        instance = TestInstance(context)
        self.instances.append(instance)
        return instance


def create_backend() -> TestBackend:
    return TestBackend()
