"""``http.responses.parse_json``: a request body's JSON as tritonserver reads it, refusals in clear words."""

from __future__ import annotations

import math

import pytest

from serving_pod.core.errors import InvalidArgumentError
from serving_pod.http.responses import JsonFollowedByBytes, parse_json

PREFIX = "failed to parse the request JSON buffer: "


@pytest.mark.parametrize("kind", [bytes, memoryview])
def test_a_body_that_is_not_utf8_is_refused_at_its_first_such_byte(kind) -> None:
    """A body whose bytes are not UTF-8 gets the byte where they start, or the JSON's length before binary data
    that needs ``Inference-Header-Content-Length``; a memoryview (a slice of a larger body) reads as bytes do."""
    with pytest.raises(JsonFollowedByBytes) as followed:
        parse_json(kind(b'{"inputs":[]}\xff\x00\x01'))
    assert followed.value.message == f"{PREFIX}the JSON document (13 bytes) is followed by 3 bytes that are not JSON"
    with pytest.raises(InvalidArgumentError) as invalid:
        parse_json(kind(b'{"a":"\xff"}'))
    assert invalid.value.message == f"{PREFIX}invalid UTF-8 at byte 6"
    assert math.isnan(parse_json(kind(b'\xef\xbb\xbf{"a":NaN}'))["a"])  # a byte order mark skipped, NaN a number
