"""``serving_pod.inflate``: the bounded inflation under both adapters tells its three failures apart."""

from __future__ import annotations

import gzip
import zlib

import pytest

from serving_pod.inflate import CORRUPT, TOO_LARGE, TRUNCATED, InflateError, inflate


@pytest.mark.parametrize("coding,pack", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_round_trip_and_each_failure(coding, pack):
    data = bytes(range(256)) * 40
    packed = pack(data)
    assert inflate(packed, coding, len(data)) == data  # exactly at the limit is fine
    with pytest.raises(InflateError) as too_large:
        inflate(packed, coding, len(data) - 1)
    assert too_large.value.reason == TOO_LARGE and too_large.value.size == len(data)
    with pytest.raises(InflateError) as truncated:
        inflate(packed[: len(packed) // 2], coding, len(data))
    assert truncated.value.reason == TRUNCATED
    with pytest.raises(InflateError) as corrupt:
        inflate(b"\x00not compressed at all", coding, len(data))
    assert corrupt.value.reason == CORRUPT and corrupt.value.detail


def test_bomb_inflates_no_further_than_the_limit():
    bomb = zlib.compress(b"\x00" * (64 << 20), 9)  # 64 MiB of zeros in about 64 KiB
    with pytest.raises(InflateError) as error:
        inflate(bomb, "deflate", 1 << 20)
    assert error.value.reason == TOO_LARGE and error.value.size == (1 << 20) + 1
