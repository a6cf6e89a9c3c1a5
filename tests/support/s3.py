"""A real S3-compatible server for tests: moto's server mode on 127.0.0.1 (skips when moto is missing)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import pytest


@contextmanager
def moto_endpoint() -> Iterator[str]:
    """``host:port`` of a moto S3 server running for the duration of the block."""
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"{host}:{port}"
    finally:
        server.stop()
