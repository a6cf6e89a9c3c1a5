"""An instance-group change of a loaded model, with requests in flight, as Triton's ``UpdateInstanceGroup``.

The version is updated in place: the instances whose group setting is unchanged are kept (the very same objects,
neither initialized nor warmed up again), only the difference is created or finalized, and every request, the ones
in flight at the change and the ones that arrive while the previous instances drain, is answered. A kept instance
never runs two executions at once: the new scheduler gets it only once the previous one has drained. Covered with
the default scheduler, the dynamic batcher and under ``--rate-limit``; a sequence model creates all its instances
again (its scheduler places sequences on every instance at once).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest

from serving_pod.core.types import InferRequest, Tensor
from support.server import ServerHandle, test_model_config, write_model

NAME = "grouped"


def _config(count: int, scheduling: str) -> str:
    return test_model_config(NAME, max_batch_size=4, extra=f"""
parameters {{ key: "execute_delay_ms" value {{ string_value: "60" }} }}
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
{scheduling}
""")


def _newer(path: Path) -> None:
    """Make ``path`` newer than at the last load, however coarse the file system's clock."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))


async def _infer(handle: ServerHandle, value: float) -> float:
    data = np.full((1, 4), value, np.float32)
    response = await handle.engine.infer(InferRequest(NAME, "", [Tensor("INPUT0", "FP32", data)]))
    return float(response.outputs[0].data[0, 0])


async def _change(handle: ServerHandle, repository: Path, count: int, scheduling: str) -> list[float]:
    """Change the instance count while 8 requests are in flight and 8 more arrive during the load; their answers."""
    early = [asyncio.ensure_future(_infer(handle, float(i))) for i in range(8)]
    await asyncio.sleep(0.03)
    path = repository / NAME / "config.pbtxt"
    path.write_text(_config(count, scheduling))
    _newer(path)
    load = asyncio.ensure_future(handle.engine.load_model(NAME))
    await asyncio.sleep(0.03)
    late = [asyncio.ensure_future(_infer(handle, float(10 + i))) for i in range(8)]
    await asyncio.wait_for(load, 30)  # a request left waiting for an instance would hang here or below
    return list(await asyncio.wait_for(asyncio.gather(*early, *late), 30))


@pytest.mark.parametrize("scheduling", ["", "dynamic_batching { }"], ids=["default", "dynamic"])
@pytest.mark.parametrize("rate_limit", ["off", "execution_count"])
async def test_instance_group_change_keeps_instances_and_answers_every_request(
    tmp_path: Path, server_factory, scheduling: str, rate_limit: str
) -> None:
    write_model(tmp_path, NAME, _config(2, scheduling))
    handle = await server_factory([tmp_path], model_control_mode="explicit", load_models=(NAME,), rate_limit=rate_limit)
    first = handle.engine.registry.get(NAME)
    before = list(first.pool.instances)
    assert await _infer(handle, 1.0) == 1.0

    answers = await _change(handle, tmp_path, 1, scheduling)  # 2 -> 1: one kept (the last), one finalized
    assert answers == [float(i) for i in range(8)] + [float(10 + i) for i in range(8)]
    model = handle.engine.registry.get(NAME)
    assert model is not first and model.stats is first.stats  # a new version object, the same statistics
    assert [id(i) for i in model.pool.instances] == [id(before[1])] and model.pool.names == [f"{NAME}_0_1"]
    assert before[0].closed and not before[1].closed

    answers = await _change(handle, tmp_path, 3, scheduling)  # 1 -> 3: the one kept, two created
    assert answers == [float(i) for i in range(8)] + [float(10 + i) for i in range(8)]
    model = handle.engine.registry.get(NAME)
    assert [id(i) for i in model.pool.instances][0] == id(before[1]) and len(model.pool.instances) == 3
    assert model.pool.names == [f"{NAME}_0_1", f"{NAME}_0_1", f"{NAME}_0_2"]
    assert not getattr(model.pool, "inner", model.pool).held and all(not i.closed for i in model.pool.instances)
    assert all(i.most_running == 1 for i in before + model.pool.instances)
    assert await _infer(handle, 5.0) == 5.0
    await handle.engine.unload_model(NAME)
    assert all(i.closed for i in model.pool.instances)


async def test_a_sequence_model_creates_its_instances_again(tmp_path: Path, server_factory) -> None:
    scheduling = "sequence_batching { }"
    write_model(tmp_path, NAME, _config(2, scheduling))
    handle = await server_factory([tmp_path], model_control_mode="explicit", load_models=(NAME,))
    before = list(handle.engine.registry.get(NAME).pool.instances)
    path = tmp_path / NAME / "config.pbtxt"
    path.write_text(_config(1, scheduling))
    _newer(path)
    await handle.engine.load_model(NAME)
    after = handle.engine.registry.get(NAME).pool.instances
    assert len(after) == 1 and all(after[0] is not instance for instance in before)
    assert all(instance.closed for instance in before)
