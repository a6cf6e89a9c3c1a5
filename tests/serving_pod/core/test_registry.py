"""A failed load leaves nothing behind in the rate limiter, through a real server with ``--rate-limit``.

``steady`` (2 instances, each holding 1 of the global resource R) is loaded first; with default
capacities R then has 1 copy, so its two instances never execute together. A model whose instances
need 4 of R and fails to load must not leave its demands registered: such ghosts would raise R's
default capacity to 4 and let ``steady``'s instances run concurrently.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

import serving_pod.core.builder as builder_module
from serving_pod.core.errors import ModelLoadError
from serving_pod.core.types import InferRequest, Tensor
from serving_pod.schedulers.rate_limiter import limiter_for
from support.server import ServerHandle, test_model_config, write_model

R = ("global", "R")
STEADY = {R: (1, 1)}


def limited_model(repository: Path, name: str, count: int, *, extra: str = "", versions=(1,)) -> None:
    write_model(repository, name, test_model_config(name, max_batch_size=1, extra=f"""
parameters {{ key: "execute_delay_ms" value {{ string_value: "100" }} }}
instance_group [ {{ count: 2 kind: KIND_CPU rate_limiter {{ resources [ {{ name: "R" global: true count: {count} }} ] }} }} ]
version_policy {{ all {{ }} }}
{extra}
"""), versions=versions)


async def start(tmp_path: Path, server_factory) -> ServerHandle:
    limited_model(tmp_path, "steady", 1)
    handle = await server_factory(
        [tmp_path], rate_limit="execution_count", model_control_mode="explicit", load_models=("steady",),
    )
    limiter = limiter_for(handle.engine)
    assert limiter is not None and limiter.registrations() == STEADY and limiter.capacity(R) == 1
    return handle


async def infer(handle: ServerHandle, model: str, value: float) -> float:
    data = np.full((1, 4), value, np.float32)
    response = await handle.engine.infer(InferRequest(model, "", [Tensor("INPUT0", "FP32", data)]))
    return float(response.outputs[0].data[0, 0])


async def steady_overlap(handle: ServerHandle) -> int:
    """Most ``steady`` executions running at once while four requests are in flight."""
    spans: list[tuple[float, float]] = []
    for instance in handle.engine.registry.get("steady").pool.instances:
        original = instance.execute

        def execute(requests, original=original):
            start_s = time.monotonic()
            try:
                return original(requests)
            finally:
                spans.append((start_s, time.monotonic()))

        instance.execute = execute
    assert await asyncio.gather(*(infer(handle, "steady", v) for v in range(4))) == [0, 1, 2, 3]
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    current = peak = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


async def test_scheduler_refusal_after_registration_unregisters_every_version(tmp_path: Path, server_factory) -> None:
    handle = await start(tmp_path, server_factory)
    limiter = limiter_for(handle.engine)
    # the sequence batcher refuses this config after the pool joined the limiter
    limited_model(tmp_path, "broken", 4, extra=(
        'sequence_batching { state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ 1 ] '
        'initial_state { data_type: TYPE_INT32 dims: [ 1 ] data_file: "missing.bin" name: "f" } } ] }'
    ), versions=(1, 2))
    with pytest.raises(ModelLoadError, match="failed to open text file for read .*missing.bin"):
        await handle.engine.load_model("broken")
    assert limiter.registrations() == STEADY and limiter.capacity(R) == 1
    assert await steady_overlap(handle) == 1  # no ghost capacity: still one execution at a time
    # the same model, fixed, loads and is accounted exactly once per instance and version
    limited_model(tmp_path, "broken", 4, versions=(1, 2))
    await handle.engine.load_model("broken")
    assert limiter.registrations() == {R: (1, 1, 4, 4, 4, 4)}
    assert await infer(handle, "broken", 7.0) == 7.0
    await handle.engine.unload_model("broken")
    assert limiter.registrations() == STEADY


async def test_later_version_failing_unregisters_the_versions_before_it(
    tmp_path: Path, server_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = await start(tmp_path, server_factory)
    limiter = limiter_for(handle.engine)
    limited_model(tmp_path, "multi", 4, versions=(1, 2, 3))
    real = builder_module.create_scheduler
    calls: list[str] = []

    def third_refused(model, pool, *, engine):
        calls.append(model.version_str)
        if len(calls) == 3:  # two versions are assembled (and registered) by now
            assert limiter.registrations() == {R: (1, 1, 4, 4, 4, 4)}
            raise ModelLoadError(f"version {model.version_str} refused")
        return real(model, pool, engine=engine)

    monkeypatch.setattr(builder_module, "create_scheduler", third_refused)
    with pytest.raises(ModelLoadError, match="refused"):
        await handle.engine.load_model("multi")
    assert len(calls) == 3
    assert limiter.registrations() == STEADY and limiter.capacity(R) == 1
    assert not handle.engine.model_ready("multi")
    monkeypatch.setattr(builder_module, "create_scheduler", real)
    await handle.engine.load_model("multi")
    assert limiter.registrations() == {R: (1, 1, 4, 4, 4, 4, 4, 4)}
    assert await infer(handle, "multi", 3.0) == 3.0


FLAKY_MODEL = '''
import json
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Fails to initialize until its ``succeed_on`` attempt (counted in a file beside it)."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        path = os.path.join(os.path.dirname(__file__), "attempts")
        attempt = (int(open(path).read()) if os.path.exists(path) else 0) + 1
        with open(path, "w") as f:
            f.write(str(attempt))
        if attempt < int(config["parameters"]["succeed_on"]["string_value"]):
            raise pb_utils.TritonModelException(f"storage not ready (attempt {attempt})")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", r.inputs()[0].as_numpy())]) for r in requests]
'''


def flaky_model(repository: Path, name: str, succeed_on: int) -> Path:
    return write_model(repository, name, f"""
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
parameters {{ key: "succeed_on" value {{ string_value: "{succeed_on}" }} }}
""", files={"1/model.py": FLAKY_MODEL})


@pytest.mark.parametrize(("retries", "succeed_on", "attempts", "loads"), [
    (0, 2, 1, False),  # the default: one attempt, the failure is the load's
    (2, 3, 3, True),   # the third attempt succeeds
    (1, 3, 2, False),  # two attempts are not enough: the last failure is reported
])
async def test_model_load_retry_count(tmp_path: Path, server_factory, caplog, retries, succeed_on, attempts, loads):
    """``--model-load-retry-count``: a version whose instances fail is created again, up to N more times."""
    model_dir = flaky_model(tmp_path, "flaky", succeed_on)
    handle = await server_factory([tmp_path], model_control_mode="explicit", model_load_retry_count=retries)
    registry = handle.server.engine.registry
    if loads:
        await registry.load("flaky")
        assert registry.is_ready("flaky")
        result = await infer(handle, "flaky", 2.0)
        assert result == 2.0
    else:
        with pytest.raises(ModelLoadError, match=f"storage not ready \\(attempt {attempts}\\)"):
            await registry.load("flaky")
        assert not registry.is_ready("flaky")
    assert (model_dir / "1" / "attempts").read_text() == str(attempts)
    assert caplog.text.count("failed to load 'flaky' version 1 (attempt") == attempts - 1  # one warning per retry
