"""The rate limiter: resource copies, defaults, explicit counts, priorities, and enforcement in a real server."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.backends.base import InstanceContext
from serving_pod.backends import testing
from serving_pod.core.errors import ModelLoadError
from serving_pod.core.statistics import ModelStats
from serving_pod.schedulers.instances import InstancePool
from serving_pod.schedulers.rate_limiter import (
    Demand,
    RateLimitedPool,
    RateLimiter,
    ResourceSetting,
    demands_of,
    parse_resource,
)
from support.server import in_thread, test_model_config, write_model


def test_parse_resource() -> None:
    assert parse_resource("R1:4") == ResourceSetting("R1", 4, None)
    assert parse_resource("R2:8:1") == ResourceSetting("R2", 8, 1)
    for bad in ("R1", "R1:x", ":3", "R1:-1", "R1:2:0:1"):
        with pytest.raises(ValueError, match="invalid rate limit resource"):
            parse_resource(bad)


def test_demands_follow_instance_groups() -> None:
    config = text_format.Parse(
        """name: "m" instance_group [
             { name: "a" count: 2 kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 2 },
               { name: "G" global: true count: 1 } ] priority: 3 } },
             { name: "b" count: 1 kind: KIND_GPU gpus: [ 0, 1 ] } ]""",
        mc.ModelConfig(),
    )
    demands = demands_of(config)
    assert [name for name, _ in demands] == ["a_0", "a_1", "b_0", "b_0"]
    assert demands[0][1].needs == (((0, "R"), 2), (("global", "G"), 1)) and demands[0][1].priority == 3
    assert demands[2][1].needs == () and demands[2][1].priority == 1


def test_default_capacity_is_the_most_any_instance_needs() -> None:
    limiter = RateLimiter()
    limiter.register("a", Demand((((0, "R"), 4),)))
    limiter.register("b", Demand((((0, "R"), 5),)))
    assert limiter.capacity((0, "R")) == 5
    assert limiter.capacity((1, "R")) == 0  # per device
    limiter.unregister(Demand((((0, "R"), 5),)))
    assert limiter.capacity((0, "R")) == 4


def test_explicit_counts_per_device_and_too_few_fail_the_load() -> None:
    limiter = RateLimiter((ResourceSetting("R1", 10), ResourceSetting("R2", 5, 0), ResourceSetting("R2", 8, 1)))
    assert [limiter.capacity((d, "R2")) for d in (0, 1)] == [5, 8]
    assert limiter.capacity((3, "R1")) == 10 and limiter.capacity(("global", "R1")) == 10
    with pytest.raises(ModelLoadError, match='Resource count for "R2" is limited to 5 .* the minimum required count is 6'):
        limiter.register("inst", Demand((((0, "R2"), 6),)))
    assert limiter.capacity((0, "R2")) == 5


def test_explicit_counts_combine_as_tritons_resource_manager() -> None:
    """A name given twice for a device keeps the smaller count; a device has the larger of its own and the
    every-device count; a global resource the largest given for its name; a resource no flag names has none."""
    limiter = RateLimiter((ResourceSetting("R", 3), ResourceSetting("R", 1), ResourceSetting("D", 1, 0),
                           ResourceSetting("D", 3), ResourceSetting("G", 2, 0), ResourceSetting("G", 4, 1)))
    assert limiter.capacity((0, "R")) == 1 and limiter.capacity((0, "D")) == 3 and limiter.capacity((1, "D")) == 3
    assert limiter.capacity(("global", "G")) == 4 and limiter.capacity(("global", "R")) == 1
    assert limiter.capacity((0, "X")) == 0 and limiter.capacity(("global", "X")) == 0
    assert RateLimiter().capacity((0, "X")) == 0  # without flags: what the instances need (none registered here)


def test_a_resource_both_global_and_per_device_fails_the_load() -> None:
    limiter = RateLimiter()
    limiter.register("a", Demand((((0, "R"), 1),)))
    with pytest.raises(ModelLoadError, match='^Resource "R" is present as both global and device-specific resource'):
        limiter.register("b", Demand(((("global", "R"), 1),)))
    assert limiter.registrations() == {(0, "R"): (1,)}  # the refused instance is not counted


def test_a_resource_named_twice_counts_once_and_passive_instances_need_none() -> None:
    config = text_format.Parse(
        """name: "m" instance_group [
             { count: 1 kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 1 }, { name: "R" count: 2 } ] } },
             { count: 1 kind: KIND_CPU passive: true rate_limiter { resources [ { name: "R" count: 5 } ] } } ]""",
        mc.ModelConfig(),
    )
    assert [demand.needs for _, demand in demands_of(config)] == [(((0, "R"), 2),), ()]


def make_pool(limiter: RateLimiter, demand: Demand, count: int = 1) -> RateLimitedPool:
    config = text_format.Parse('name: "m" backend: "ferry_test"', mc.ModelConfig())
    instances = [
        testing.TestBackend().create_instance(InstanceContext("m", "1", Path("."), Path("."), config, f"m_{i}"))
        for i in range(count)
    ]
    for _ in range(count):
        limiter.register("m", demand)
    pool = InstancePool(instances, [f"m_{i}" for i in range(count)], ModelStats("m", "1"), lambda r: 1)
    return RateLimitedPool(pool, limiter, [demand] * count)


async def test_shared_resource_is_handed_over_on_release() -> None:
    limiter = RateLimiter()
    shared = Demand(((("global", "R"), 1),))
    a, b = make_pool(limiter, shared, count=2), make_pool(limiter, shared)
    index = a.try_acquire()
    assert index is not None
    assert a.idle_count() == 0 and a.try_acquire() is None  # a's second instance is idle, R is not
    assert b.try_acquire() is None
    waiting = asyncio.ensure_future(b.acquire())
    notified: list[str] = []
    a.notify_when_available(lambda: notified.append("a"))
    await asyncio.sleep(0)
    assert not waiting.done()
    a.release(index)
    assert await waiting == 0  # equal scaled priority: the pool that asked first
    assert notified == [] and limiter.in_use(("global", "R")) == 1
    b.release(0)
    assert notified == ["a"]


async def test_priority_weights_turns_between_models() -> None:
    limiter = RateLimiter()
    fast = make_pool(limiter, Demand(((("global", "R"), 1),), priority=1), count=2)
    slow = make_pool(limiter, Demand(((("global", "R"), 1),), priority=2), count=2)
    grants: list[str] = []

    async def worker(pool: RateLimitedPool, name: str) -> None:  # two per pool: both always waiting
        for _ in range(30):
            index = await pool.acquire()
            grants.append(name)
            await asyncio.sleep(0)
            pool.release(index)

    await asyncio.gather(*(worker(p, n) for p, n in [(fast, "fast"), (slow, "slow")] * 2))
    first = grants[:30]
    assert 19 <= first.count("fast") <= 21, first  # priority 2 gets half the turns of priority 1


async def test_cancelled_waiter_gives_its_grant_back() -> None:
    limiter = RateLimiter()
    demand = Demand(((("global", "R"), 1),))
    pool = make_pool(limiter, demand)
    held = pool.try_acquire()
    waiter = asyncio.ensure_future(pool.acquire())
    await asyncio.sleep(0)
    pool.release(held)  # granted to the waiter ...
    waiter.cancel()  # ... which goes away before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert limiter.in_use(("global", "R")) == 0 and pool.try_acquire() == 0


# --- enforcement in a real server -----------------------------------------------------------
def limited_model(repository: Path, name: str, batching: str) -> None:
    extra = f"""
