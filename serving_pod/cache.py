"""Triton's response cache (``--cache-config local,size=<bytes>``): answers repeated requests without executing.

Neighbours: ``schedulers.factory`` refuses configs the cache cannot serve (``refuse_unsupported``)
and wraps the scheduler of every default, dynamic-batching or ensemble model with
``response_cache { enable: true }`` in a ``CachingScheduler`` when the engine has a cache
(``cache_for``); the engine and the protocol adapters are unaware of it.

- ``ResponseCache``: one per engine, shared by all models; LRU bounded by the bytes of the cached
  output tensors plus their keys; an entry larger than the whole cache is not stored.
- Key: a BLAKE2b digest of model name, version, every input (name, datatype, shape, bytes) and the
  requested outputs with their parameters.
- Only successful responses are stored. Decoupled and sequence-batching models cannot enable it
  (load error, Triton's message).
- Ensembles (Triton's top-level ensemble caching): the ensemble's final response is cached under
  the ensemble's name and version; a hit runs no composing model. An ensemble with a sequence
  composing model (at any depth) inherits that model's limitation, as Triton's docs say: it loads,
  with a warning, and is not cached. (A decoupled composing model is refused by the ensemble loader.)
- Statistics as Triton keeps them: a hit counts as a success with ``cache_hit`` (lookup time) and no
  queue or compute time; every miss adds lookup plus insert time to ``cache_miss``.
- Server-wide totals as Triton's local cache keeps them (``hits``, ``misses``, ``lookups``,
  ``evictions``, ``lookup_ns``, ``insert_ns``, ``utilization()``): plain attributes bumped inside
  ``lookup`` and ``insert``, read by ``metrics`` at scrape time as the ``nv_cache_*`` gauges.

Runs on the event loop thread only, so no locks.
"""

from __future__ import annotations

import hashlib
import logging
import time
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np

from serving_pod.core.errors import ModelLoadError, ServerError
from serving_pod.core.types import InferRequest, InferResponse, Tensor

log = logging.getLogger("ferry.cache")

#: bytes charged per entry on top of its tensors (key, bookkeeping), so tiny entries still count.
ENTRY_OVERHEAD = 128


def cache_capacity(cache_config: dict[str, dict[str, str]]) -> int | None:
    """Bytes of the local cache configured by ``--cache-config``, None when no cache; ValueError if invalid."""
    if not cache_config:
        return None
    unknown = sorted(set(cache_config) - {"local"})
    if unknown:
        raise ValueError(
            f"unsupported cache '{unknown[0]}': only the 'local' response cache is available"
        )
    settings = cache_config["local"]
    extra = sorted(set(settings) - {"size"})
    if extra:
        raise ValueError(f"unknown setting '{extra[0]}' for the local cache (expected size=<bytes>)")
    size = settings.get("size", "")
    if not size.isdigit():
        raise ValueError(f"invalid local cache size '{size}': expected a number of bytes")
    return int(size)


def _array_bytes(array: np.ndarray) -> bytes:
    if array.dtype == np.object_:
        parts = []
        for item in array.reshape(-1):
            data = item if isinstance(item, bytes) else str(item).encode()
            parts.append(len(data).to_bytes(4, "little"))
            parts.append(data)
        return b"".join(parts)
    return np.ascontiguousarray(array).tobytes()


def _array_size(array: np.ndarray) -> int:
    if array.dtype == np.object_:
        return sum(len(item) if isinstance(item, (bytes, str)) else 8 for item in array.reshape(-1)) + 4 * array.size
    return array.nbytes


def _frozen_copy(array: np.ndarray) -> np.ndarray:
    copy = np.array(array, copy=True)
    copy.setflags(write=False)
    return copy


def request_key(request: InferRequest) -> bytes:
    """Digest identifying ``request``'s answer: model, version, inputs and requested outputs."""
    digest = hashlib.blake2b(digest_size=20)
    digest.update(f"{request.model_name}\0{request.model_version}\0".encode())
    for tensor in sorted(request.inputs, key=lambda t: t.name):
        digest.update(f"{tensor.name}\0{tensor.datatype}\0{tensor.data.shape}\0".encode())
        digest.update(_array_bytes(tensor.data))
    if request.outputs is not None:
        for output in sorted(request.outputs, key=lambda o: o.name):
            digest.update(f"out\0{output.name}\0{sorted(output.parameters.items())}\0".encode())
    return digest.digest()


