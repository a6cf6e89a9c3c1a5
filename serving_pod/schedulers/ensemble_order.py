"""The order in which Triton 2.51 lists an ensemble's outputs in a response (pure functions, no I/O).

Triton's ensemble scheduler fills a ``std::unordered_map<std::string, DimsList>`` from the config's outputs, in
config order, and builds each response by iterating that map: the outputs come in the map's iteration order,
whatever order the config or the request lists them in. That order is deterministic: libstdc++'s
``std::hash<std::string>`` (``_Hash_bytes``, a 64-bit Murmur variant with a fixed seed) picks each name's bucket,
and libstdc++'s node insertion and rehash rules (a singly linked list, a node joining the front of its bucket or
of the whole list) give the sequence. ``response_order`` replays exactly that, so an ensemble's response lists
its outputs as tritonserver's does (clients that read outputs by position, and byte-for-byte comparisons, see
no difference). Checked against tritonserver 2.51 and against a compiled ``std::unordered_map``.

Neighbour: ``ensemble.py`` orders each response with the result, computed once per ensemble version.
"""

from __future__ import annotations

from typing import Iterable

_MASK = (1 << 64) - 1
_MUL = (0xC6A4A793 << 32) + 0x5BD1E995
_SEED = 0xC70F6907

#: libstdc++'s bucket counts of an unordered_map growing one insertion at a time from empty (max load factor
#: 1.0): the first insertion allocates 13 buckets; inserting into a map of ``n`` elements in ``n`` buckets
#: rehashes to the next count. Beyond the last, outputs keep the last count (no ensemble has millions of outputs).
_BUCKET_COUNTS = (13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229, 172933, 351061,
                  712697, 1447153, 2938679, 5967347)


def _shift_mix(value: int) -> int:
    return value ^ (value >> 47)


def string_hash(name: str) -> int:
    """libstdc++'s ``std::hash<std::string>`` of ``name`` (UTF-8 bytes) on a 64-bit platform."""
    data = name.encode()
    length = len(data)
    aligned = length & ~7
    value = (_SEED ^ (length * _MUL)) & _MASK
    for start in range(0, aligned, 8):
        word = int.from_bytes(data[start:start + 8], "little")
        value ^= (_shift_mix((word * _MUL) & _MASK) * _MUL) & _MASK
        value = (value * _MUL) & _MASK
    if length & 7:
        value ^= int.from_bytes(data[aligned:], "little")
        value = (value * _MUL) & _MASK
    value = (_shift_mix(value) * _MUL) & _MASK
    return _shift_mix(value)


class _UnorderedMap:
    """The node list of a libstdc++ ``unordered_map`` with unique string keys: insertion and rehash only."""

    _BEFORE_BEGIN = object()  # the list's sentinel, which a bucket may point at

    def __init__(self) -> None:
        self.head: str | None = None
        self.next: dict[str, str | None] = {}
        self.buckets: dict[int, object] = {}  # bucket -> the node before its first node
        self.bucket_count = 1
        self.hashes: dict[str, int] = {}

    def _next_of(self, node: object) -> str | None:
        return self.head if node is self._BEFORE_BEGIN else self.next[node]  # type: ignore[index]

    def _set_next(self, node: object, value: str | None) -> None:
        if node is self._BEFORE_BEGIN:
            self.head = value
        else:
            self.next[node] = value  # type: ignore[index]

    def insert(self, key: str) -> None:
        if key in self.hashes:
            return
        size = len(self.hashes)
        if size == 0 or size >= self.bucket_count:
            grown = next((count for count in _BUCKET_COUNTS if count > size), _BUCKET_COUNTS[-1])
            if grown != self.bucket_count:
                self._rehash(grown)
        code = self.hashes[key] = string_hash(key)
        bucket = code % self.bucket_count
        before = self.buckets.get(bucket)
        if before is not None:  # a non-empty bucket: the node goes first in it
            self.next[key] = self._next_of(before)
            self._set_next(before, key)
            return
        self.next[key] = self.head  # an empty bucket: the node goes first in the whole list
        self.head = key
        following = self.next[key]
        if following is not None:
            self.buckets[self.hashes[following] % self.bucket_count] = key
        self.buckets[bucket] = self._BEFORE_BEGIN

    def _rehash(self, count: int) -> None:
        node = self.head
        self.head = None
        buckets: dict[int, object] = {}
        first_bucket = 0
        while node is not None:
            following = self.next[node]
            bucket = self.hashes[node] % count
            before = buckets.get(bucket)
            if before is None:
                self.next[node] = self.head
                self.head = node
                buckets[bucket] = self._BEFORE_BEGIN
                if self.next[node] is not None:
                    buckets[first_bucket] = node
                first_bucket = bucket
            else:
                self.next[node] = self._next_of(before)
                self._set_next(before, node)
            node = following
        self.buckets = buckets
        self.bucket_count = count

    def keys(self) -> list[str]:
        order = []
        node = self.head
        while node is not None:
            order.append(node)
            node = self.next[node]
        return order


def response_order(output_names: Iterable[str]) -> tuple[str, ...]:
    """The ensemble's outputs (given in config order) in the order Triton's responses list them."""
    table = _UnorderedMap()
    for name in output_names:
        table.insert(name)
    return tuple(table.keys())
