"""Content-Encoding for the HTTP adapter: bounded gzip/deflate decoding (no zip bombs) and response encoding."""

from __future__ import annotations

import gzip
import zlib

from serving_pod.core.errors import InvalidArgumentError, UnsupportedError


def size_error(size: int, limit: int) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"Request JSON size of {size} exceeds the maximum allowed value of {limit} bytes. "
        "Use --http-max-input-size to increase the limit."
    )


def decode_body(body: bytes, encoding: str, limit: int) -> bytes:
    """Decompress ``body``; the decompressed size is bounded by ``limit`` before it is produced."""
    encoding = encoding.strip().lower()
    if not encoding or encoding == "identity":
        return body
    if encoding == "gzip":
        wbits = 16 + zlib.MAX_WBITS
    elif encoding == "deflate":
        wbits = zlib.MAX_WBITS
    else:
        raise UnsupportedError(f"unsupported Content-Encoding '{encoding}'; use gzip or deflate")
    decoder = zlib.decompressobj(wbits)
    try:
        out = decoder.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidArgumentError(f"failed to decompress the request body ({encoding}): {exc}") from None
    if len(out) > limit or decoder.unconsumed_tail:
        raise size_error(len(out), limit)
    if not decoder.eof:
        raise InvalidArgumentError(f"failed to decompress the request body ({encoding}): truncated data")
    return out


def choose_encoding(accept: str) -> str:
    """The response encoding for an ``Accept-Encoding`` header ("" for none)."""
    accept = accept.lower()
    if "gzip" in accept:
        return "gzip"
    if "deflate" in accept:
        return "deflate"
    return ""


def encode_body(body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.compress(body, compresslevel=1)
    if encoding == "deflate":
        return zlib.compress(body, 1)
    return body
