"""Content-Encoding for the HTTP adapter: bounded gzip/deflate decoding (no zip bombs) and response encoding."""

from __future__ import annotations

import gzip
import zlib

from serving_pod.core.errors import InvalidArgumentError, UnsupportedError
from serving_pod.inflate import CORRUPT, TOO_LARGE, WBITS, InflateError, inflate


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
    if encoding not in WBITS:
        raise UnsupportedError(f"unsupported Content-Encoding '{encoding}'; use gzip or deflate")
    try:
        return inflate(body, encoding, limit)
    except InflateError as error:
        if error.reason == TOO_LARGE:
            raise size_error(error.size, limit) from None
        detail = error.detail if error.reason == CORRUPT else "truncated data"
        raise InvalidArgumentError(f"failed to decompress the request body ({encoding}): {detail}") from None


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
