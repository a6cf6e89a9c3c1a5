"""Triton's response cache (``--cache-config local,size=<bytes>``): answers repeated requests without executing.

Neighbours: ``schedulers.factory`` refuses configs the cache cannot serve (``refuse_unsupported``)
and wraps the scheduler of every default, dynamic-batching or ensemble model with
``response_cache { enable: true }`` in a ``CachingScheduler`` when the engine has a cache
(``cache_for``); the engine and the protocol adapters are unaware of it.

- ``ResponseCache``: one per engine, shared by all models; LRU bounded by bytes counted as Triton's
  local cache counts them (``entry_bytes``, ``allocation_bytes``): a response is stored serialized in
  one block of a fixed segment whose own header is in use from the start, so ``nv_cache_util`` and
  the evictions come out as Triton's. The smallest cache Triton can create is ``MIN_CACHE_BYTES``.
- Key: a BLAKE2b digest of model name, version, every input (name, datatype, shape, bytes) and the
  names of the requested outputs (none listed = all the config's outputs listed). Output parameters
  are not in it: the engine classifies and writes shared memory after the cache (``core.outputs``),
  and ``binary_data`` only changes the encoding, so HTTP and gRPC clients share entries.
- Only successful responses are stored. Decoupled and sequence-batching models cannot enable it (Triton's
  message, and its status: INTERNAL ``failed to poll from model repository`` with the reason after it; an
  ensemble decoupled by a step fails its version: ``version 1 is at UNAVAILABLE state: Invalid argument: ...``).
- Kept apart from Triton on purpose (tests/serving_pod/test_cache_triton.py says how Triton behaves):
  Triton's key has neither shapes nor requested outputs, so it answers a [2, 2] request with the
  [1, 4] answer of the same bytes and returns outputs the client did not ask for; it stores a failed
  response and answers the next identical request with an empty success; an entry that fits the
  cache's size but not its free segment makes it evict every entry and then store nothing. Ferry
  keys on shapes and outputs, stores successes only, and refuses such an entry without evicting.
- Ensembles (Triton's top-level ensemble caching): the ensemble's final response is cached under
  the ensemble's name and version; a hit runs no composing model. An ensemble with a sequence
  composing model (at any depth) inherits that model's limitation, as Triton's docs say: it loads,
  with a warning, and is not cached. A decoupled composing model makes the ensemble decoupled, which the
  cache refuses at load, each version's failure (Triton 2.51's check reads the derived policy too).
  Triton 2.51 caches such an ensemble anyway, so a sequence's later requests are answered from the
  cache and never reach the stateful model: kept apart on purpose.
- Statistics as Triton keeps them: a hit counts as a success with ``cache_hit`` (lookup time) and no
  queue or compute time; every miss the model answered, with outputs or with an error, adds lookup
  plus insert time to ``cache_miss``, except one whose key another request stored meanwhile (Triton's
  dynamic batcher skips an insert that finds its key ``ALREADY_EXISTS``: two identical requests in
  one batch are one miss); a request refused before execution (queue timeout, queue full,
  cancelled) adds nothing there. An ensemble counts a miss for each response it stores, a key
  already stored included, and none for a request that failed (Triton's
  ``CacheEnsembleTopLevelRequest`` runs on success only).
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

from serving_pod.core.errors import (
    CancelledError,
    ServerError,
    UnavailableError,
)
from serving_pod.core.load_errors import VersionRefused
from serving_pod.core.types import InferRequest, InferResponse, Tensor

log = logging.getLogger("ferry.cache")

#: Triton's local cache is one boost ``managed_external_buffer`` of the configured size: its own header is in
#: use from the start (``nv_cache_util`` is never 0), and the last bytes of the segment hold no entry.
SEGMENT_HEADER_BYTES = 128
SEGMENT_TAIL_BYTES = 16
#: the smallest size Triton's local cache can be created with (smaller: the server does not start)
MIN_CACHE_BYTES = 192


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
    if int(size) < MIN_CACHE_BYTES:
        raise ValueError(f"invalid local cache size '{size}': the local cache needs at least {MIN_CACHE_BYTES} bytes")
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
    """Bytes of the tensor's buffer as Triton holds it (BYTES: each element's 4-byte length, then its bytes)."""
    if array.dtype == np.object_:
        return sum(len(item if isinstance(item, bytes) else str(item).encode()) for item in array.reshape(-1)) \
            + 4 * array.size
    return array.nbytes


def entry_bytes(outputs: list[Tensor]) -> int:
    """Bytes of a response serialized as Triton's cache stores it: the output count, then per output its packed
    size, name, datatype and shape (each with its length) and its buffer (with its size)."""
    return 4 + sum(
        8 + 4 + len(t.name.encode()) + 4 + len(t.datatype) + 4 + 8 * t.data.ndim + 8 + _array_size(t.data)
        for t in outputs
    )


def allocation_bytes(serialized: int) -> int:
    """The block the segment hands out for ``serialized`` bytes: its 8-byte header, rounded up to 16."""
    return (serialized + 8 + 15) // 16 * 16


def _frozen_copy(array: np.ndarray) -> np.ndarray:
    copy = np.array(array, copy=True)
    copy.setflags(write=False)
    return copy


def request_key(request: InferRequest, all_outputs: frozenset[str] = frozenset()) -> bytes:
    """Digest identifying ``request``'s answer: model, version, inputs and the names of the requested outputs
    (``all_outputs``, the config's, listed = none listed); output parameters are not part of it (module docstring)."""
    digest = hashlib.blake2b(digest_size=20)
    digest.update(f"{request.model_name}\0{request.model_version}\0".encode())
    for tensor in sorted(request.inputs, key=lambda t: t.name):
        digest.update(f"{tensor.name}\0{tensor.datatype}\0{tensor.data.shape}\0".encode())
        digest.update(_array_bytes(tensor.data))
    if request.outputs is not None:
        names = frozenset(output.name for output in request.outputs)
        if names != all_outputs:
            for name in sorted(names):
                digest.update(f"out\0{name}\0".encode())
    return digest.digest()


class ResponseCache:
    """LRU of response output tensors, bounded by bytes, with Triton's local-cache totals since it was made.

    As in Triton's local cache, every lookup is a hit or a miss and is timed (``lookup_ns``); every
    insert is timed (``insert_ns``), those that store nothing (an entry larger than the cache, a key
    already stored, which keeps its place in the LRU order) included; ``evictions`` counts the entries
    pushed out to make room. ``used`` counts the segment's header and each entry's block
    (``allocation_bytes``), as Triton's utilization does.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.used = SEGMENT_HEADER_BYTES
        self._entries: OrderedDict[bytes, tuple[tuple[Tensor, ...], int]] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.lookup_ns = 0
        self.insert_ns = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

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
        """Store ``outputs`` under ``key`` (evicting least recently used); False if it cannot fit or ``key`` is
        already stored."""
        start = time.monotonic_ns()
        try:
            return self._store(key, outputs)
        finally:
            self.insert_ns += time.monotonic_ns() - start

    def _store(self, key: bytes, outputs: list[Tensor]) -> bool:
        if key in self._entries:  # Triton's local cache: ALREADY_EXISTS, the entry's LRU place untouched
            return False
        serialized = entry_bytes(outputs)
        size = allocation_bytes(serialized)
        room = self.capacity - SEGMENT_TAIL_BYTES
        # larger than the cache (Triton refuses it too), or than its segment could ever hold (Triton evicts
        # every entry first, then fails: module docstring)
        if serialized > self.capacity or SEGMENT_HEADER_BYTES + size > room:
            return False
        # own copies: outputs are often views into a whole batch, which must not stay alive here
        outputs = [Tensor(t.name, t.datatype, _frozen_copy(t.data), dict(t.parameters)) for t in outputs]
        while self.used + size > room:
            _, (_, evicted) = self._entries.popitem(last=False)
            self.used -= evicted
            self.evictions += 1
        self._entries[key] = (tuple(outputs), size)
        self.used += size
        return True


class CachingScheduler:
    """Answers from the cache when it can; otherwise runs the inner scheduler and stores the answer."""

    def __init__(self, inner: Any, cache: ResponseCache, stats: Any, all_outputs: frozenset[str] = frozenset(),
                 *, ensemble: bool = False) -> None:
        self.inner = inner
        self.cache = cache
        self.stats = stats
        #: the config's output names: listing them all asks for what listing none does (``request_key``)
        self.all_outputs = all_outputs
        #: an ensemble counts its misses as Triton's ensemble scheduler does (module docstring)
        self.ensemble = ensemble

    def pending(self) -> int:
        return self.inner.pending()

    async def drain(self) -> None:
        await self.inner.drain()

    async def submit(self, request: InferRequest) -> InferResponse:
        start = time.monotonic_ns()
        key = request_key(request, self.all_outputs)
        outputs = self.cache.lookup(key)
        lookup_end = time.monotonic_ns()
        if outputs is not None:
            self.stats.record_cache_hit(lookup_end - request.arrival_ns, lookup_end - start)
            tensors = [Tensor(t.name, t.datatype, t.data, dict(t.parameters)) for t in outputs]
            return InferResponse(request.model_name, request.model_version, tensors, request.id)
        try:
            response = await self.inner.submit(request)
        except (UnavailableError, CancelledError):
            raise  # refused before execution: Triton records no cache miss for it
        except ServerError:
            if not self.ensemble:  # the model answered with an error: a miss, not stored
                self.stats.record_cache_miss(lookup_end - start)
            raise
        insert_start = time.monotonic_ns()
        if response is not None and response.final:
            stored_meanwhile = key in self.cache
            self.cache.insert(key, list(response.outputs))
            if stored_meanwhile and not self.ensemble:
                return response  # Triton's dynamic batcher: an insert that finds its key stored is no miss
        self.stats.record_cache_miss(lookup_end - start + time.monotonic_ns() - insert_start)
        return response


_caches: "weakref.WeakKeyDictionary[Any, ResponseCache | None]" = weakref.WeakKeyDictionary()


def cache_for(engine: Any) -> ResponseCache | None:
    """The engine's response cache (created on first use), or None when none is configured."""
    options = getattr(engine, "options", None)
    if options is None:
        return None
    if engine not in _caches:
        try:
            capacity = cache_capacity(getattr(options, "cache_config", None) or {})
        except ValueError as exc:  # the command line refuses these; options built otherwise: no cache, said once
            log.error("response cache disabled: %s", exc)
            capacity = None
        _caches[engine] = ResponseCache(capacity) if capacity is not None else None
    return _caches[engine]


def refuse_unsupported(config: Any) -> None:
    """``VersionRefused`` in Triton 2.51's words for a model that enables the cache but cannot use it (sequence
    batching, then decoupled, as its ``ValidateModelConfig`` checks them). Triton checks a config at its repository
    poll (``core.builder.refuse_config``: a poll refusal) and again for each version it loads, where an ensemble's
    policy is decoupled when a step's model is (``schedulers.factory``: each version's failure)."""
    if not config.response_cache.enable:
        return
    if config.HasField("sequence_batching"):
        raise VersionRefused(
            f"Response Cache does not currently support model {config.name} with sequence batching "
            "scheduler. Please disable the response cache."
        )
    if config.model_transaction_policy.decoupled:
        raise VersionRefused(
            f"Response Cache does not currently support model {config.name} with 'decoupled' "
            "transaction policy. Please disable the response cache."
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
    return CachingScheduler(scheduler, cache, model.stats, frozenset(output.name for output in config.output),
                            ensemble=config.platform == "ensemble")
