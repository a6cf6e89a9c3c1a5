"""The dynamic batcher's queue: priority levels, each with Triton's ``ModelQueuePolicy``.

Neighbours: ``dynamic.DynamicScheduler`` owns one ``PriorityQueue`` and forms batches by walking it
in service order (``walk``), then takes the batch off the front (``pop``). Semantics follow Triton:

- level 1 is served first; a request's ``priority`` parameter picks its level, 0 or a value above
  ``priority_levels`` means ``default_priority_level``; without ``priority_levels`` there is one level;
- each level has its policy (``priority_queue_policy[level]`` or ``default_queue_policy``; without
  ``priority_levels`` the ``priority_queue_policy`` entries are ignored, as Triton ignores them):
  ``max_queue_size`` (0 = unlimited; full -> "[request id: <id>] Exceeds maximum queue size" at once, not
  charged to any statistic, refused as before the queue (``not_enqueued``), as in Triton),
  ``default_timeout_microseconds`` counted from enqueue (0: none), ``allow_timeout_override`` (the
  request's ``timeout`` parameter, in microseconds, may only shorten a non-zero default), and ``timeout_action``: REJECT answers an expired
  request with "Request timeout expired"; DELAY moves it behind the level's unexpired requests;
- policies are applied lazily, to the requests a batch scan reaches (as Triton's cursor does).

Pure bookkeeping: no I/O, no event loop, time comes in as ``now_ns`` so tests control it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Iterator

from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core.errors import InvalidArgumentError, UnavailableError, not_enqueued
from serving_pod.core.validation import prefix

QUEUE_FULL = "Exceeds maximum queue size"
TIMEOUT_EXPIRED = "Request timeout expired"


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """One level's ``ModelQueuePolicy`` with times in nanoseconds."""

    delay_on_timeout: bool = False
    default_timeout_ns: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    @classmethod
    def from_config(cls, policy: mc.ModelQueuePolicy) -> "QueuePolicy":
        return cls(
            delay_on_timeout=policy.timeout_action == mc.ModelQueuePolicy.DELAY,
            default_timeout_ns=policy.default_timeout_microseconds * 1000,
            allow_timeout_override=policy.allow_timeout_override,
            max_queue_size=policy.max_queue_size,
        )

    def deadline(self, now_ns: int, timeout_us: int) -> int:
        """Monotonic deadline of a request enqueued at ``now_ns`` (0 = none)."""
        timeout_ns = self.default_timeout_ns
        if not timeout_ns:
            return 0  # as Triton: no default timeout, nothing to shorten
        if self.allow_timeout_override and 0 < timeout_us * 1000 < timeout_ns:
            timeout_ns = timeout_us * 1000
        return now_ns + timeout_ns

    @property
    def may_expire(self) -> bool:
        return self.default_timeout_ns > 0


class Entry:
    """A queued request: its future, batch rows, enqueue time and deadline (set by the queue)."""

    __slots__ = ("request", "future", "rows", "enqueue_ns", "deadline_ns")

    def __init__(self, request: Any, future: Any, rows: int, enqueue_ns: int) -> None:
        self.request = request
        self.future = future
        self.rows = rows
        self.enqueue_ns = enqueue_ns
        self.deadline_ns = 0


class Level:
    """One priority level: unexpired requests first, then DELAYed ones."""

    __slots__ = ("policy", "queue", "delayed")

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self.queue: deque[Entry] = deque()
        self.delayed: deque[Entry] = deque()

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)


def _uint_parameter(parameters: dict[str, Any], name: str) -> int:
    value = parameters.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        if isinstance(value, str) and value.isdigit():
            return int(value)
        raise InvalidArgumentError(
            f"request parameter '{name}' must be an unsigned integer, got {value!r}"
        )
    return value


