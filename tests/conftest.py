"""Shared fixtures: ``server_factory`` starts in-process Ferry servers on free ports and stops them after the test.

Also the live-Triton guard: a test not marked ``slow`` (the default suite) cannot start NVIDIA Triton
(``support.triton.running_triton`` raises), so the default run stays fast and compares with recorded answers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator, Callable

import pytest

from serving_pod.server import FerryServer
from support import triton
from support.server import ServerHandle, ServerThread, make_options


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Setup, call and teardown of a test not marked ``slow`` (module fixtures it sets up included) may not start
    a live Triton."""
    triton.forbid_live_triton(None if item.get_closest_marker("slow") else item.nodeid)
    try:
        return (yield)
    finally:
        triton.forbid_live_triton(None)


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