parameters {{ key: "execute_delay_ms" value {{ string_value: "120" }} }}
{batching}
instance_group [ {{ count: 2 kind: KIND_CPU rate_limiter {{ resources [ {{ name: "R" global: true count: 1 }} ] }} }} ]
"""
    write_model(repository, name, test_model_config(name, max_batch_size=1, extra=extra))


def spy_executions(handle: Any, names: list[str]) -> list[tuple[float, float]]:
    """Record (start, end) of every execution of every instance of ``names``."""
    spans: list[tuple[float, float]] = []
    lock = threading.Lock()
    for name in names:
        for instance in handle.engine.registry.get(name).pool.instances:
            original = instance.execute

            def execute(requests, original=original):
                start = time.monotonic()
                try:
                    return original(requests)
                finally:
                    with lock:
                        spans.append((start, time.monotonic()))

            instance.execute = execute
    return spans


def max_overlap(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    current = peak = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


@pytest.mark.parametrize("rate_limit", ["execution_count", "off"])
async def test_models_sharing_one_resource_never_run_together(tmp_path: Path, server_factory, rate_limit: str) -> None:
    limited_model(tmp_path, "dyn", "dynamic_batching { }")
    limited_model(tmp_path, "plain", "")
    handle = await server_factory([tmp_path], rate_limit=rate_limit)
    spans = spy_executions(handle, ["dyn", "plain"])
    engine = handle.engine

    async def one(model: str, value: float) -> float:
        from serving_pod.core.types import InferRequest, Tensor

        data = np.full((1, 4), value, np.float32)
        response = await engine.infer(InferRequest(model, "", [Tensor("INPUT0", "FP32", data)]))
        return float(response.outputs[0].data[0, 0])

    values = await asyncio.gather(*(one(m, i) for i in range(3) for m in ("dyn", "plain")))
    assert values == [0, 0, 1, 1, 2, 2]
    assert len(spans) == 6
    if rate_limit == "off":
        assert max_overlap(spans) > 1  # 4 instances: the same load does run concurrently
    else:
        assert max_overlap(spans) == 1
        stats = await in_thread(handle.client("http").get_inference_statistics, "plain")
        assert stats["model_stats"][0]["execution_count"] == 3


async def test_too_few_explicit_copies_fail_the_load(tmp_path: Path, server_factory) -> None:
    limited_model(tmp_path, "greedy", "")
    text = (tmp_path / "greedy" / "config.pbtxt").read_text().replace("count: 1 } ]", "count: 3 } ]")
    (tmp_path / "greedy" / "config.pbtxt").write_text(text)
    handle = await server_factory(
        [tmp_path], rate_limit="execution_count", rate_limit_resources=("R:2",),
        model_control_mode="explicit",
    )
    with pytest.raises(ModelLoadError, match='Resource count for "R" is limited to 2 .* minimum required count is 3'):
        await handle.engine.load_model("greedy")
    assert not handle.engine.model_ready("greedy")


def test_rate_limit_flags() -> None:
    from serving_pod.cli import build_parser, options_from_args

    args = build_parser().parse_args(
        ["--rate-limit", "execution_count", "--rate-limit-resource", "R1:4", "--rate-limit-resource", "R2:2:1"]
    )
    engine = options_from_args(args).engine
    assert (engine.rate_limit, engine.rate_limit_resources) == ("execution_count", ("R1:4", "R2:2:1"))
    assert options_from_args(build_parser().parse_args([])).engine.rate_limit == "off"
    for bad in (["--rate-limit", "on"], ["--rate-limit-resource", "R1"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(bad)


# --- load refusals beside Triton 2.51 (recorded live with its python backend, the same groups) -----------------
def _groups(*resources: tuple[str, bool, int]) -> str:
    listed = ", ".join(f'{{ name: "{name}" global: {str(is_global).lower()} count: {count} }}'
                       for name, is_global, count in resources)
    return f"instance_group [ {{ count: 1 kind: KIND_CPU rate_limiter {{ resources [ {listed} ] }} }} ]"


#: model -> its instance groups
LIMITED_MODELS = {
    "r1": _groups(("R", False, 1)), "r2": _groups(("R", False, 2)), "r5": _groups(("R", False, 5)),
    "g1": _groups(("G", True, 1)), "g3": _groups(("G", True, 3)), "rg": _groups(("R", True, 1)),
    "x2": _groups(("X", False, 2)), "dup": _groups(("R", False, 1), ("R", False, 2)),
    "both": ('instance_group [ { count: 1 kind: KIND_CPU rate_limiter { resources [ { name: "B" count: 1 } ] } }, '
             '{ count: 1 kind: KIND_CPU rate_limiter { resources [ { name: "B" global: true count: 1 } ] } } ]'),
}
_LIMITED = 'Resource count for "{}" is limited to {} which will prevent scheduling of one or more model instances, ' \
    "the minimum required count is {}"
_BOTH = 'Resource "{}" is present as both global and device-specific resource in the model configuration.'
#: --rate-limit-resource values -> [(model loaded in this order, Triton's refusal or None where it loads)]
RECORDED_LOADS: dict[tuple[str, ...], list[tuple[str, str | None]]] = {
    ("R:1",): [("r1", None), ("r2", _LIMITED.format("R", 1, 2)), ("g1", _LIMITED.format("G", 0, 1)),
               ("rg", _BOTH.format("R")), ("x2", _LIMITED.format("X", 0, 2)), ("dup", _LIMITED.format("R", 1, 2)),
               ("both", _LIMITED.format("B", 0, 1))],
    ("R:3", "R:1"): [("r2", _LIMITED.format("R", 1, 2)), ("r1", None)],
    ("R:1", "R:3"): [("r2", _LIMITED.format("R", 1, 2)), ("r1", None)],
    ("R:1:0", "R:3"): [("r2", None), ("r5", _LIMITED.format("R", 3, 5))],
    ("R:3:0", "R:1"): [("r2", None), ("r5", _LIMITED.format("R", 3, 5))],
    ("G:2:0",): [("g1", None), ("g3", _LIMITED.format("G", 2, 3)), ("r1", _LIMITED.format("R", 0, 1))],
    ("R:2:1",): [("r1", _LIMITED.format("R", 0, 1)), ("dup", _LIMITED.format("R", 0, 2))],
    (): [("x2", None), ("g3", None), ("r1", None), ("rg", _BOTH.format("R")), ("dup", None),
         ("both", _BOTH.format("B"))],
}


@pytest.mark.parametrize("resources", list(RECORDED_LOADS), ids=lambda r: " ".join(r) or "none")
def test_rate_limited_loads_as_recorded_from_triton(tmp_path: Path, threaded_server, resources: tuple[str, ...]) -> None:
    """Which models load under ``--rate-limit=execution_count`` and these ``--rate-limit-resource`` values, and the
    refusal (the version's failure, 400 / INVALID_ARGUMENT, Triton's words) over HTTP and gRPC. Before: Ferry took
    the last of a name given twice, a device's own count over the every-device one, a global resource only from an
    every-device flag, any resource no flag named as available, and a resource both global and per device."""
    for name, groups in LIMITED_MODELS.items():
        write_model(tmp_path, name, test_model_config(name, extra=groups))
    handle = threaded_server([tmp_path], rate_limit="execution_count", rate_limit_resources=resources,
                             model_control_mode="explicit")
    for protocol in ("http", "grpc"):
        client = handle.client(protocol)
        for name, refusal in RECORDED_LOADS[resources]:
            try:
                client.load_model(name)
            except Exception as exc:  # tritonclient's InferenceServerException, either protocol
                assert refusal is not None, (name, exc)
                expected = f"load failed for model '{name}': version 1 is at UNAVAILABLE state: Invalid argument: "
                assert exc.message() == f"{expected}{refusal};\n" and exc.status() in ("400", "StatusCode.INVALID_ARGUMENT")
            else:
                assert refusal is None, name
        for name, _ in RECORDED_LOADS[resources]:
            client.unload_model(name)
