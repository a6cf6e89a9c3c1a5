"""``Context``: the part of ``grpc.aio.ServicerContext`` the servicers use, for the native front end.

``abort`` raises ``wire.RpcError``; the rest reads or records what ``serving_pod.grpc.native`` sends.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import grpc

from serving_pod.grpc.wire import RpcError

if TYPE_CHECKING:
    from serving_pod.grpc.native import Call


class Context:
    """The subset of ``grpc.aio.ServicerContext`` that servicers use."""

    __slots__ = ("_call", "_code", "_details", "_trailing", "_deadline", "_metadata")

    def __init__(self, call: "Call", metadata: tuple, deadline: float | None) -> None:
        self._call = call
        self._metadata = metadata
        self._deadline = deadline
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._trailing: tuple = ()

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: tuple = ()) -> None:
        if trailing_metadata:
            self._trailing = tuple(trailing_metadata)
        raise RpcError(code, details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details

    def set_trailing_metadata(self, metadata: tuple) -> None:
        self._trailing = tuple(metadata)

    def trailing_metadata(self) -> tuple:
        return self._trailing

    def invocation_metadata(self) -> tuple:
        return self._metadata

    async def send_initial_metadata(self, metadata: tuple) -> None:
        """Sends the response headers now, carrying ``metadata`` (grpc.aio's rules: once, before any message)."""
        if self._call.headers_sent:
            raise RpcError(grpc.StatusCode.INTERNAL, "initial metadata was already sent")
        self._call.send_headers(tuple(metadata))

    def peer(self) -> str:
        return self._call.connection.peer

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def cancelled(self) -> bool:
        return self._call.cancelled

    def done(self) -> bool:
        return self._call.finished

    def set_compression(self, compression: Any) -> None:
        pass  # the server's --grpc-infer-response-compression-level decides, as in tritonserver

    def disable_next_message_compression(self) -> None:
        pass

    def auth_context(self) -> dict:
        return {}

    def peer_identities(self) -> None:
        return None
