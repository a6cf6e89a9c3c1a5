"""The registry with ensembles, as tritonserver 2.51 behaves: composing models load once, ensembles over each other
fail instead of hanging, and an ensemble following its composing model keeps its load-time config override.

Instance creations are counted on the ``ferry_test`` backend. Each case differed from Triton before.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from serving_pod.backends import testing as test_backend
from serving_pod.core.errors import ModelLoadError
from serving_pod.server import FerryServer
from support.server import ensemble_config, make_options, test_model_config, write_model


class _SlowFirstScan:
    """A repository whose first scan takes a while: the load that asked for it finds its model late."""

    def __init__(self, repository) -> None:
        self.repository = repository
        self.calls = 0
        self.lock = threading.Lock()

    def scan(self):
        with self.lock:
            self.calls += 1
            first = self.calls == 1
        if first:
            time.sleep(0.5)
        return self.repository.scan()


@pytest.fixture
def created(monkeypatch) -> Counter:
    """Instances created, by model name."""
    counts: Counter = Counter()
    original = test_backend.TestBackend.create_instance

    def create_instance(self, context):
        counts[context.model_name] += 1
        return original(self, context)

    monkeypatch.setattr(test_backend.TestBackend, "create_instance", create_instance)
    return counts


def _touch(path: Path) -> None:
    """Make ``path`` newer than anything written before (a reload of its model then has something to do)."""
    now = time.time_ns() + 1_000_000
    os.utime(path, ns=(now, now))


async def _started(repository: Path, load_models: tuple[str, ...], *, slow_first_scan: bool = False) -> FerryServer:
    server = FerryServer(make_options([repository], model_control_mode="explicit", load_models=load_models))
    registry = server.engine.registry
    if slow_first_scan:
        registry.repository = _SlowFirstScan(registry.repository)
    await asyncio.wait_for(server.start(), 60)
    return server


@pytest.mark.parametrize("order", [("step", "ens"), ("ens", "step")])
async def test_composing_model_listed_with_its_ensemble_loads_once(tmp_path: Path, created: Counter, order) -> None:
    """``--load-model step --load-model ens``: tritonserver 2.51 initializes ``step`` once. The ensemble could load
    it before ``step``'s own load found it in the repository; that load then loaded it a second time (and the
    ensemble again)."""
    write_model(tmp_path, "step", test_model_config("step"))
    write_model(tmp_path, "ens", ensemble_config("ens", ["step"]))
    server = await _started(tmp_path, order, slow_first_scan=True)
    try:
        assert server.engine.model_ready("step") and server.engine.model_ready("ens")
        assert created["step"] == 1
    finally:
        await server.stop()


async def test_ensembles_over_each_other_loaded_together_fail_instead_of_hanging(tmp_path: Path) -> None:
    """Two ensembles each over the other, both loaded at startup: each load waited for the other's, forever
    (tritonserver refuses them: a circular dependency)."""
    write_model(tmp_path, "step", test_model_config("step"))
    write_model(tmp_path, "ea", ensemble_config("ea", ["eb"]))
    write_model(tmp_path, "eb", ensemble_config("eb", ["ea"]))
    server = await _started(tmp_path, ("step", "ea", "eb"))
    try:
        failures = server.engine.startup_failures
        assert sorted(failures) == ["ea", "eb"]
        assert all("circular dependency between ensembles" in message for message in failures.values()), failures
        assert server.engine.model_ready("step")
        assert not server.engine.model_ready("ea") and not server.engine.model_ready("eb")
    finally:
        await server.stop()


async def test_ensemble_back_with_its_composing_model_keeps_its_config_override(tmp_path: Path, created: Counter) -> None:
    """An ensemble loaded with a "config" override, unloaded with its composing model and loaded again when that
    model returns, is the overridden one (tritonserver 2.51 keeps the model's info); it was read from the
    repository again. Loading it explicitly without the override keeps it while no file of the model is newer than
    that load (tritonserver 2.51); once its config.pbtxt is newer, such a load goes back to the repository's config."""
    write_model(tmp_path, "step", test_model_config("step"))
    write_model(tmp_path, "ens", ensemble_config("ens", ["step"]))
    override = json.dumps({
        "platform": "ensemble", "max_batch_size": 2,
        "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}],
        "ensemble_scheduling": {"step": [{"model_name": "step", "model_version": -1, "input_map": {"INPUT0": "IN"},
                                          "output_map": {"OUTPUT0": "OUT"}}]},
        "parameters": {"origin": {"string_value": "override"}},
    })
    server = await _started(tmp_path, ("step", "ens"))
    engine = server.engine
    try:
        await engine.load_model("ens", config=override)
        assert engine.model_config("ens").max_batch_size == 2
        await engine.unload_model("step")
        assert not engine.model_ready("ens")
        await engine.load_model("step")
        config = engine.model_config("ens")
        assert (config.max_batch_size, config.parameters["origin"].string_value) == (2, "override")
        _touch(tmp_path / "step" / "1")
        await engine.load_model("step")  # a reload of its composing model reloads it: still overridden
        assert engine.model_config("ens").max_batch_size == 2
        await engine.load_model("ens")  # as tritonserver 2.51: nothing newer than the override, which stays
        assert engine.model_config("ens").max_batch_size == 2
        _touch(tmp_path / "ens" / "config.pbtxt")
        await engine.load_model("ens")
        assert (engine.model_config("ens").max_batch_size, "origin" in engine.model_config("ens").parameters) == (8, False)
        with pytest.raises(ModelLoadError):
            await engine.load_model("ens", config='{"platform": "ensemble", "max_batch_size": 2}')
        assert engine.model_config("ens").max_batch_size == 8  # a failed override load changes nothing
    finally:
        await server.stop()
