"""Listening sockets for the HTTP and metrics endpoints (also bound by ``--http-workers`` processes)."""

from __future__ import annotations

import socket


def bind_socket(address: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A bound TCP socket; ``reuse_port`` lets other processes bind the same port (the kernel spreads
    connections over them: ``--http-workers``)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    # accepted connections inherit it: small responses must not wait for delayed ACKs (Nagle)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((address, port))
    sock.set_inheritable(True)
    return sock
