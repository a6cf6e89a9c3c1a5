"""gRPC's keepalive and ping policy on one HTTP/2 connection (tritonserver's ``--grpc-keepalive-*`` flags).

gRPC core's semantics: the server pings every ``time_ms`` (only while calls are open unless
``permit_without_calls``, at most ``max_pings_without_data`` times between the frames it sends) and closes the
connection when an acknowledgement takes longer than ``timeout_ms``. A client that pings sooner than
``min_recv_ping_interval_without_data_ms`` after its last ping while the server sent nothing earns a strike (with
no calls open the interval is two hours); past ``max_ping_strikes`` it gets GOAWAY ENHANCE_YOUR_CALM
"too_many_pings". ``serving_pod.grpc.h2`` calls in on every PING and whenever it sends headers or data.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from serving_pod.grpc.h2 import H2Connection
    from serving_pod.options import GrpcKeepalive

log = logging.getLogger("ferry.grpc.h2")

KEEPALIVE_PAYLOAD = b"ferry-ka"
#: without calls (and without permit_without_calls) a client may ping once in this many seconds (gRPC: 2 h)
IDLE_PING_INTERVAL = 7200.0
NO_ERROR, ENHANCE_YOUR_CALM = 0x0, 0xB  # RFC 9113 error codes


class PingPolicy:
    """The pings one connection sends and the pings it accepts."""

    def __init__(self, connection: "H2Connection", policy: "GrpcKeepalive") -> None:
        self.connection = connection
        self.policy = policy
        self._next: asyncio.TimerHandle | None = None
        self._deadline: asyncio.TimerHandle | None = None
        # reset whenever the server sends headers or data
        self._pings_without_data = 0
        self._strikes = 0
        self._last_received: float | None = None

    def start(self) -> None:
        """Schedule the next keepalive ping."""
        if not self.connection.closed:
            loop = asyncio.get_running_loop()
            self._next = loop.call_later(self.policy.time_ms / 1000, self._send)

    def stop(self) -> None:
        for handle in (self._next, self._deadline):
            if handle is not None:
                handle.cancel()

    def _send(self) -> None:
        connection, policy = self.connection, self.policy
        if connection.closed:
            return
        idle = not connection.streams and not policy.permit_without_calls
        limited = policy.max_pings_without_data and self._pings_without_data >= policy.max_pings_without_data
        if idle or limited:
            self.start()
            return
        self._pings_without_data += 1
        connection.send_ping(KEEPALIVE_PAYLOAD)
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(policy.timeout_ms / 1000, self._expired)

    def _expired(self) -> None:
        log.info("closing HTTP/2 connection from %s: keepalive ping not acknowledged", self.connection.peer)
        self.connection.close(NO_ERROR, "keepalive watchdog timeout")

    def acknowledged(self, payload: bytes) -> None:
        """A PING ACK arrived: the keepalive ping's answer schedules the next one."""
        if payload == KEEPALIVE_PAYLOAD and self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
            self.start()

    def allowed(self) -> bool:
        """Whether a client PING is within policy (False: the connection was closed for it)."""
        policy = self.policy
        if not policy.max_ping_strikes:
            return True
        now = time.monotonic()
        last, self._last_received = self._last_received, now
        if last is None:
            return True
        busy = bool(self.connection.streams) or policy.permit_without_calls
        interval = policy.min_recv_ping_interval_without_data_ms / 1000 if busy else IDLE_PING_INTERVAL
        if now - last >= interval:
            return True
        self._strikes += 1
        if self._strikes <= policy.max_ping_strikes:
            return True
        self.connection.close(ENHANCE_YOUR_CALM, "too_many_pings")
        return False

    def sent_data(self) -> None:
        self._pings_without_data = 0
        self._strikes = 0
        self._last_received = None
