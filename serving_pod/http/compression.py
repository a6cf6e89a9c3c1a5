"""Content-Encoding for the HTTP adapter: bounded gzip/deflate decoding (no zip bombs) and response encoding.

Both follow tritonserver 2.51 (``src/http_server.cc``), names matched as it matches them, exactly (recorded live):
a request body in an encoding other than ``gzip``, ``deflate`` or ``identity`` (``GZIP``, ``gzip `` and an empty
value included) is refused with 501 "Unsupported compression type" and an ``Accept-Encoding: gzip, deflate`` header
naming the ones it takes (``GetRequestCompressionType``); a response is encoded in the gzip, deflate or identity of
the highest q-value in the request's ``Accept-Encoding``, the first listed among equals, so ``gzip;q=0`` is never
chosen (``CompressionTypeUsed``: entries split at commas, leading spaces skipped, the weight after ``;q=`` read as
``std::stod`` reads it; ``GZIP``, ``gzip; q=1`` and ``gzip ;q=1`` are none of the three).
"""

from __future__ import annotations

import functools
import gzip
import re
import zlib

from serving_pod.core.errors import InvalidArgumentError, UnsupportedError
from serving_pod.inflate import CORRUPT, TOO_LARGE, WBITS, InflateError, inflate


#: the ``Accept-Encoding`` header of a 501 answer to a body in another encoding (Triton's)
ACCEPTED = (b"accept-encoding", b"gzip, deflate")
_CHOICES = ("identity", "gzip", "deflate")
#: the number ``std::stod`` reads at the start of a q-value (after blanks): the longest decimal, hexadecimal, inf
#: or nan there (``0.5;level=1`` is 0.5); none: the entry is skipped
_STOD = re.compile(r"[ \t\n\v\f\r]*([+-]?(?:0x(?:[0-9a-f]+\.?[0-9a-f]*|\.[0-9a-f]+)(?:p[+-]?[0-9]+)?"
                   r"|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?|inf(?:inity)?|nan))", re.IGNORECASE)


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
    if encoding == "identity":
        return body
    if encoding not in WBITS:  # an empty value too (module docstring)
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
    identity. An entry whose q-value is not a number is skipped."""
    chosen, weight = "identity", 0.0
    for entry in accept.split(","):
        name, has_weight, quality_text = entry.lstrip(" ").partition(";q=")
        if not name and has_weight:
            continue
        quality = 1.0
        if has_weight:
            number = _STOD.match(quality_text)
            if number is None:
                continue
            text = number.group(1)
            quality = float.fromhex(text) if "x" in text or "X" in text else float(text)
        if name in _CHOICES and quality > weight:
            chosen, weight = name, quality
    return "" if chosen == "identity" else chosen


def encode_body(body: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.compress(body, compresslevel=1, mtime=0)
    if encoding == "deflate":
        return zlib.compress(body, 1)
    return body
