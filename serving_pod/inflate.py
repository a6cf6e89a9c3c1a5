"""Bounded gzip/deflate inflation, shared by the HTTP and gRPC adapters (no decompression bombs).

``inflate`` never produces more than ``limit + 1`` bytes, whatever the input claims, and tells a corrupt
stream, an oversized result and a truncated stream apart (``InflateError.reason``), so each protocol can
answer with its own status and wording.
"""

from __future__ import annotations

import zlib

#: zlib window bits per content coding: gzip wraps, deflate is the zlib format
WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}

CORRUPT, TOO_LARGE, TRUNCATED = "corrupt", "too large", "truncated"


class InflateError(Exception):
    """Why inflation stopped: ``reason`` is CORRUPT (``detail`` from zlib), TOO_LARGE or TRUNCATED."""

    def __init__(self, reason: str, detail: str = "", size: int = 0) -> None:
        super().__init__(detail or reason)
        self.reason = reason
        self.detail = detail
        #: bytes inflated before stopping (TOO_LARGE: more than the limit)
        self.size = size


def inflate(data: bytes, coding: str, limit: int) -> bytes:
    """``data`` inflated with ``coding`` (a ``WBITS`` key), at most ``limit`` bytes; else ``InflateError``."""
    inflater = zlib.decompressobj(WBITS[coding])
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as error:
        raise InflateError(CORRUPT, str(error)) from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise InflateError(TOO_LARGE, size=len(out))
    if not inflater.eof:  # cut short: without this, a truncated stream would pass as a shorter message
        raise InflateError(TRUNCATED)
    return out
