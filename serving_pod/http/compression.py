"""Content-Encoding for the HTTP adapter: bounded gzip/deflate decoding (no zip bombs) and response encoding.

Both follow tritonserver 2.51 (``src/http_server.cc``): a request body in an encoding other than gzip, deflate or
identity is refused with 501 "Unsupported compression type" and an ``Accept-Encoding: gzip, deflate`` header
naming the ones it takes; a response is encoded in the gzip, deflate or identity of the highest q-value in the
request's ``Accept-Encoding``, the first listed among equals (so ``gzip;q=0`` is never chosen). Unlike Triton,
names are matched without regard to case or surrounding spaces, as HTTP defines them.
"""

from __future__ import annotations

import functools
import gzip
import zlib

from serving_pod.core.errors import InvalidArgumentError, UnsupportedError
from serving_pod.inflate import CORRUPT, TOO_LARGE, WBITS, InflateError, inflate


#: the ``Accept-Encoding`` header of a 501 answer to a body in another encoding (Triton's)
ACCEPTED = (b"accept-encoding", b"gzip, deflate")
_CHOICES = ("identity", "gzip", "deflate")


class UnsupportedEncodingError(UnsupportedError):
    """A request body in an encoding this server cannot decode; its answer carries ``ACCEPTED``."""

    #: found before the body is parsed (``responses.before_parsing``): answered as text/plain
    before_parsing = True

    def __init__(self) -> None:
        super().__init__("Unsupported compression type")


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
        raise UnsupportedEncodingError()
    if not body:  # Triton's words, found before the body is parsed (``responses.before_parsing``): text/plain
        error = InvalidArgumentError("nothing to be decompressed")
        error.before_parsing = True
        raise error
    try:
        return inflate(body, encoding, limit)
    except InflateError as error:
        if error.reason == TOO_LARGE:
            raise size_error(error.size, limit) from None
        detail = error.detail if error.reason == CORRUPT else "truncated data"
        raise InvalidArgumentError(f"failed to decompress the request body ({encoding}): {detail}") from None


@functools.lru_cache(maxsize=64)  # a client sends the same header with every request
def choose_encoding(accept: str) -> str:
    """The response encoding for an ``Accept-Encoding`` header, as Triton chooses it (module docstring); "" for
    identity. An entry with a q-value that is not a number is skipped."""
    chosen, weight = "identity", 0.0
    for entry in accept.split(","):
        name, *params = entry.split(";")
        name = name.strip().lower()
        if name not in _CHOICES:
            continue
        quality = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = -1.0
        if quality > weight:
            chosen, weight = name, quality
    return "" if chosen == "identity" else chosen


def encode_body(body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.compress(body, compresslevel=1, mtime=0)
    if encoding == "deflate":
        return zlib.compress(body, 1)
    return body
