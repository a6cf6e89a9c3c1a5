"""gRPC's conventions on top of HTTP/2, for the native front end (``serving_pod.grpc.native``).

Header blocks the server sends (built once: HPACK literals are stateless), status trailers, the 5-byte
length-prefixed message frame and its gzip/deflate compression, ``grpc-timeout`` and metadata values,
and ``RpcError``, the status an RPC ends with. Nothing here holds connection state.
"""

from __future__ import annotations

import base64
import re
import urllib.parse
import zlib
from typing import Any

import grpc

from serving_pod.grpc.hpack_blocks import encode_headers
from serving_pod.inflate import CORRUPT, TOO_LARGE, WBITS, InflateError, inflate

PREFIX_OK = b"\x00"
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
_TIMEOUT = re.compile(rb" *([0-9]+) *([HMSmun]) *")
#: gRPC core reads a larger ``grpc-timeout`` amount as no deadline
MAX_TIMEOUT_AMOUNT = 1_000_000_000
#: request headers that are gRPC's own, not the call's metadata
RESERVED = {b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"}
ACCEPT_ENCODING = b"identity,deflate,gzip"


def takes_serialized(handler: Any) -> Any:
    """Mark a unary servicer method the native front end calls with its request still serialized (``bytes``),
    to decode as it likes; it may then answer serialized too. It must take the parsed message as well (what
    grpc.aio's server gives it) and answer that with a message."""
    handler.takes_serialized = True
    return handler


def response_header_list(algorithm: bytes | None) -> list[tuple[bytes, bytes]]:
    """A response's leading headers when its messages use ``algorithm`` (None: uncompressed)."""
    headers = [(b":status", b"200"), (b"content-type", b"application/grpc")]
    if algorithm is not None:
        headers.append((b"grpc-encoding", algorithm))
    headers.append((b"grpc-accept-encoding", ACCEPT_ENCODING))
    return headers


def metadata_headers(metadata: tuple) -> list[tuple[bytes, bytes]]:
    """Custom metadata as header fields: ``-bin`` values base64-encoded (unpadded), the rest as text."""
    out = []
    for key, value in metadata:
        if key.endswith("-bin") and isinstance(value, bytes):
            value = base64.b64encode(value).rstrip(b"=")
        out.append((key.encode(), value if isinstance(value, bytes) else str(value).encode()))
    return out


OK_TRAILERS = encode_headers([(b"grpc-status", b"0")])
#: response headers by the response messages' compression (``--grpc-infer-response-compression-level``)
HEADERS_FOR: dict[bytes | None, bytes] = {
    algorithm: encode_headers(response_header_list(algorithm)) for algorithm in (None, b"gzip", b"deflate")
}
#: gRPC core's ranking, lightest first: a compression level picks from the algorithms the client accepts
_RANKING = (b"gzip", b"deflate")
#: the RPCs whose responses ``--grpc-infer-response-compression-level`` compresses: tritonserver sets the level on
#: its inference handlers only (its ModelMetadata, ModelConfig, RepositoryIndex ... answers go uncompressed)
COMPRESSED_PATHS = frozenset((b"/inference.GRPCInferenceService/ModelInfer",
                              b"/inference.GRPCInferenceService/ModelStreamInfer"))


def response_compression(level: str, accepted: bytes, path: bytes) -> bytes | None:
    """The algorithm for ``level`` (none, low, med, high) among those the client's grpc-accept-encoding lists, for
    an RPC on ``path`` (None where its responses are not compressed)."""
    if level == "none" or not accepted or path not in COMPRESSED_PATHS:
        return None
    tokens = {token.strip() for token in accepted.split(b",")}
    candidates = [algorithm for algorithm in _RANKING if algorithm in tokens]
    if not candidates:
        return None
    index = {"low": 0, "med": len(candidates) // 2}.get(level, len(candidates) - 1)
    return candidates[index]


#: an uncompressed message at least this large is not copied behind its 5-byte prefix (``message_frame``)
WRITE_APART = 64 * 1024


def message_frame(data: bytes, algorithm: bytes | None) -> bytes | tuple[bytes, bytes]:
    """One length-prefixed gRPC message, compressed with ``algorithm`` when given; a large uncompressed one as
    (prefix, message), for the connection to write side by side (``h2.H2Connection.try_send``) without a copy.

    As gRPC core, a message that compression would not make smaller goes uncompressed (flag 0) even though the
    stream's grpc-encoding names ``algorithm``: tritonserver's small inference responses arrive so."""
    if algorithm is not None:
        packer = zlib.compressobj(wbits=WBITS[algorithm.decode("latin-1")])
        packed = packer.compress(data) + packer.flush()
        if len(packed) < len(data):
            return b"\x01" + len(packed).to_bytes(4, "big") + packed
    if len(data) >= WRITE_APART:
        return PREFIX_OK + len(data).to_bytes(4, "big"), data
    return PREFIX_OK + len(data).to_bytes(4, "big") + data


def joined(frame: bytes | tuple[bytes, bytes]) -> bytes:
    """A ``message_frame`` as one ``bytes``, for a writer that takes no pieces."""
    return frame if type(frame) is bytes else b"".join(frame)


class RpcError(Exception):
    """Ends an RPC with ``code`` and ``details`` (what ``context.abort`` raises)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def status_block(code: grpc.StatusCode, details: str, *, with_headers: bool,
                 trailing: tuple = ()) -> bytes:
    """Trailers (or a trailers-only response) carrying a gRPC status."""
    headers = [(b":status", b"200"), (b"content-type", b"application/grpc")] if with_headers else []
    headers.append((b"grpc-status", str(code.value[0]).encode()))
    if details:
        headers.append((b"grpc-message", urllib.parse.quote(details, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")
                        .encode()))
    headers += metadata_headers(trailing)
    return encode_headers(headers)


def decompress(data: bytes, encoding: bytes, limit: int) -> bytes:
    """One compressed message, at most ``limit`` bytes once inflated (else RESOURCE_EXHAUSTED)."""
    coding = encoding.decode("latin-1")
    if coding not in WBITS:
        raise RpcError(grpc.StatusCode.INTERNAL, "Compressed message without a grpc-encoding")
    try:
        return inflate(data, coding, limit)
    except InflateError as error:
        if error.reason == TOO_LARGE:
            raise RpcError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"Received message larger than max (more than {limit} bytes decompressed)") from None
        detail = error.detail if error.reason == CORRUPT else "truncated stream"
        raise RpcError(grpc.StatusCode.INTERNAL, f"Failed to decompress the message: {detail}") from None


def parse_timeout(value: bytes) -> float | None:
    """Seconds of a ``grpc-timeout`` header value; None: no deadline. INTERNAL when malformed.

    Read as gRPC core (so tritonserver and the grpcio front end) reads it, not as strictly as the spec's
    "at most 8 digits": any number of digits, spaces around the number and the unit, and an amount above
    1,000,000,000 units meaning no deadline at all.
    """
    match = _TIMEOUT.fullmatch(value)
    if match is None:
        raise RpcError(grpc.StatusCode.INTERNAL, f"Invalid grpc-timeout '{value.decode('latin-1')}'")
    amount = int(match[1])
    return None if amount > MAX_TIMEOUT_AMOUNT else amount * _TIMEOUT_UNITS[match[2]]


def metadata_value(key: bytes, value: bytes) -> tuple[str, Any]:
    """A custom header as ``invocation_metadata`` gives it: ``-bin`` values base64-decoded to bytes."""
    name = key.decode("latin-1")
    if name.endswith("-bin"):
        try:
            return name, base64.b64decode(value + b"=" * (-len(value) % 4))
        except ValueError:  # binascii.Error
            raise RpcError(grpc.StatusCode.INTERNAL, f"Invalid base64 in binary metadata '{name}'") from None
    return name, value.decode("latin-1")
