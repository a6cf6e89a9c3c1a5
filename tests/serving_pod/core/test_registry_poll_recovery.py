"""Poll mode with ``--exit-on-error=false``: strict readiness comes back once what failed at start-up is gone.

A repository that could not be read at start-up (``cli.run`` records it in ``Engine.startup_failures``) and a model
that failed to load then both held readiness false for good, though the poller loads the repository's models once it
reads and the fixed model once it is READY. Now each start-up failure is forgotten when the poller finds it gone; the
registry's states say the rest (Triton's strict readiness reads its models' states, not a start-up record).

Kept different on purpose: Triton 2.51 started in poll mode without its repository (``failed to stat file``) is not
even live (400) and never polls again, so it never serves the models that appear later; Ferry is live, polls, serves
them and turns ready.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from support.server import test_model_config, write_model

from serving_pod.cli import unusable_repositories


async def _ready_within(engine: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if engine.is_ready():
            return True
        await asyncio.sleep(0.05)
    return engine.is_ready()


async def test_readiness_returns_once_the_repository_reads(tmp_path: Path, server_factory: Any) -> None:
    repository = tmp_path / "later"
    handle = await server_factory([repository], model_control_mode="poll", repository_poll_secs=0.1)
    engine = handle.engine
    for location, error in unusable_repositories([str(repository)]).items():  # as cli.run records it
        engine.startup_failures[f"model repository {location}"] = error
    assert engine.is_live() and not engine.is_ready()
    write_model(repository, "late", test_model_config("late"))
    assert await _ready_within(engine, 10)
    assert engine.model_ready("late") and not engine.startup_failures


async def test_readiness_returns_once_a_failed_model_loads(tmp_path: Path, server_factory: Any) -> None:
    model_dir = write_model(tmp_path, "fixed", test_model_config("fixed", extra="max_batch_size: 2"))
    handle = await server_factory([tmp_path], model_control_mode="poll", repository_poll_secs=0.1)
    engine = handle.engine
    assert "fixed" in engine.startup_failures and not engine.is_ready()
    await asyncio.sleep(0.3)
    assert not engine.is_ready()  # still broken: still not ready
    (model_dir / "config.pbtxt").write_text(test_model_config("fixed"))
    assert await _ready_within(engine, 10)
    assert engine.model_ready("fixed") and not engine.startup_failures