def request_timeout_us(parameters: dict[str, Any]) -> int:
    """A request's ``timeout`` parameter in microseconds, 0 without one (InvalidArgumentError if malformed)."""
    return _uint_parameter(parameters, "timeout") if "timeout" in parameters else 0


class PriorityQueue:
    """Requests waiting for a batch, in Triton's service order."""

    def __init__(self, batching: mc.ModelDynamicBatching) -> None:
        default = QueuePolicy.from_config(batching.default_queue_policy)
        self.priority_levels = batching.priority_levels
        self.default_level = batching.default_priority_level if self.priority_levels else 1
        count = max(1, self.priority_levels)
        self.levels = [
            Level(
                QueuePolicy.from_config(batching.priority_queue_policy[number])
                if self.priority_levels and number in batching.priority_queue_policy  # else ignored, as Triton
                else default
            )
            for number in range(1, count + 1)
        ]
        self.may_expire = any(level.policy.may_expire for level in self.levels)
        self.size = 0
        #: requests the last walk found expired under REJECT, or cancelled by their client
        self.rejected: list[Entry] = []
        self.cancelled: list[Entry] = []

    def level_of(self, parameters: dict[str, Any]) -> Level:
        """The level a request's ``priority`` parameter selects (InvalidArgumentError if malformed)."""
        if not self.priority_levels or "priority" not in parameters:
            return self.levels[self.default_level - 1]
        priority = _uint_parameter(parameters, "priority")
        if priority == 0 or priority > self.priority_levels:
            priority = self.default_level
        return self.levels[priority - 1]

    def enqueue(self, entry: Entry, level: Level, parameters: dict[str, Any]) -> None:
        """Append ``entry`` to ``level``; UnavailableError when the level is full."""
        policy = level.policy
        if policy.max_queue_size and len(level) >= policy.max_queue_size:
            raise not_enqueued(UnavailableError(prefix(entry.request) + QUEUE_FULL))
        if policy.may_expire:
            entry.deadline_ns = policy.deadline(entry.enqueue_ns, request_timeout_us(parameters))
        level.queue.append(entry)
        self.size += 1

    def walk(self, now_ns: int) -> Iterator[Entry]:
        """Queued requests in service order; expired and cancelled ones are taken out on the way.

        Expired requests go to ``rejected`` (REJECT) or behind their level (DELAY); requests whose
        client went away go to ``cancelled``. Only the requests the caller consumes are examined.
        """
        check_deadline = self.may_expire
        for level in self.levels:
            queue = level.queue
            index = 0
            while index < len(queue):
                entry = queue[index]
                if entry.future.cancelled():
                    del queue[index]
                    self.size -= 1
                    self.cancelled.append(entry)
                    continue
                if check_deadline and entry.deadline_ns and now_ns > entry.deadline_ns:
                    del queue[index]
                    if level.policy.delay_on_timeout:
                        level.delayed.append(entry)
                    else:
                        self.size -= 1
                        self.rejected.append(entry)
                    continue
                yield entry
                index += 1
            delayed = level.delayed
            index = 0
            while index < len(delayed):
                entry = delayed[index]
                if entry.future.cancelled():
                    del delayed[index]
                    self.size -= 1
                    self.cancelled.append(entry)
                    continue
                yield entry
                index += 1

    def pop(self, count: int) -> list[Entry]:
        """Take the first ``count`` requests in service order (those the last walk yielded first)."""
        taken: list[Entry] = []
        for level in self.levels:
            for queue in (level.queue, level.delayed):
                while queue and len(taken) < count:
                    taken.append(queue.popleft())
                if len(taken) == count:
                    self.size -= count
                    return taken
        self.size -= len(taken)
        return taken

    def take_dropped(self) -> tuple[list[Entry], list[Entry]]:
        """The requests the last walks rejected and found cancelled, handed over once."""
        rejected, cancelled = self.rejected, self.cancelled
        if rejected:
            self.rejected = []
        if cancelled:
            self.cancelled = []
        return rejected, cancelled
