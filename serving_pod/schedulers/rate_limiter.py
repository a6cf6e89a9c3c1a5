"""Triton's rate limiter (``--rate-limit=execution_count``): instances execute only when their resources are free.

Neighbours: ``factory.create_scheduler`` wraps a model's ``InstancePool`` in a ``RateLimitedPool``
when the engine runs with rate limiting; every scheduler then acquires instances through it
unchanged (``try_acquire`` / ``acquire`` / ``release``; the dynamic batcher also registers with
``notify_when_available``; the sequence batcher, whose slots belong to one instance each, waits for that
instance with ``acquire_instance``). One ``RateLimiter`` per engine (``limiter_for``) is shared by all models.

Semantics (Triton's rate_limiter.md):

- ``instance_group { rate_limiter { resources [{name, global, count}], priority } }``: an instance
  holds ``count`` copies of each resource while it executes; without resources it always may run;
- copies available per device (``global: true``: one pool for the whole server); by default as
  many as the most any loaded instance needs; ``--rate-limit-resource=<name>:<count>[:<device>]``
  sets them explicitly, as Triton's ResourceManager reads them: a name given twice for one device keeps the
  smaller count, a device has the larger of its own and the every-device count, a global resource the largest
  count given for its name anywhere, and a resource no flag names has none once any flag is given. An instance
  needing more than that fails to load, as does one whose resource is global in one instance and per device in
  another (:func:`check_resources`, Triton's words);
- a resource named twice in one group counts once, with the count given last (Triton's resource map);
- passive instances (``instance_group { passive: true }``) never execute, so they hold no resources;
- when resources are freed, waiting model instances are served by ``priority`` x executions so
  far (lower first): priority 2 gets half the turns of priority 1.

A pool's instances stay registered until the pool is closed (unload) or, for a model version that
fails to load after registering, until the registry calls ``unregister_pool``: a failed load leaves
no demands behind to inflate the default capacities.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from serving_pod.core.errors import ModelLoadError
from serving_pod.schedulers.instances import InstancePool

Key = tuple[Any, str]  # ("global" | device id, resource name)


@dataclass(frozen=True, slots=True)
class ResourceSetting:
    """One ``--rate-limit-resource``: copies of ``name`` on ``device`` (None: every device)."""

    name: str
    count: int
    device: int | None = None


def parse_resource(value: str) -> ResourceSetting:
    """``<name>:<count>[:<device>]`` -> ResourceSetting; ValueError with the reason otherwise."""
    parts = value.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(f"invalid rate limit resource '{value}': expected <name>:<count>[:<device>]")
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise ValueError(
            f"invalid rate limit resource '{value}': count and device must be integers"
        ) from None
    if count < 0 or (device is not None and device < 0):
        raise ValueError(f"invalid rate limit resource '{value}': count and device must be >= 0")
    return ResourceSetting(parts[0], count, device)


@dataclass(frozen=True, slots=True)
class Demand:
    """What one instance holds while executing: (key, copies) pairs."""

    needs: tuple[tuple[Key, int], ...]
    priority: int = 1


class RateLimiter:
    """Resource copies shared by every model instance of one engine."""

    def __init__(self, settings: tuple[ResourceSetting, ...] = ()) -> None:
        #: (name, device or None for every device) -> copies; a name given twice for one device keeps the fewer
        self._explicit: dict[tuple[str, int | None], int] = {}
        for setting in settings:
            key = (setting.name, setting.device)
            self._explicit[key] = min(setting.count, self._explicit.get(key, setting.count))
        self._demands: dict[Key, list[int]] = {}
        self._in_use: dict[Key, int] = {}
        self._wanting: dict[RateLimitedPool, None] = {}

    def capacity(self, key: Key) -> int:
        scope, name = key
        if not self._explicit:
            return max(self._demands.get(key) or [0])
        if scope == "global":  # Triton looks for the name on every device
            return max((count for (known, _), count in self._explicit.items() if known == name), default=0)
        return max(self._explicit.get((name, scope), 0), self._explicit.get((name, None), 0))

    def register(self, instance: str, demand: Demand) -> None:
        """Count ``demand`` in; ``ModelLoadError`` (and not counted) where the copies cannot cover it."""
        for key, count in demand.needs:
            self._demands.setdefault(key, []).append(count)
        try:
            check_resources(demand, self.capacity, self._demands)
        except ModelLoadError:
            self.unregister(demand)
            raise

    def unregister(self, demand: Demand) -> None:
        for key, count in demand.needs:
            counts = self._demands.get(key)
            if counts and count in counts:
                counts.remove(count)
                if not counts:
                    del self._demands[key]

    def registrations(self) -> dict[Key, tuple[int, ...]]:
        """What every registered instance needs, by resource: the accounting behind default capacities."""
        return {key: tuple(sorted(counts)) for key, counts in self._demands.items()}

    def in_use(self, key: Key) -> int:
        return self._in_use.get(key, 0)

    def grantable(self, demand: Demand) -> bool:
        for key, count in demand.needs:
            if self._in_use.get(key, 0) + count > self.capacity(key):
                return False
        return True

    def take(self, demand: Demand) -> None:
        for key, count in demand.needs:
            self._in_use[key] = self._in_use.get(key, 0) + count

    def give(self, demand: Demand) -> None:
        """Return ``demand``'s copies and let waiting pools take turns, lowest scaled priority first."""
        for key, count in demand.needs:
            self._in_use[key] -= count
        if self._wanting:
            for pool in sorted(self._wanting, key=RateLimitedPool.scaled_priority):
                if not pool.serve():
                    self._wanting.pop(pool, None)

    def want(self, pool: "RateLimitedPool") -> None:
        self._wanting[pool] = None


