"""Wires each model version to its scheduling policy, explicitly, from its config.

Order matters for what a failed load leaves behind: config-level refusals (the response cache on a
decoupled or sequence model) come first, then the pool joins the engine's rate limiter, and a
scheduler that refuses the config afterwards takes the pool back out of the limiter.
"""

from __future__ import annotations

from typing import Any

from serving_pod.cache import refuse_unsupported, with_response_cache
from serving_pod.schedulers.base import Scheduler
from serving_pod.schedulers.default import DefaultScheduler
from serving_pod.schedulers.dynamic import DynamicScheduler
from serving_pod.schedulers.instances import InstancePool
from serving_pod.schedulers.rate_limiter import rate_limited_pool, unregister_pool


def create_scheduler(model: Any, pool: InstancePool | None, *, engine: Any) -> Scheduler:
    """The scheduler for ``model``: ensemble, sequence, dynamic or default, as its config says."""
    config = model.config
    refuse_unsupported(config)
    if config.platform == "ensemble":
        from serving_pod.schedulers.ensemble import EnsembleScheduler

        return with_response_cache(model, EnsembleScheduler(model, engine=engine), engine)
    assert pool is not None
    limited = rate_limited_pool(model, pool, engine)  # the pool itself when --rate-limit=off
    try:
        return _instance_scheduler(model, limited, engine)
    except BaseException:
        unregister_pool(limited)
        raise


def _instance_scheduler(model: Any, pool: Any, engine: Any) -> Scheduler:
    config = model.config
    if config.HasField("sequence_batching"):
        from serving_pod.schedulers.sequence import SequenceScheduler

        return SequenceScheduler(model, pool, model_dir=getattr(model, "model_dir", None))
    if config.HasField("dynamic_batching"):
        return with_response_cache(model, DynamicScheduler(model, pool), engine)
    return with_response_cache(model, DefaultScheduler(pool), engine)
