"""HPACK for the native gRPC front end: decoding a connection's header blocks, and the server's own blocks.

Client blocks are decoded by the ``hpack`` package with the connection's dynamic table (``HeaderBlocks``,
one per connection). The server's blocks are literals without indexing and without Huffman coding
(``encode_headers``), which mean the same in any table state, so gRPC's few fixed blocks are built once.
"""

from __future__ import annotations

import re

import hpack

COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB
#: decoded header blocks kept per connection (one per distinct repeated call shape)
BLOCK_CACHE_SIZE = 64
_REPR = re.compile(r"<[^<>]* at 0x[0-9a-fA-F]+>")


class BlockError(Exception):
    """A header block the connection cannot survive (HTTP/2 error ``code``)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def only_indexed(block: bytes) -> bool:
    """Whether an HPACK block holds indexed header fields only (RFC 7541 6.1), which never change the table."""
    position, size = 0, len(block)
    while position < size:
        first = block[position]
        if not first & 0x80:
            return False
        position += 1
        if first & 0x7F == 0x7F:  # the index continues in the following bytes
            while position < size and block[position] & 0x80:
                position += 1
            position += 1
    return True


class HeaderBlocks:
    """A connection's header-block decoder: the HPACK table, the size limit and the repeated-block cache."""

    def __init__(self, max_header_list_size: int) -> None:
        self.max_header_list_size = max_header_list_size
        self._decoder = hpack.Decoder()
        # blocks over the advertised limit are still decoded whole (the HPACK table must stay in step with the
        # client's encoder) and the stream refused; past this hard limit the table is lost, and the connection
        # goes away once its open calls finish (``h2.H2Connection._header_list_beyond_limit``)
        self._decoder.max_header_list_size = 4 * max_header_list_size + 65536
        self.cache: dict[bytes, list[tuple[bytes, bytes]] | None] = {}

    def decode(self, block: bytes) -> list[tuple[bytes, bytes]] | None:
        """The block's header list, or None when it is over the advertised size (the stream is refused).

        A client repeating a call sends the same block of indexed fields each time; such a block leaves the
        dynamic table as it was, so its decoding is kept until a block that may change the table arrives.
        """
        cache = self.cache
        if block in cache:
            return cache[block]
        try:
            decoded: list[tuple[bytes, bytes]] = self._decoder.decode(block, raw=True)  # type: ignore[assignment]
        except hpack.OversizedHeaderListError:
            # decoding stopped mid-block: the table is out of step with the client's, no block can be decoded again
            raise BlockError(ENHANCE_YOUR_CALM, "header list beyond the hard limit") from None
        except hpack.HPACKError as error:
            # hpack's words may name the buffer (``from <memory at 0x...>``): an address is no client's business
            raise BlockError(COMPRESSION_ERROR, "header block: " + _REPR.sub("the block", str(error))) from None
        headers: list[tuple[bytes, bytes]] | None = decoded
        if sum(32 + len(name) + len(value) for name, value in decoded) > self.max_header_list_size:
            headers = None  # refused by the layer above; the connection goes on
        if not only_indexed(block):
            cache.clear()
        elif len(cache) < BLOCK_CACHE_SIZE:
            cache[block] = headers
        return headers


def _encode_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    """HPACK block of literals without indexing (new names, no Huffman): the same bytes in any state."""
    out = bytearray()
    for name, value in headers:
        if name == b":status" and value == b"200":
            out.append(0x88)  # static table entry 8
            continue
        out.append(0x00)  # literal header field without indexing, new name
        out += _encode_int(len(name), 7)
        out += name
        out += _encode_int(len(value), 7)
        out += value
    return bytes(out)
