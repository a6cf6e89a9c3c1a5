"""Poll mode with ``--exit-on-error=false``: strict readiness comes back once what failed at start-up is gone.

A repository that could not be read at start-up (``cli.run`` records it in ``Engine.startup_failures``) and a model
that failed to load then both held readiness false for good, though the poller loads the repository's models once it
reads and the fixed model once it is READY. Now each start-up failure is forgotten when the poller finds it gone; the
registry's states say the rest (Triton's strict readiness reads its models' states, not a start-up record). A model
whose config was refused at start-up holds readiness back only through its state: as in tritonserver 2.51 (poll mode,
``--exit-on-error=false``, a config with an unknown field: recorded live, ``/v2/health/ready`` 200), a config refusal
leaves the server ready, while a version that failed to load (here an unknown backend) keeps it not ready.

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
from serving_pod.core.engine import REPOSITORY_FAILURE


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
        engine.startup_failures[REPOSITORY_FAILURE + location] = error
    assert engine.is_live() and not engine.is_ready()
    write_model(repository, "late", test_model_config("late"))
    assert await _ready_within(engine, 10)
    assert engine.model_ready("late") and not engine.startup_failures


async def test_readiness_returns_once_a_failed_model_loads(tmp_path: Path, server_factory: Any) -> None:
    model_dir = write_model(tmp_path, "fixed", test_model_config("fixed").replace('"ferry_test"', '"nope"'))
    handle = await server_factory([tmp_path], model_control_mode="poll", repository_poll_secs=0.1)
    engine = handle.engine
    assert "fixed" in engine.startup_failures and not engine.is_ready()  # its version is UNAVAILABLE
    await asyncio.sleep(0.3)
    assert not engine.is_ready()  # still broken: still not ready
    (model_dir / "config.pbtxt").write_text(test_model_config("fixed"))
    assert await _ready_within(engine, 10)
    assert engine.model_ready("fixed") and not engine.startup_failures


async def test_a_config_refused_at_start_up_leaves_the_server_ready(tmp_path: Path, server_factory: Any) -> None:
    write_model(tmp_path, "good", test_model_config("good"))
    write_model(tmp_path, "refused", test_model_config("refused", extra="foo: 1"))
    handle = await server_factory([tmp_path], model_control_mode="poll", repository_poll_secs=0.1)
    engine = handle.engine
    assert "refused" in engine.startup_failures  # still logged and counted for --exit-on-error
    assert engine.is_ready() and engine.model_ready("good") and not engine.model_ready("refused")