class RateLimitedPool:
    """An ``InstancePool`` whose instances are idle only when their resources can be granted."""

    def __init__(self, inner: InstancePool, limiter: RateLimiter, demands: list[Demand]) -> None:
        self.inner = inner
        self.limiter = limiter
        self.demands = demands
        self.priority = min((d.priority for d in demands), default=1)
        self.exec_count = 0
        self._registered = True
        self.passive = inner.passive
        self._idle: deque[int] = deque(i for i in range(len(inner)) if i not in inner.held and i not in self.passive)
        #: (future, instance wanted or None for any), in arrival order
        self._waiters: deque[tuple[asyncio.Future, int | None]] = deque()
        self._listeners: list[Callable[[], None]] = []
        # what schedulers use besides acquisition goes straight to the real pool
        self.execute = inner.execute
        self.run_threaded = inner.run_threaded
        self.runs_inline = inner.runs_inline
        self.stats = inner.stats
        self.instances = inner.instances
        self.names = inner.names
        self.batch_size_of = inner.batch_size_of
        self.charge = inner.charge

    def __len__(self) -> int:
        return len(self.inner)

    def scaled_priority(self) -> int:
        return self.exec_count * self.priority

    def idle_count(self) -> int:
        """Idle instances whose resources are free now (``try_acquire`` succeeds when > 0)."""
        grantable = self.limiter.grantable
        return sum(1 for index in self._idle if grantable(self.demands[index]))

    def inline_now(self) -> None:
        """Never an instance without ``acquire``: each execution here takes its instance's resources."""
        return None

    def try_acquire(self) -> int | None:
        for index in list(self._idle):
            if self._take(index):
                return index
        return None

    def _take(self, index: int) -> bool:
        """Take instance ``index`` and its resources if it is idle and they are free."""
        demand = self.demands[index]
        if index not in self._idle or not self.limiter.grantable(demand):
            return False
        self._idle.remove(index)
        self.limiter.take(demand)
        self.exec_count += 1
        return True

    async def acquire(self) -> int:
        index = self.try_acquire()
        if index is not None:
            return index
        return await self._wait(None)

    async def acquire_instance(self, index: int) -> None:
        """Instance ``index`` itself, once it is idle and its resources are free (the sequence batcher's lanes)."""
        if not any(wanted == index for _, wanted in self._waiters) and self._take(index):
            return
        await self._wait(index)

    async def _wait(self, wanted: int | None) -> int:
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiters.append((future, wanted))
        self.limiter.want(self)
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(future.result())  # granted just as the caller went away
            raise

    def release(self, index: int) -> None:
        self._idle.append(index)
        self.limiter.give(self.demands[index])  # serves this pool too when it waits

    def admit(self, index: int) -> None:
        """A held instance of the inner pool is idle from now on (``InstancePool.admit``)."""
        self.inner.admit(index)
        if index not in self.passive:
            self._idle.append(index)
        self.serve()

    def notify_when_available(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once an instance of this pool can be acquired."""
        self._listeners.append(callback)
        self.limiter.want(self)

    def serve(self) -> bool:
        """Hand free instances to waiters and listeners; True while some are still waiting."""
        still: deque[tuple[asyncio.Future, int | None]] = deque()
        any_blocked = False  # once no instance can be had for one "any" waiter, none can for the later ones
        for future, wanted in self._waiters:
            if future.done():
                continue
            if wanted is None:
                index = None if any_blocked else self.try_acquire()
                any_blocked = index is None
            else:
                index = wanted if self._take(wanted) else None
            if index is None:
                still.append((future, wanted))
            else:
                future.set_result(index)
        self._waiters = still
        if self._listeners and self.idle_count():
            listeners, self._listeners = self._listeners, []
            for callback in listeners:
                callback()
        return bool(self._waiters or self._listeners)

    def unregister(self) -> None:
        """Take this pool's instances out of the limiter's accounting (once; later calls do nothing)."""
        if self._registered:
            self._registered = False
            for demand in self.demands:
                self.limiter.unregister(demand)

    def close(self) -> None:
        self.unregister()
        self.inner.close()


def demands_of(config: Any) -> list[tuple[str, Demand]]:
    """(instance name, Demand) per instance, in the order the registry creates instances."""
    from serving_pod.repository.instance_groups import placements

    result: list[tuple[str, Demand]] = []
    for name, _, device, group in placements(config):
        limits = group.rate_limiter
        needs: dict[Key, int] = {}  # a resource named twice: the count given last, as Triton's map keeps it
        for resource in [] if group.passive else limits.resources:
            needs[("global" if getattr(resource, "global") else device, resource.name)] = resource.count
        result.append((name, Demand(tuple(needs.items()), max(1, limits.priority))))
    return result


def check_resources(demand: Demand, capacity: Callable[[Key], int], demands: dict[Key, list[int]]) -> None:
    """``ModelLoadError`` in Triton's words (ResourceManager's checks, in its order: global resources, then devices
    in order, names sorted) for a ``demand`` the copies cannot cover, or whose resource is global here and per
    device elsewhere among the registered ``demands`` (or the other way round)."""
    for key, count in sorted(demand.needs, key=lambda need: (_scope_order(need[0][0]), need[0][1])):
        if count > capacity(key):
            raise ModelLoadError(
                f'Resource count for "{key[1]}" is limited to {capacity(key)} which will prevent scheduling of one '
                f"or more model instances, the minimum required count is {count}"
            )
    global_names = sorted(name for scope, name in demands if scope == "global")
    for name in global_names:
        if any(scope != "global" and known == name for scope, known in demands):
            raise ModelLoadError(
                f'Resource "{name}" is present as both global and device-specific resource in the model '
                "configuration."
            )


def _scope_order(scope: Any) -> int:
    """Triton's key order for a resource's scope: the global resources first, then device ids."""
    return -2 if scope == "global" else int(scope)


_limiters: "weakref.WeakKeyDictionary[Any, RateLimiter]" = weakref.WeakKeyDictionary()


def limiter_for(engine: Any) -> RateLimiter | None:
    """The engine's rate limiter, or None when it runs with ``--rate-limit=off``."""
    options = getattr(engine, "options", None)
    if options is None or getattr(options, "rate_limit", "off") == "off":
        return None
    limiter = _limiters.get(engine)
    if limiter is None:
        settings = tuple(parse_resource(value) for value in options.rate_limit_resources)
        limiter = _limiters[engine] = RateLimiter(settings)
    return limiter


def instance_pool(pool: Any) -> InstancePool:
    """A model's ``InstancePool``: ``pool`` itself, or the one a ``RateLimitedPool`` wraps."""
    return pool.inner if isinstance(pool, RateLimitedPool) else pool


def unregister_pool(pool: Any) -> None:
    """Undo ``rate_limited_pool``'s registration of a pool whose model version will never serve."""
    if isinstance(pool, RateLimitedPool):
        pool.unregister()


def rate_limited_pool(model: Any, pool: InstancePool, engine: Any) -> Any:
    """``pool`` behind the engine's rate limiter (and set as ``model.pool``), or ``pool`` as it is."""
    limiter = limiter_for(engine)
    if limiter is None:
        return pool
    named = demands_of(model.config)
    registered: list[Demand] = []
    try:
        for name, demand in named:
            limiter.register(name, demand)
            registered.append(demand)
    except ModelLoadError:
        for demand in registered:
            limiter.unregister(demand)
        raise
    limited = RateLimitedPool(pool, limiter, [demand for _, demand in named])
    model.pool = limited
    return limited
