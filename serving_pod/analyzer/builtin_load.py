"""The built-in load generator: ``concurrency`` tritonclient aio workers looping on one model.

Used when perf_analyzer is not available. Inputs are random tensors built from the model's metadata
(batch dimension 1, dynamic dimensions 1). One warm-up window is discarded, then three windows of
``measurement_interval_ms`` are measured as one; the result is always flagged stable (no stability
criterion is applied). Latency is the client's: send to response.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from serving_pod.analyzer.loadgen import LoadResult, WindowSettings

_WINDOWS = 3


def _tensor(datatype: str, shape: list[int], rng: np.random.Generator) -> np.ndarray:
    shape = [1 if dim < 0 else dim for dim in shape]
    if datatype == "BYTES":
        return np.array([b"ferry"] * int(np.prod(shape)), dtype=np.object_).reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)
    from tritonclient.utils import triton_to_np_dtype

    dtype = np.dtype(triton_to_np_dtype(datatype))
    if dtype.kind in "iu":
        return rng.integers(0, 8, size=shape).astype(dtype)
    return rng.random(size=shape).astype(dtype)


class BuiltinLoad:
    """A closed-loop load generator with a fixed number of outstanding requests."""

    name = "builtin"

    def __init__(self, window: WindowSettings) -> None:
        self.window = window

    def run(self, url: str, model: str, concurrency: int) -> LoadResult:
        try:
            return asyncio.run(self._run(url, model, concurrency))
        except Exception as exc:  # noqa: BLE001 - any client failure is this point's error, not a crash
            return LoadResult.failed(self.name, f"{type(exc).__name__}: {exc}")

    def _module(self) -> Any:
        if self.window.protocol == "grpc":
            import tritonclient.grpc.aio as module
        else:
            import tritonclient.http.aio as module
        return module

    async def _run(self, url: str, model: str, concurrency: int) -> LoadResult:
        module = self._module()
        client = module.InferenceServerClient(url)
        try:
            metadata = await client.get_model_metadata(model)
            if not isinstance(metadata, dict):  # gRPC returns a protobuf message
                from google.protobuf import json_format

                metadata = json_format.MessageToDict(metadata, preserving_proto_field_name=True)
            rng = np.random.default_rng(0)
            inputs = []
            for spec in metadata["inputs"]:
                shape = [int(d) for d in spec["shape"]]
                array = _tensor(spec["datatype"], shape, rng)
                tensor = module.InferInput(spec["name"], list(array.shape), spec["datatype"])
                tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            window_s = self.window.measurement_interval_ms / 1e3
            latencies: list[float] = []
            errors: list[str] = []
            start = time.monotonic()
            measure_from = start + window_s
            stop_at = measure_from + _WINDOWS * window_s

            async def worker() -> None:
                while (now := time.monotonic()) < stop_at:
                    try:
                        await client.infer(model, inputs)
                    except Exception as exc:  # noqa: BLE001
                        errors.append(str(exc))
                        return
                    if now >= measure_from:
                        latencies.append(time.monotonic() - now)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
            elapsed = time.monotonic() - measure_from
        finally:
            await client.close()
        if errors:
            return LoadResult.failed(self.name, f"inference failed: {errors[0]}")
        if not latencies:
            return LoadResult.failed(self.name, "no request completed inside the measurement window")
        p50, p95, p99 = (float(v) * 1e3 for v in np.percentile(latencies, [50, 95, 99]))
        return LoadResult(len(latencies) / elapsed, p50, p95, p99, True, self.name)
