"""The dynamic batcher through its public ``submit`` API: Triton's batching rules, one setting at a time.

Real ``ferry_test`` instances on real worker threads; a ``ManualClock`` drives queue delays and
timeouts, so no assertion depends on how fast this machine is. "Busy" phases use the model's
``execute_delay_ms`` with wide margins (requests queued in the same event-loop iteration).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.backends.base import InstanceContext
from serving_pod.backends import testing
from serving_pod.core.errors import InvalidArgumentError, UnavailableError
from serving_pod.core.model import Model
from serving_pod.core.statistics import ModelStats
from serving_pod.core.types import InferRequest, InferResponse, Tensor
from serving_pod.schedulers.clock import early_delay_s
from serving_pod.schedulers.dynamic import DynamicScheduler
from serving_pod.schedulers.instances import InstancePool


class ManualClock:
    """A clock that moves only when told; timers fire on ``advance``."""

    def __init__(self) -> None:
        self.now = 1_000_000_000
        self.timers: list[list[Any]] = []

    def now_ns(self) -> int:
        return self.now

    def call_later(self, delay_ns: int, callback: Callable[[], None]) -> Any:
        timer = [self.now + delay_ns, callback, False]

        class Handle:
            def cancel(self_inner) -> None:
                timer[2] = True

        self.timers.append(timer)
        return Handle()

    def advance(self, ns: int) -> None:
        self.now += ns
        due = [t for t in self.timers if t[0] <= self.now and not t[2]]
        self.timers = [t for t in self.timers if t[0] > self.now and not t[2]]
        for timer in due:
            timer[1]()


def make(
    batching: str = "",
    *,
    max_batch: int = 4,
    count: int = 1,
    delay_ms: int = 200,
    dims: str = "[ 2 ]",
    input_extra: str = "",
    clock: Any = None,
    instance_factory: Callable[[InstanceContext], Any] | None = None,
) -> tuple[DynamicScheduler, list[Any], ModelStats]:
    text = f"""
