"""Wires each model version to its scheduling policy, explicitly, from its config."""

from __future__ import annotations

from typing import Any

from serving_pod.core.errors import ModelLoadError
from serving_pod.schedulers.base import Scheduler
from serving_pod.schedulers.default import DefaultScheduler
from serving_pod.schedulers.instances import InstancePool


def create_scheduler(model: Any, pool: InstancePool | None, *, engine: Any) -> Scheduler:
    """The scheduler for ``model``: ensemble, sequence, dynamic or default, as its config says."""
    config = model.config
    if config.platform == "ensemble":
        from serving_pod.schedulers.ensemble import EnsembleScheduler

        return EnsembleScheduler(model, engine=engine)
    assert pool is not None
    if config.HasField("sequence_batching"):
        from serving_pod.schedulers.sequence import SequenceScheduler

        return SequenceScheduler(model, pool, model_dir=getattr(model, "model_dir", None))
    return DefaultScheduler(pool)
