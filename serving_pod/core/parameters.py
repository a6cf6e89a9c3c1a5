"""Triton's reserved request parameters: their types, checked once for every protocol before scheduling.

``sequence_id`` (an unsigned 64-bit integer or a string), ``sequence_start`` and ``sequence_end`` (booleans),
``priority`` and ``timeout`` (unsigned 64-bit integers) are read by the schedulers and by the python
backend's request API, and only some models read them. Triton's front ends refuse a wrong type for every
model, so a client's mistake shows at once rather than when the model changes; the engine does the same
here (``Engine._admit``). Keys starting with ``triton_`` belong to Triton: only
``triton_enable_empty_final_response`` (gRPC streaming) may be sent. The HTTP codec adds what only its
JSON carries (``binary_data_output``, ``id``).

``forward_headers`` is ``--http-header-forward-pattern`` / ``--grpc-header-forward-pattern``: request headers
(gRPC metadata) whose name matches become string parameters, as in Triton; a reserved name is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Callable

from serving_pod.core.errors import InvalidArgumentError

#: the ``triton_`` keys a client may send (Triton's ``TRITON_RESERVED_REQUEST_PARAMS``)
TRITON_RESERVED_REQUEST_PARAMS = ("triton_enable_empty_final_response",)
#: parameter names a forwarded header may not take (Triton's ``kReservedParameterKeys``)
RESERVED_PARAMETER_KEYS = ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "headers",
                           "binary_data_output")
_UINT64_END = 2**64


def _unsigned(key: str, value: Any) -> None:
    if type(value) is not int or not 0 <= value < _UINT64_END:
        raise InvalidArgumentError(f"Unable to parse '{key}': expected an unsigned 64-bit integer, got {value!r}")


def _flag(key: str, value: Any) -> None:
    if type(value) is not bool:
        raise InvalidArgumentError(f"Unable to parse '{key}': expected true or false, got {value!r}")


def _sequence_id(key: str, value: Any) -> None:
    if type(value) is not str and (type(value) is not int or not 0 <= value < _UINT64_END):
        raise InvalidArgumentError(
            f"Unable to parse '{key}': expected an unsigned 64-bit integer or a string, got {value!r}"
        )


_CHECKS: dict[str, Callable[[str, Any], None]] = {
    "sequence_id": _sequence_id,
    "sequence_start": _flag,
    "sequence_end": _flag,
    "priority": _unsigned,
    "timeout": _unsigned,
}


def check_request_parameters(parameters: dict[str, Any]) -> None:
    """Refuse (``InvalidArgumentError``) a reserved parameter of the wrong type or an unknown ``triton_`` key."""
    for key, value in parameters.items():
        check = _CHECKS.get(key)
        if check is not None:
            check(key, value)
        elif key.startswith("triton_") and key not in TRITON_RESERVED_REQUEST_PARAMS:
            raise InvalidArgumentError(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
                f"starting with 'triton_' are allowed: {' '.join(TRITON_RESERVED_REQUEST_PARAMS)}"
            )


def forward_headers(parameters: dict[str, Any], headers: Iterable[tuple[str, Any]],
                    pattern: re.Pattern[str] | None = None) -> None:
    """Add each header whose name ``pattern`` finds (``re.search``, as RE2's PartialMatch; None: every one given)
    to ``parameters``.

    Names are as the client sent them (HTTP/1.1: ``http.protocol`` keeps them; HTTP/2's are lower case), matched and
    checked case-sensitively as Triton does. A binary value (gRPC ``-bin`` metadata, base64-decoded) is forwarded as
    its UTF-8 text, name and all, as Triton 2.51 forwards it; one that is not UTF-8 is not forwarded (Triton forwards
    its bytes, and a python model's ``request.parameters()`` then raises UnicodeDecodeError). A reserved or
    ``triton_`` name is an ``InvalidArgumentError``.
    """
    for name, value in headers:
        if pattern is not None and not pattern.search(name):
            continue
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                continue
        if name in RESERVED_PARAMETER_KEYS or name.startswith("triton_"):
            raise InvalidArgumentError(f"Header '{name}' is reserved for Triton usage and cannot be forwarded.")
        parameters[name] = value