name: "m" backend: "ferry_test" max_batch_size: {max_batch}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: {dims} {input_extra} }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {dims} }} ]
parameters {{ key: "execute_delay_ms" value {{ string_value: "{delay_ms}" }} }}
dynamic_batching {{ {batching} }}
"""
    config = text_format.Parse(text, mc.ModelConfig())
    backend = testing.TestBackend()
    names = [f"m_0_{i}" for i in range(count)]
    contexts = [InstanceContext("m", "1", Path("."), Path("."), config, name) for name in names]
    create = instance_factory or backend.create_instance
    instances = [create(context) for context in contexts]
    stats = ModelStats("m", "1")
    model = Model(config, 1, None, stats)  # type: ignore[arg-type]
    pool = InstancePool(instances, names, stats, model.batch_size_of)
    return DynamicScheduler(model, pool, clock=clock), instances, stats


def request(value: float = 0.0, *, rows: int = 1, width: int = 2, **parameters: Any) -> InferRequest:
    data = np.full((rows, width), value, dtype=np.float32)
    return InferRequest(
        "m", "1", [Tensor("INPUT0", "FP32", data)], id=str(value),
        parameters=parameters, arrival_ns=time.monotonic_ns(),
    )


def batch_sizes(stats: ModelStats) -> dict[int, int]:
    return {entry["batch_size"]: entry["compute_infer"]["count"] for entry in stats.as_dict()["batch_stats"]}


async def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def start_busy(
    scheduler: DynamicScheduler, instances: list[Any], value: float = -1.0, clock: ManualClock | None = None
) -> asyncio.Future:
    """Submit one request and return once an instance runs it (so later ones must queue)."""
    first = asyncio.ensure_future(scheduler.submit(request(value)))
    if clock is not None:  # a lone request waits for the queue delay: let it pass
        await asyncio.sleep(0.01)
        clock.advance(10**9)
    await until(lambda: scheduler.pool.idle_count() < len(instances))
    return first


def completion_order(futures: dict[str, asyncio.Future]) -> list[str]:
    order: list[str] = []
    for name, future in futures.items():
        future.add_done_callback(lambda _f, name=name: order.append(name))
    return order


# --- batch formation ---------------------------------------------------------------------------
async def test_largest_batch_without_waiting_then_the_rest() -> None:
    scheduler, instances, stats = make(max_batch=4, delay_ms=20)
    responses = await asyncio.gather(*(scheduler.submit(request(i)) for i in range(10)))
    assert [r.outputs[0].data[0, 0] for r in responses] == list(range(10))
    assert instances[0].executions == [[1] * 4, [1] * 4, [1] * 2]
    assert batch_sizes(stats) == {4: 2, 2: 1}
    assert (stats.execution_count, stats.inference_count) == (3, 10)


async def test_batch_keeps_growing_while_the_instance_is_busy() -> None:
    scheduler, instances, stats = make(max_batch=8, delay_ms=300)
    first = await start_busy(scheduler, instances)
    rest = [asyncio.ensure_future(scheduler.submit(request(i))) for i in range(5)]
    await until(lambda: scheduler.pending() == 5)
    await asyncio.gather(first, *rest)
    assert instances[0].executions == [[1], [1] * 5]
    assert scheduler.pending() == 0


async def test_requests_with_several_rows_fill_max_batch_size() -> None:
    scheduler, instances, stats = make(max_batch=4, delay_ms=100)
    first = await start_busy(scheduler, instances)
    await asyncio.gather(first, *(scheduler.submit(request(i, rows=2)) for i in range(3)))
    assert instances[0].executions == [[1], [2, 2], [2]]
    assert batch_sizes(stats) == {1: 1, 4: 1, 2: 1}
    assert stats.inference_count == 7


class MillisecondClock(ManualClock):
    """Timers as ``LoopClock`` arms them on uvloop: whole milliseconds (``early_delay_s``), so they fire early."""

    def call_later(self, delay_ns: int, callback: Callable[[], None]) -> Any:
        return super().call_later(round(early_delay_s(delay_ns) * 1e9), callback)


def test_timer_delays_are_whole_milliseconds_never_later() -> None:
    assert early_delay_s(1_500_000) == 0.001  # uvloop would round 1.5 ms up to 2 ms
    assert early_delay_s(999_999) == 0.0  # under a millisecond: the next loop iteration
    assert early_delay_s(2_000_000) == 0.002


@pytest.mark.parametrize("clock_type,delay_us,steps", [
    (ManualClock, 100_000, [99_000_000]),
    # the whole-millisecond timer fires with 0.5 ms left, then each re-check finds time left: the batch waits
    (MillisecondClock, 1_500, [1_000_000, 499_000]),
], ids=["exact-timer", "early-timer"])
async def test_queue_delay_holds_a_partial_batch_until_it_expires(clock_type, delay_us, steps) -> None:
    clock = clock_type()
    scheduler, instances, stats = make(f"max_queue_delay_microseconds: {delay_us}", max_batch=8, delay_ms=0,
                                       clock=clock)
    futures = [asyncio.ensure_future(scheduler.submit(request(i))) for i in range(3)]
    for _ in range(20):
        await asyncio.sleep(0)
    assert instances[0].executions == [] and scheduler.pending() == 3
    for step in steps:
        clock.advance(step)
        await asyncio.sleep(0.05)
        assert instances[0].executions == []
    clock.advance(delay_us * 1000 - sum(steps))
    await asyncio.gather(*futures)
    assert instances[0].executions == [[1, 1, 1]]


async def test_queue_delay_does_not_hold_a_full_batch() -> None:
    clock = ManualClock()
    scheduler, instances, stats = make("max_queue_delay_microseconds: 100000", max_batch=4, delay_ms=0, clock=clock)
    await asyncio.gather(*(scheduler.submit(request(i)) for i in range(4)))  # the clock never moves
    assert instances[0].executions == [[1] * 4]


async def test_preferred_sizes_without_delay_send_the_largest_preferred_prefix() -> None:
    scheduler, instances, stats = make("preferred_batch_size: [ 2, 4 ]", max_batch=8, delay_ms=100)
    first = await start_busy(scheduler, instances)
    await asyncio.gather(first, *(scheduler.submit(request(i)) for i in range(7)))
    assert [len(e) for e in instances[0].executions] == [1, 4, 2, 1]
    assert batch_sizes(stats) == {1: 2, 2: 1, 4: 1}


@pytest.mark.parametrize("policy,batches,waiting", [
    # Triton prefetches: the batch (its payload) grows past the preferred size by what its next pass finds
    # (GetDynamicBatch marks the first request beyond max preferred, then sends up to it: 4 + 1)
    ("", [5], 3),
    # a queue policy turns prefetching off: the preferred size is sent, the rest (again preferred) next
    ("default_queue_policy { max_queue_size: 100 }", [4, 4], 0),
], ids=["prefetching", "queue-policy"])
async def test_preferred_size_is_sent_at_once_and_the_remainder_waits_for_the_delay(
    policy: str, batches: list[int], waiting: int
) -> None:
    clock = ManualClock()
    scheduler, instances, stats = make(
        f"preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 50000 {policy}", max_batch=8, delay_ms=0,
        clock=clock,
    )
    futures = [asyncio.ensure_future(scheduler.submit(request(i))) for i in range(3)]
    await asyncio.sleep(0.05)
    assert instances[0].executions == []
    futures += [asyncio.ensure_future(scheduler.submit(request(i))) for i in range(3, 8)]
    await until(lambda: len(instances[0].executions) == len(batches))
    await asyncio.sleep(0.05)
    assert [len(e) for e in instances[0].executions] == batches and scheduler.pending() == waiting
    clock.advance(50_000_000)
    await asyncio.gather(*futures)
    assert [len(e) for e in instances[0].executions] == batches + ([waiting] if waiting else [])


async def test_expired_delay_sends_everything_up_to_max_batch_size() -> None:
    clock = ManualClock()
    scheduler, instances, stats = make(
        "preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 1000", max_batch=8, delay_ms=300, clock=clock
    )
    first = await start_busy(scheduler, instances, clock=clock)
    rest = [asyncio.ensure_future(scheduler.submit(request(i))) for i in range(6)]
    await until(lambda: scheduler.pending() == 6)
    clock.advance(2_000_000)  # they waited longer than the delay while the instance was busy
    await asyncio.gather(first, *rest)
    assert [len(e) for e in instances[0].executions] == [1, 6]


async def test_batches_spread_over_all_instances() -> None:
    scheduler, instances, stats = make(max_batch=4, count=2, delay_ms=100)
    await asyncio.gather(*(scheduler.submit(request(i)) for i in range(8)))
    assert [i.executions for i in instances] == [[[1] * 4], [[1] * 4]]
    assert stats.execution_count == 2


async def test_variable_dims_batch_only_equal_shapes_in_arrival_order() -> None:
    scheduler, instances, stats = make(max_batch=8, dims="[ -1 ]", delay_ms=100)
    first = await start_busy(scheduler, instances)
    widths = [3, 3, 5, 5, 3]
    responses = await asyncio.gather(first, *(scheduler.submit(request(i, width=w)) for i, w in enumerate(widths)))
    assert [r.outputs[0].data.shape for r in responses[1:]] == [(1, w) for w in widths]
    assert instances[0].executions == [[1], [1, 1], [1, 1], [1]]


async def test_ragged_inputs_share_one_execution() -> None:
    scheduler, instances, stats = make(max_batch=8, dims="[ -1 ]", input_extra="allow_ragged_batch: true", delay_ms=100)
    first = await start_busy(scheduler, instances)
    await asyncio.gather(first, *(scheduler.submit(request(i, width=w)) for i, w in enumerate([3, 5, 2, 5])))
    assert instances[0].executions == [[1], [1, 1, 1, 1]]


# --- ordering -------------------------------------------------------------------------------
class SleepyInstance:
    """Sleeps INPUT0[0,0] x 100 ms, then echoes: lets a later batch overtake an earlier one."""

    def __init__(self, context: InstanceContext) -> None:
        self.executions: list[list[int]] = []

    def execute(self, requests: list[InferRequest]) -> list[InferResponse]:
        self.executions.append([1] * len(requests))
        time.sleep(float(requests[0].inputs[0].data[0, 0]) * 0.1)
        return [InferResponse("m", "1", [Tensor("OUTPUT0", "FP32", r.inputs[0].data)], r.id) for r in requests]

    def close(self) -> None:
        pass


@pytest.mark.parametrize("preserve", [False, True])
async def test_preserve_ordering(preserve: bool) -> None:
    scheduler, instances, stats = make(
        f"preserve_ordering: {str(preserve).lower()}", max_batch=1, count=2, instance_factory=SleepyInstance
    )
    futures = {"slow": asyncio.ensure_future(scheduler.submit(request(3.0)))}
    futures["fast"] = asyncio.ensure_future(scheduler.submit(request(0.0)))
    order = completion_order(futures)
    await asyncio.gather(*futures.values())
    assert order == (["slow", "fast"] if preserve else ["fast", "slow"])


async def test_priority_levels_serve_level_one_first() -> None:
    scheduler, instances, stats = make(
        "priority_levels: 2 default_priority_level: 2", max_batch=1, delay_ms=60
    )
    first = await start_busy(scheduler, instances)
    futures = {
        "b": asyncio.ensure_future(scheduler.submit(request(1, priority=2))),
        "c": asyncio.ensure_future(scheduler.submit(request(2, priority=0))),  # 0: the default level
        "d": asyncio.ensure_future(scheduler.submit(request(3, priority=1))),
        "e": asyncio.ensure_future(scheduler.submit(request(4, priority=7))),  # above the levels: default
    }
    order = completion_order(futures)
    await asyncio.gather(first, *futures.values())
    assert order == ["d", "b", "c", "e"]


async def test_malformed_priority_is_rejected() -> None:
    scheduler, instances, stats = make("priority_levels: 2 default_priority_level: 1", delay_ms=0)
    with pytest.raises(InvalidArgumentError, match="'priority' must be an unsigned integer"):
        await scheduler.submit(request(1, priority=-1))
    assert stats.failures["REJECTED"] == 0 and stats.fail.count == 0  # refused before the queue: not charged


# --- queue policy -------------------------------------------------------------------------
async def test_timeout_reject() -> None:
    clock = ManualClock()
    scheduler, instances, stats = make(
        "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 1000 }",
        max_batch=1, delay_ms=200, clock=clock,
    )
    first = await start_busy(scheduler, instances)
    late = asyncio.ensure_future(scheduler.submit(request(1)))
    await until(lambda: scheduler.pending() == 1)
    clock.advance(2_000_000)
    fresh = asyncio.ensure_future(scheduler.submit(request(2)))
    await first
    with pytest.raises(UnavailableError, match="Request timeout expired"):
        await late
    assert (await fresh).outputs[0].data[0, 0] == 2
    assert stats.failures["REJECTED"] == 1 and stats.fail.count == 1
    assert stats.success.count == 2 and scheduler.pending() == 0


async def test_timeout_delay_moves_expired_requests_behind_fresh_ones() -> None:
    clock = ManualClock()
    scheduler, instances, stats = make(
        "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1000 }",
        max_batch=1, delay_ms=100, clock=clock,
    )
    first = await start_busy(scheduler, instances)
    futures = {"expired": asyncio.ensure_future(scheduler.submit(request(1)))}
    await until(lambda: scheduler.pending() == 1)
    clock.advance(2_000_000)
    futures["fresh"] = asyncio.ensure_future(scheduler.submit(request(2)))
    order = completion_order(futures)
    await asyncio.gather(first, *futures.values())
    assert order == ["fresh", "expired"]
    assert stats.success.count == 3 and stats.fail.count == 0


@pytest.mark.parametrize(
    ("waited_ms", "expired"), [(5, ["short"]), (20, ["short", "longer", "default"])]
)
async def test_timeout_override_may_only_shorten(waited_ms: int, expired: list[str]) -> None:
    clock = ManualClock()
    scheduler, instances, stats = make(
        "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 10000 allow_timeout_override: true }",
        max_batch=4, delay_ms=200, clock=clock,
    )
    first = await start_busy(scheduler, instances)
    futures = {
        "short": asyncio.ensure_future(scheduler.submit(request(1, timeout=1000))),
        "longer": asyncio.ensure_future(scheduler.submit(request(2, timeout=10_000_000))),  # capped at 10 ms
        "default": asyncio.ensure_future(scheduler.submit(request(3))),
    }
    await until(lambda: scheduler.pending() == 3)
    clock.advance(waited_ms * 1_000_000)
    await first
    results = await asyncio.gather(*futures.values(), return_exceptions=True)
    rejected = [name for name, r in zip(futures, results) if isinstance(r, UnavailableError)]
    assert rejected == expired
    assert all("Request timeout expired" in str(r) for r in results if isinstance(r, Exception))


async def test_max_queue_size_rejects_at_once() -> None:
    scheduler, instances, stats = make("default_queue_policy { max_queue_size: 2 }", max_batch=1, delay_ms=200)
    first = await start_busy(scheduler, instances)
    queued = [asyncio.ensure_future(scheduler.submit(request(i))) for i in range(2)]
    await until(lambda: scheduler.pending() == 2)
    started = time.monotonic()
    with pytest.raises(UnavailableError, match=r"^\[request id: 9\] Exceeds maximum queue size$"):
        await scheduler.submit(request(9))
    assert time.monotonic() - started < 0.15  # not after the instance frees (200 ms)
    await asyncio.gather(first, *queued)
    # as Triton: the refusal is charged to no statistic (test_dynamic_triton.py compares it side by side)
    assert stats.failures["REJECTED"] == 0 and stats.fail.count == 0 and stats.success.count == 3


async def test_a_full_queue_refuses_before_queuing() -> None:
    """Triton's scheduler ``Enqueue`` returns the full-queue error, so ``TRITONSERVER_ServerInferAsync`` fails as for
    a request refused before its model (recorded live from Triton 2.51): on a gRPC stream the error is named by the
    request's id alone and does not end a ``triton_grpc_error`` stream; a BLS call reads 'Model q - Error when running
    inference: ...'; generate_stream answers it as a JSON error (503). The adapters read ``refused_before_queue``."""
    scheduler, instances, stats = make("default_queue_policy { max_queue_size: 1 }", max_batch=1, delay_ms=200)
    first = await start_busy(scheduler, instances)
    queued = asyncio.ensure_future(scheduler.submit(request(1)))
    await until(lambda: scheduler.pending() == 1)
    with pytest.raises(UnavailableError, match="Exceeds maximum queue size") as refused:
        await scheduler.submit(request(9))
    assert refused.value.refused_before_queue
    await asyncio.gather(first, queued)


