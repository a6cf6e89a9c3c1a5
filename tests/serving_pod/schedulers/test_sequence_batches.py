"""The batches the sequence batcher forms, through ``SequenceScheduler.submit`` on ``ferry_test`` instances.

Fast twins of what test_sequence_triton_depth.py compares with Triton 2.51 (they run where Triton cannot be had):
the oldest strategy stops a batch at the largest ``preferred_batch_size``, a padded direct batch is charged at its
full size in ``batch_stats`` but only its requests in ``inference_count``, and an idle-released sequence gets
Triton's START error word for word.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.backends import testing as ferry_test_backend
from serving_pod.backends.base import InstanceContext
from serving_pod.core.errors import InvalidArgumentError
from serving_pod.core.model import Model
from serving_pod.core.statistics import ModelStats
from serving_pod.core.types import InferRequest, Tensor
from serving_pod.schedulers.instances import InstancePool
from serving_pod.schedulers.sequence import SequenceScheduler


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000_000

    def __call__(self) -> int:
        return self.now


def _scheduler(sequence: str, clock: Clock) -> tuple[SequenceScheduler, ModelStats, list]:
    config = text_format.Parse(f"""
name: "seq"
backend: "ferry_test"
max_batch_size: 4
sequence_batching {{ {sequence} }}
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ name: "seq_0" count: 1 kind: KIND_CPU }} ]
""", mc.ModelConfig())
    backend = ferry_test_backend.TestBackend()
    instances = [backend.create_instance(InstanceContext("seq", "1", Path("."), Path("1"), config, "seq_0_0"))]
    stats = ModelStats("seq", "1")
    model = Model(config, 1, scheduler=None, stats=stats)  # type: ignore[arg-type]
    pool = InstancePool(instances, ["seq_0_0"], stats, model.batch_size_of)
    return SequenceScheduler(model, pool, clock=clock), stats, instances


def _request(value: int, sequence_id: int, start: bool = False, end: bool = False) -> InferRequest:
    parameters = {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end}
    return InferRequest("seq", "1", [Tensor("INPUT0", "INT32", np.full((1, 1), value, np.int32))], parameters=parameters)


async def test_oldest_batches_stop_at_the_largest_preferred_size() -> None:
    sequence = "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] }"
    scheduler, stats, instances = _scheduler(sequence, Clock())
    results = await asyncio.wait_for(
        asyncio.gather(*(scheduler.submit(_request(v, 10 + v, start=True, end=True)) for v in range(3))), 5
    )
    assert [int(r.outputs[0].data[0][0]) for r in results] == [0, 1, 2]
    assert instances[0].executions == [[1, 1], [1]]  # Triton 2.51: 2 then 1, not 3 at once
    assert sorted(stats.batch_stats) == [1, 2]
    await scheduler.drain()


async def test_oldest_runs_a_reached_preferred_size_before_the_delay() -> None:
    clock = Clock()
    sequence = "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 10000000 }"
    scheduler, _, instances = _scheduler(sequence, clock)
    tasks = [asyncio.create_task(scheduler.submit(_request(v, 20 + v, start=True, end=True))) for v in range(3)]
    await asyncio.sleep(0.05)  # the clock stands still: 10 s of delay never pass
    assert instances[0].executions == [[1, 1]]  # 2 is reached (4 is not): the two oldest run now
    assert not tasks[2].done()
    clock.now += 20_000_000_000
    tasks.append(asyncio.create_task(scheduler.submit(_request(9, 29, start=True, end=True))))  # wakes the lane
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert instances[0].executions == [[1, 1], [1, 1]]
    await scheduler.drain()


async def test_padded_direct_batch_is_charged_at_its_full_size() -> None:
    scheduler, stats, instances = _scheduler("", Clock())
    await scheduler.submit(_request(1, 1, start=True))  # slot 0, then nothing queued for it
    await asyncio.gather(scheduler.submit(_request(2, 2, start=True)), scheduler.submit(_request(3, 3, start=True)))
    assert len(instances[0].executions[-1]) == 3  # [null, 2, 3]
    assert sorted(stats.batch_stats) == [1, 3]
    assert stats.inference_count == 3 and stats.execution_count == 2
    await scheduler.drain()


async def test_idle_released_sequence_gets_tritons_start_error() -> None:
    clock = Clock()
    scheduler, _, _ = _scheduler("max_sequence_idle_microseconds: 50000", clock)
    await scheduler.submit(_request(1, 7, start=True))
    clock.now += 60_000_000
    await asyncio.sleep(0.05)
    with pytest.raises(InvalidArgumentError) as raised:
        await scheduler.submit(_request(2, 7))
    assert str(raised.value.args[0] if raised.value.args else raised.value) == (
        "inference request for sequence 7 to model 'seq' must specify the START flag on the first request of the "
        "sequence"
    )
    await scheduler.drain()
