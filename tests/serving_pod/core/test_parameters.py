"""``core.parameters.forward_headers``: which headers and gRPC metadata become request parameters.

Recorded from tritonserver 2.51 with ``--grpc-header-forward-pattern=my-.*``: binary metadata (a ``-bin`` name,
base64 on the wire) is forwarded under its full name as its decoded text (``my-utf-bin: héllo`` and
``my-empty-bin: ''`` reached the python model's ``request.parameters()``); Triton forwards bytes that are not UTF-8
too, and its python model's ``request.parameters()`` then raises UnicodeDecodeError: Ferry leaves those out.
"""

from __future__ import annotations

import re

import pytest

from serving_pod.core.errors import InvalidArgumentError
from serving_pod.core.parameters import forward_headers

PATTERN = re.compile("my-.*")


def _forwarded(metadata: list[tuple[str, str | bytes]]) -> dict[str, object]:
    parameters: dict[str, object] = {}
    forward_headers(parameters, metadata, PATTERN)
    return parameters


def test_binary_metadata_is_forwarded_as_its_text() -> None:
    metadata = [("my-h", "v1"), ("other", "x"), ("my-bin-bin", b"\x01\x02"), ("my-utf-bin", "héllo".encode()),
                ("my-empty-bin", b""), ("other-bin", b"\x01")]
    assert _forwarded(metadata) == {"my-h": "v1", "my-bin-bin": "\x01\x02", "my-utf-bin": "héllo", "my-empty-bin": ""}


def test_binary_metadata_that_is_not_utf8_is_left_out() -> None:
    assert _forwarded([("my-raw-bin", b"\xff\xfeab"), ("my-h", "v1")]) == {"my-h": "v1"}


def test_a_reserved_binary_name_is_refused_as_any_other() -> None:
    with pytest.raises(InvalidArgumentError, match="Header 'triton_x-bin' is reserved"):
        forward_headers({}, [("triton_x-bin", b"1")], re.compile("x"))
