"""SequenceScheduler through its public ``submit`` with a controllable clock, on real ``ferry_test`` instances.

Also the pure parts: ``sequence_config`` (config errors with Triton's messages, control tensors,
initial state from a data file).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.backends.base import InstanceContext
from serving_pod.backends import testing as ferry_test_backend
from serving_pod.core.errors import InvalidArgumentError, ModelLoadError
from serving_pod.core.model import Model
from serving_pod.core.statistics import ModelStats
from serving_pod.core.types import InferRequest, Tensor
from serving_pod.schedulers.instances import InstancePool
from serving_pod.schedulers.sequence import SequenceScheduler
from serving_pod.schedulers.sequence_config import parse_sequence_config


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000_000

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1e9)


def _config(sequence: str, max_batch: int = 4, count: int = 1) -> mc.ModelConfig:
    return text_format.Parse(f"""
name: "seq"
backend: "ferry_test"
max_batch_size: {max_batch}
sequence_batching {{ {sequence} }}
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ name: "seq_0" count: {count} kind: KIND_CPU }} ]
""", mc.ModelConfig())


def _scheduler(config: mc.ModelConfig, clock: Clock) -> tuple[SequenceScheduler, list]:
    backend = ferry_test_backend.TestBackend()
    names = [f"seq_0_{i}" for i in range(config.instance_group[0].count)]
    instances = [
        backend.create_instance(InstanceContext("seq", "1", Path("."), Path("1"), config, name)) for name in names
    ]
    stats = ModelStats("seq", "1")
    model = Model(config, 1, scheduler=None, stats=stats)  # type: ignore[arg-type]
    pool = InstancePool(instances, names, stats, model.batch_size_of)
    return SequenceScheduler(model, pool, clock=clock), instances


def _request(value: int, sequence_id, start=False, end=False) -> InferRequest:
    parameters = {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end}
    return InferRequest("seq", "1", [Tensor("INPUT0", "INT32", np.full((1, 1), value, np.int32))], parameters=parameters)


async def test_idle_release_follows_the_clock() -> None:
    clock = Clock()
    scheduler, _ = _scheduler(_config("max_sequence_idle_microseconds: 50000"), clock)
    await scheduler.submit(_request(1, 7, start=True))
    clock.advance(0.04)
    await asyncio.sleep(0.05)  # reaper ticks: 40 ms of 50 ms idle, still alive
    await scheduler.submit(_request(2, 7))
    clock.advance(0.06)
    await asyncio.sleep(0.05)
    with pytest.raises(InvalidArgumentError, match="must specify the START flag on the first request of the sequence"):
        await scheduler.submit(_request(3, 7, end=True))
    await scheduler.drain()


async def test_oldest_waits_for_a_fuller_batch_until_the_delay_passes() -> None:
    clock = Clock()
    sequence = "oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 100000 }"
    scheduler, instances = _scheduler(_config(sequence), clock)
    first = asyncio.create_task(scheduler.submit(_request(1, 1, start=True)))
    second = asyncio.create_task(scheduler.submit(_request(2, 2, start=True)))
    # well inside the lane's real 100 ms timer: were it to fire first, it would see the advanced clock and
    # run the first two alone (Python 3.12 orders the two wake-ups that way when both are due at 100 ms)
    await asyncio.sleep(0.02)
    assert not first.done() and instances[0].executions == []  # 2 < 4 and no time has passed
    clock.advance(0.2)
    third = asyncio.create_task(scheduler.submit(_request(3, 3, start=True)))  # wakes the lane
    results = await asyncio.wait_for(asyncio.gather(first, second, third), 5)
    assert [int(r.outputs[0].data[0][0]) for r in results] == [1, 2, 3]
    assert instances[0].executions == [[1, 1, 1]]
    await scheduler.drain()


async def test_direct_requests_of_one_sequence_run_in_order_one_per_batch() -> None:
    clock = Clock()
    scheduler, instances = _scheduler(_config(""), clock)
    tasks = [asyncio.create_task(scheduler.submit(_request(v, 5, start=v == 0, end=v == 3))) for v in range(4)]
    results = await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert [int(r.outputs[0].data[0][0]) for r in results] == [0, 1, 2, 3]
    assert instances[0].executions == [[1], [1], [1], [1]]
    assert scheduler.pending() == 0
    await scheduler.drain()


async def test_drain_runs_backlogged_sequences() -> None:
    """As Triton 2.51 at an unload: a sequence waiting for a slot runs (each request a success), refused nothing; the
    slot holder, which no request can reach any more, gives its slot up without waiting out its idle time."""
    clock = Clock()
    scheduler, _ = _scheduler(_config("", max_batch=0), clock)
    await scheduler.submit(_request(1, 1, start=True))  # holds the only slot
    waiting = [asyncio.create_task(scheduler.submit(_request(value, 2, start=value == 5))) for value in (5, 6)]
    await asyncio.sleep(0.05)
    assert not any(task.done() for task in waiting) and scheduler.pending() == 2
    await scheduler.drain()
    assert [(await task).outputs[0].data.tolist() for task in waiting] == [[[5]], [[6]]]
    stats = scheduler.pool.stats
    assert (stats.success.count, stats.fail.count, scheduler.pending()) == (3, 0, 0)
    with pytest.raises(Exception, match="unloading"):  # refused once the drain began
        await scheduler.submit(_request(7, 2))


async def test_a_failed_batch_still_frees_the_slot_of_an_ended_sequence() -> None:
    """An unexpected error while preparing a START+END request fails it (INTERNAL) but frees its slot.

    Before, the slot of the ended sequence stayed taken: with one slot, every later sequence waited forever.
    """
    clock = Clock()
    scheduler, _ = _scheduler(_config("", max_batch=0), clock)  # a single slot

    class FailingOnce:
        """``StateIO`` whose first ``prepare`` raises (a stand-in for any bug on that path)."""

        def __init__(self, io) -> None:
            self.io, self.failed = io, False

        def __getattr__(self, name: str):
            return getattr(self.io, name)

        def prepare(self, *args, **kwargs):
            if not self.failed:
                self.failed = True
                raise RuntimeError("boom")
            return self.io.prepare(*args, **kwargs)

    scheduler.io = FailingOnce(scheduler.io)  # type: ignore[assignment]
    with pytest.raises(Exception, match="RuntimeError: boom"):
        await asyncio.wait_for(scheduler.submit(_request(1, 1, start=True, end=True)), 5)
    result = await asyncio.wait_for(scheduler.submit(_request(4, 2, start=True, end=True)), 5)
    assert int(result.outputs[0].data.reshape(-1)[0]) == 4
    await scheduler.drain()


# --- sequence_config ------------------------------------------------------------------------

BAD_CONFIGS = {
    'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1, 2 ] } ] } ]':
        "sequence batching control 'int32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_START for seq",
    'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_READY } ] } ]':
        "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_READY for seq",
    'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ] } ] } ]':
        "sequence batching specifies more than one from",
    'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }, '
    '{ name: "S" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] } ]':
        "sequence batching control tensor 'S' is specified for multiple control kinds for seq",
    'control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ]':
        "must have data_type TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING, got TYPE_FP32",
    'state [ { input_name: "A" output_name: "B" data_type: TYPE_INT32 dims: [ 2 ] '
    'initial_state { data_type: TYPE_INT32 dims: [ 3 ] zero_data: true name: "z" } } ]':
        "'initial_state' dim for input name 'A' doesn't match 'state' dim description. 3 != 2",
    'state [ { input_name: "A" output_name: "B" data_type: TYPE_INT32 dims: [ 2 ] '
    'initial_state { data_type: TYPE_INT32 dims: [ 2 ] data_file: "missing.bin" name: "f" } } ]':
        "initial_state/missing.bin: No such file or directory",
}


@pytest.mark.parametrize("sequence", sorted(BAD_CONFIGS))
def test_bad_sequence_config_is_a_load_error(sequence: str, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as error:
        parse_sequence_config(_config(sequence), tmp_path)
    assert BAD_CONFIGS[sequence] in str(error.value)


def test_control_tensors_and_initial_state_from_file(tmp_path: Path) -> None:
    (tmp_path / "initial_state").mkdir()
    (tmp_path / "initial_state" / "s.bin").write_bytes(np.array([7, 8], np.int32).tobytes())
    spec = parse_sequence_config(_config(
        'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] }, '
        '{ name: "R" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] }, '
        '{ name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ] '
        'state [ { input_name: "A" output_name: "B" data_type: TYPE_INT32 dims: [ 2 ] '
        'initial_state { data_type: TYPE_INT32 dims: [ 2 ] data_file: "s.bin" name: "f" } } ]'
    ), tmp_path)
    tensors = {t.name: t for t in spec.control_tensors(True, False, True, "abc")}
    assert (tensors["S"].datatype, tensors["S"].data.tolist()) == ("FP32", [[1.0]])
    assert (tensors["R"].datatype, tensors["R"].data.tolist()) == ("BOOL", [[True]])
    assert (tensors["C"].datatype, tensors["C"].data.tolist()) == ("BYTES", [[b"abc"]])
    assert spec.initial_states()["A"].tolist() == [[7, 8]]
    assert spec.sequence_of({"sequence_id": "abc", "sequence_start": True}) == ("abc", True, False)
    with pytest.raises(InvalidArgumentError, match="data-type is 'UINT64', but model 'seq' expects 'BYTES'"):
        spec.sequence_of({"sequence_id": 5})


@pytest.mark.parametrize(("datatype", "key", "seen"), [
    ("INT32", 2**40 + 7, 7),                      # Triton 2.51 hands the model the low 32 bits
    ("INT32", 2**64 - 1, -1),
    ("UINT32", 2**32 + 9, 9),
    ("INT64", 2**63 + 7, -(2**63) + 7),           # the id's bits read as signed
    ("UINT64", 2**64 - 1, 2**64 - 1),
])
def test_corrid_control_takes_the_id_cut_to_its_width(datatype: str, key: int, seen: int, tmp_path: Path) -> None:
    """A wide id on a narrow CORRID control is cut as Triton's cast does, not an OverflowError (INTERNAL)."""
    spec = parse_sequence_config(_config(
        f'control_input [ {{ name: "C" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_{datatype} }} ] }} ]'
    ), tmp_path)
    (tensor,) = spec.control_tensors(True, False, True, key)
    assert (tensor.datatype, tensor.data.dtype.name, tensor.data.tolist()) == (datatype, datatype.lower(), [[seen]])
    (null,) = spec.control_tensors(False, False, False, 0)
    assert null.data.tolist() == [[0]]