async def test_queue_size_is_per_priority_level() -> None:
    scheduler, instances, stats = make(
        "priority_levels: 2 default_priority_level: 2 "
        "priority_queue_policy { key: 1 value { max_queue_size: 1 } }",
        max_batch=1, delay_ms=150,
    )
    first = await start_busy(scheduler, instances)
    high = asyncio.ensure_future(scheduler.submit(request(1, priority=1)))
    low = [asyncio.ensure_future(scheduler.submit(request(2))) for _ in range(3)]  # level 2: unlimited
    await until(lambda: scheduler.pending() == 4)
    with pytest.raises(UnavailableError, match="Exceeds maximum queue size"):
        await scheduler.submit(request(3, priority=1))
    await asyncio.gather(first, high, *low)


# --- statistics, cancellation, drain ---------------------------------------------------------
async def test_statistics_charge_queue_and_compute_per_request() -> None:
    scheduler, instances, stats = make(max_batch=4, delay_ms=100)
    first = await start_busy(scheduler, instances)
    await asyncio.gather(first, *(scheduler.submit(request(i)) for i in range(3)))
    data = stats.as_dict()["inference_stats"]
    assert data["success"]["count"] == 4
    assert data["queue"]["count"] == data["compute_infer"]["count"] == 4
    # the 3 queued requests waited for the first execution (100 ms; wide margin for a busy host)
    assert data["queue"]["ns"] >= 3 * 30_000_000
    assert data["compute_infer"]["ns"] >= 4 * 100_000_000  # each is charged its whole batch
    assert stats.execution_count == 2 and batch_sizes(stats) == {1: 1, 3: 1}


