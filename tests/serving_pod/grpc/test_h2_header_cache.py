"""A connection's header-block decoder and its repeated-block cache (``serving_pod.grpc.hpack_blocks``), against a
real HPACK encoder.

A repeated block of indexed fields is served from the cache; any block that may change the dynamic table
empties it, so the same bytes decode to what they mean in the new table state.
"""

from __future__ import annotations

import hpack

from serving_pod.grpc import hpack_blocks


def _connection() -> hpack_blocks.HeaderBlocks:
    return hpack_blocks.HeaderBlocks(16 * 1024)


def test_only_indexed_recognises_the_representations() -> None:
    assert hpack_blocks.only_indexed(b"\x82\x86\xbe")  # static and dynamic indexed fields
    assert hpack_blocks.only_indexed(b"\xff\x80\x01\x82")  # an index continued over several bytes
    assert not hpack_blocks.only_indexed(b"\x82\x40\x01a\x01b")  # literal with incremental indexing
    assert not hpack_blocks.only_indexed(b"\x20")  # dynamic table size update
    assert not hpack_blocks.only_indexed(b"\x00\x01a\x01b")  # literal without indexing


def test_repeated_indexed_block_is_served_from_the_cache() -> None:
    encoder = hpack.Encoder()
    connection = _connection()
    headers = [(b":method", b"POST"), (b":path", b"/inference.GRPCInferenceService/ModelInfer"),
               (b"x-custom", b"one")]
    first = encoder.encode(headers, huffman=True)
    assert connection.decode(first) == headers
    assert connection.cache == {}  # the first block added entries to the table: not cached
    again = encoder.encode(headers, huffman=True)
    assert hpack_blocks.only_indexed(again)
    assert connection.decode(again) == headers
    assert again in connection.cache
    assert connection.decode(again) == headers


def test_a_table_change_invalidates_cached_blocks() -> None:
    encoder = hpack.Encoder()
    connection = _connection()
    one = [(b"x-custom", b"one")]
    connection.decode(encoder.encode(one))
    repeated = encoder.encode(one)  # refers to the newest dynamic entry (index 62)
    assert connection.decode(repeated) == one
    # a new entry becomes index 62: the very same bytes now mean the new header
    connection.decode(encoder.encode([(b"x-custom", b"two")]))
    assert connection.cache == {}
    assert connection.decode(repeated) == [(b"x-custom", b"two")]


def test_oversized_header_list_is_refused_even_when_cached() -> None:
    encoder = hpack.Encoder()
    connection = hpack_blocks.HeaderBlocks(100)
    big = [(b"x-big", b"v" * 200)]
    assert connection.decode(encoder.encode(big)) is None
    repeated = encoder.encode(big)
    assert connection.decode(repeated) is None
    assert connection.decode(repeated) is None
