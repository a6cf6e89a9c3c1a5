"""Shared fixtures: ``server_factory`` starts in-process Ferry servers on free ports and stops them after the test."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator, Callable

import pytest

from serving_pod.server import FerryServer
from support.server import ServerHandle, ServerThread, make_options


@pytest.fixture
async def server_factory() -> AsyncIterator[Callable[..., Any]]:
    """``await server_factory([repo], model_control_mode=..., ...)`` -> ServerHandle; stopped after the test."""
    started: list[FerryServer] = []

    async def start(repositories: list[Path | str], **kwargs: Any) -> ServerHandle:
        server = FerryServer(make_options(repositories, **kwargs))
        await server.start()
        started.append(server)
        return ServerHandle(server)

    yield start
    for server in reversed(started):
        await server.stop()


@pytest.fixture
def threaded_server():
    """Sync twin of ``server_factory``: ``threaded_server([repo], **options)`` -> ServerHandle on a background loop."""
    started: list[ServerThread] = []

    def start(repositories: list[Path | str], **kwargs: Any) -> ServerHandle:
        thread = ServerThread(make_options(repositories, **kwargs))
        started.append(thread)
        return thread.start()

    yield start
    for thread in reversed(started):
        thread.stop()