async def test_cancelled_request_is_not_executed() -> None:
    scheduler, instances, stats = make(max_batch=4, delay_ms=150)
    first = await start_busy(scheduler, instances)
    gone = asyncio.ensure_future(scheduler.submit(request(1)))
    kept = asyncio.ensure_future(scheduler.submit(request(2)))
    await until(lambda: scheduler.pending() == 2)
    gone.cancel()
    await asyncio.gather(first, kept)
    assert instances[0].executions == [[1], [1]]
    assert stats.failures["CANCELED"] == 1


async def test_drain_waits_for_queued_work_and_refuses_new() -> None:
    scheduler, instances, stats = make(max_batch=1, delay_ms=100)
    first = await start_busy(scheduler, instances)
    queued = asyncio.ensure_future(scheduler.submit(request(1)))
    await until(lambda: scheduler.pending() == 1)
    await scheduler.drain()
    assert first.done() and queued.done() and stats.success.count == 2
    with pytest.raises(UnavailableError, match="unloading"):
        await scheduler.submit(request(2))


async def test_backend_failure_fails_only_its_requests() -> None:
    scheduler, instances, stats = make(max_batch=4, delay_ms=0)
    instances[0].fail_on = 7.0
    results = await asyncio.gather(
        *(scheduler.submit(request(v)) for v in (1, 7, 2)), return_exceptions=True
    )
    assert isinstance(results[1], Exception) and "failed on value" in str(results[1])
    assert [r.outputs[0].data[0, 0] for r in (results[0], results[2])] == [1, 2]
    assert stats.failures["BACKEND"] == 1 and stats.success.count == 2



async def test_priority_queue_policy_without_priority_levels_is_ignored() -> None:
    """As Triton: with no ``priority_levels`` the one level follows ``default_queue_policy``, not ``priority_queue_policy``."""
    scheduler, instances, stats = make("priority_queue_policy { key: 1 value { max_queue_size: 1 } }",
                                       max_batch=1, delay_ms=150)
    first = await start_busy(scheduler, instances)
    queued = [asyncio.ensure_future(scheduler.submit(request(i))) for i in range(3)]  # no limit: all queue
    await until(lambda: scheduler.pending() == 3)
    await asyncio.gather(first, *queued)
    assert stats.success.count == 4 and stats.fail.count == 0