class ResponseCache:
    """LRU of response output tensors, bounded by bytes, with Triton's local-cache totals since it was made.

    As in Triton's local cache, every lookup is a hit or a miss and is timed (``lookup_ns``); every
    insert is timed (``insert_ns``), those that store nothing (an entry larger than the cache, a key
    already stored) included; ``evictions`` counts the entries pushed out to make room.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.used = 0
        self._entries: OrderedDict[bytes, tuple[tuple[Tensor, ...], int]] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.lookup_ns = 0
        self.insert_ns = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    def utilization(self) -> float:
        """Fraction of the capacity in use, in [0.0, 1.0] (``nv_cache_util``)."""
        return self.used / self.capacity if self.capacity else 0.0

    def lookup(self, key: bytes) -> tuple[Tensor, ...] | None:
        start = time.monotonic_ns()
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            self.lookup_ns += time.monotonic_ns() - start
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        self.lookup_ns += time.monotonic_ns() - start
        return entry[0]

    def insert(self, key: bytes, outputs: list[Tensor]) -> bool:
        """Store ``outputs`` under ``key`` (evicting least recently used); False if it cannot fit."""
        start = time.monotonic_ns()
        try:
            return self._store(key, outputs)
        finally:
            self.insert_ns += time.monotonic_ns() - start

    def _store(self, key: bytes, outputs: list[Tensor]) -> bool:
        if key in self._entries:
            self._entries.move_to_end(key)
            return True
        size = ENTRY_OVERHEAD + len(key) + sum(_array_size(t.data) for t in outputs)
        if size > self.capacity:
            return False
        # own copies: outputs are often views into a whole batch, which must not stay alive here
        outputs = [Tensor(t.name, t.datatype, _frozen_copy(t.data), dict(t.parameters)) for t in outputs]
        while self.used + size > self.capacity:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.used -= evicted
            self.evictions += 1
        self._entries[key] = (tuple(outputs), size)
        self.used += size
        return True


class CachingScheduler:
    """Answers from the cache when it can; otherwise runs the inner scheduler and stores the answer."""

    def __init__(self, inner: Any, cache: ResponseCache, stats: Any) -> None:
        self.inner = inner
        self.cache = cache
        self.stats = stats

    def pending(self) -> int:
        return self.inner.pending()

    async def drain(self) -> None:
        await self.inner.drain()

    async def submit(self, request: InferRequest) -> InferResponse:
        start = time.monotonic_ns()
        key = request_key(request)
        outputs = self.cache.lookup(key)
        lookup_end = time.monotonic_ns()
        if outputs is not None:
            self.stats.record_cache_hit(lookup_end - request.arrival_ns, lookup_end - start)
            tensors = [Tensor(t.name, t.datatype, t.data, dict(t.parameters)) for t in outputs]
            return InferResponse(request.model_name, request.model_version, tensors, request.id)
        response = await self.inner.submit(request)
        insert_start = time.monotonic_ns()
        if response is not None and response.final:
            self.cache.insert(key, list(response.outputs))
        self.stats.record_cache_miss(lookup_end - start + time.monotonic_ns() - insert_start)
        return response


_caches: "weakref.WeakKeyDictionary[Any, ResponseCache | None]" = weakref.WeakKeyDictionary()


def cache_for(engine: Any) -> ResponseCache | None:
    """The engine's response cache (created on first use), or None when none is configured."""
    options = getattr(engine, "options", None)
    if options is None:
        return None
    if engine not in _caches:
        capacity = cache_capacity(getattr(options, "cache_config", None) or {})
        _caches[engine] = ResponseCache(capacity) if capacity is not None else None
    return _caches[engine]


def refuse_unsupported(config: Any) -> None:
    """Triton's load errors for a model that enables the cache but cannot use it (decoupled, sequence)."""
    if not config.response_cache.enable:
        return
    if config.model_transaction_policy.decoupled:
        raise ModelLoadError(
            f"Response Cache does not currently support model '{config.name}' with 'decoupled' "
            "transaction policy. Please disable the response cache."
        )
    if config.HasField("sequence_batching"):
        raise ModelLoadError(
            f"Response Cache does not currently support model '{config.name}' with sequence batching "
            "scheduler. Please disable the response cache."
        )


def sequence_step(config: Any, registry: Any) -> str | None:
    """The first composing model of an ensemble (nested ensembles included) that uses the sequence batcher."""
    for step in config.ensemble_scheduling.step:
        version = "" if step.model_version <= 0 else str(step.model_version)
        try:
            composing = registry.get(step.model_name, version).config
        except ServerError:  # validated at load; a model gone since cannot be run either
            continue
        if composing.HasField("sequence_batching"):
            return step.model_name
        if composing.platform == "ensemble":
            inner = sequence_step(composing, registry)
            if inner is not None:
                return inner
    return None


def with_response_cache(model: Any, scheduler: Any, engine: Any) -> Any:
    """``scheduler`` behind the engine's cache when the model enables it, else ``scheduler``."""
    config = model.config
    if not config.response_cache.enable:
        return scheduler
    refuse_unsupported(config)
    cache = cache_for(engine)
    if cache is None:
        return scheduler
    if config.platform == "ensemble":
        stateful = sequence_step(config, engine.registry)
        if stateful is not None:
            log.warning(
                "Response Cache is not used for ensemble '%s': composing model '%s' uses the sequence "
                "batching scheduler, which the response cache does not support", config.name, stateful,
            )
            return scheduler
    return CachingScheduler(scheduler, cache, model.stats)
