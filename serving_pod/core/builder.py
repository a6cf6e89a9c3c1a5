"""Builds the versions of a model the registry loads.

On the registry's loader thread, ``VersionBuilder.build`` prepares the config and creates every version's instances,
trying each version (``--model-load-retry-count`` times more after a failure) and keeping the serving instances an
instance-group update keeps (``core.updates``, ``instance_groups.signature``). On the event loop, ``assemble`` makes each
version's ``Model``: statistics (a version updated in place keeps its own; the warmup runs are charged to them, as
Triton counts them), instance pool and scheduler. The registry decides what to load and swaps versions in; this module
only builds them, and finalizes what a failed load made.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.backends.base import InstanceContext, VersionLoadError
from serving_pod.backends.registry import get_backend
from serving_pod.core import updates
from serving_pod.core.latency_metrics import LatencyMetricsSettings, recorder_for
from serving_pod.core.load_errors import (
    PollRefused,
    VersionRefused,
    VersionsUnavailable,
    version_reason,
)
from serving_pod.core.model import Model
from serving_pod.core.statistics import ModelStats
from serving_pod.repository import instance_groups
from serving_pod.repository.prepare import backend_settings, prepare_config
from serving_pod.schedulers.factory import create_scheduler
from serving_pod.schedulers.instances import InstancePool
from serving_pod.schedulers.rate_limiter import instance_pool
from serving_pod.warmup import WarmupRun, warm_up

log = logging.getLogger("ferry.registry")

#: what ``build`` gives per version: (config, version, what serves it). The third item is a ``BuiltInstances``, the
#: serving ``Model`` itself where the version is updated in place with the same instances, or None for an ensemble
Built = tuple[mc.ModelConfig, int, Any]


def close_instances(built: list[Built]) -> None:
    for _, _, pools in built:
        if pools and not isinstance(pools, Model):  # a version updated in place keeps its instances
            _close_all(pools.created())


@dataclass
class BuiltInstances:
    """The instances of one version built on the loader thread. ``previous``: the READY version it updates in place
    with other instance groups, whose statistics it keeps; ``kept`` maps an instance's index here to its index in
    ``previous``'s pool, for the instances taken over from it (Triton's instance signature matched)."""

    instances: list[Any]
    names: list[str]
    signatures: list[bytes]
    previous: Model | None = None
    kept: dict[int, int] = field(default_factory=dict)
    #: the warmup executions of the created instances, charged to the version's statistics (as Triton counts them)
    warmups: list[WarmupRun] = field(default_factory=list)
    #: indices of the instances of ``passive: true`` groups (``instance_groups.passive_indices``): never scheduled
    passive: frozenset[int] = frozenset()

    def created(self) -> list[Any]:
        """The instances this load created (a failed load finalizes these, never the ones it would keep)."""
        return [instance for index, instance in enumerate(self.instances) if index not in self.kept]


def _close_all(instances: list[Any]) -> None:
    for instance in instances:
        try:
            instance.close()
        except Exception:  # one failing finalize must not keep the others open
            log.exception("closing an instance of a model that failed to load")


def refuse_config(config: mc.ModelConfig) -> None:
    """The refusals Triton 2.51 makes while reading a model's config (its poll fails: no version is tried): a response
    cache it cannot use (an ensemble's as declared: one its steps make decoupled fails each version later) and
    sequence batching controls. A sequence ``state`` is checked later, per version, when its scheduler is made
    (Triton's ``version N is at UNAVAILABLE state``), so it is left out here."""
    from serving_pod.cache import refuse_unsupported
    from serving_pod.schedulers.sequence_config import parse_sequence_config

    try:
        refuse_unsupported(config)
    except VersionRefused as exc:
        raise PollRefused(str(exc)) from None
    if config.HasField("sequence_batching") and config.platform != "ensemble":
        controls = mc.ModelConfig()
        controls.CopyFrom(config)
        controls.sequence_batching.ClearField("state")
        parse_sequence_config(controls, None)


@dataclass
class VersionBuilder:
    """The server's settings for building model versions (``tritonserver``'s flags of the same names)."""

    engine: Any = None
    autocomplete: bool = True
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    default_instance_kind: str = "KIND_AUTO"
    min_compute_capability: float = instance_groups.MIN_COMPUTE_CAPABILITY
    #: ``--model-config-name``: read ``configs/<name>.pbtxt`` where a model has one
    config_name: str = ""
    #: ``--metrics-config``: whether each model version gets a ``LatencyRecorder``
    latency_metrics: LatencyMetricsSettings = field(default_factory=LatencyMetricsSettings)
    #: ``--model-load-retry-count``: further attempts at creating a version's instances after a failure
    load_retry_count: int = 0

    def build(
        self, name: str, model_dir: Path, config_override: str | None, in_place: dict[int, Model] | None = None
    ) -> list[Built]:
        """Loader thread: prepare the config and create every instance of every version, but those of the
        ``in_place`` versions (READY, their files unchanged) that ``core.updates`` updates in place: each is kept
        (its ``Model`` as the third item) or, with other instance groups, gets new instances (and is the fourth
        item of the third, whose statistics the new version keeps)."""
        try:
            config, backend_name, versions = prepare_config(
                name,
                model_dir,
                autocomplete=self.autocomplete,
                override_json=config_override,
                backend_config=self.backend_config,
                default_instance_kind=self.default_instance_kind,
                min_compute_capability=self.min_compute_capability,
                config_name=self.config_name,
                poll_checks=refuse_config,
            )
        except VersionLoadError as exc:  # the backend refused the model (not found, auto-complete): every version
            if not exc.versions:
                raise
            raise VersionsUnavailable(name, {v: version_reason(exc) for v in exc.versions}) from None
        built: list[Built] = []
        failures: dict[int, str] = {}  # as Triton, every version is tried: each failed one with its reason
        try:
            for version in versions:
                if backend_name == "ensemble":
                    built.append((config, version, None))
                    continue
                serving = (in_place or {}).get(version)
                if serving is not None and not updates.requires_reload(serving.config, config):
                    if updates.same_instances(serving.config, config):
                        built.append((config, version, serving))
                        continue
                else:
                    serving = None
                log.info("loading: %s:%d", name, version)  # tritonserver's line (an ensemble's: core.registry)
                for attempt in range(self.load_retry_count + 1):  # --model-load-retry-count, as Triton
                    made = BuiltInstances([], [], [], serving)
                    try:
                        self.create_instances(name, model_dir, config, backend_name, version, made)
                    except Exception as exc:
                        _close_all(made.created())
                        if attempt == self.load_retry_count:
                            failures[version] = version_reason(exc)
                            break
                        log.warning("failed to load '%s' version %d (attempt %d of %d), retrying: %s", name, version,
                                    attempt + 1, self.load_retry_count + 1, exc)
                        continue
                    built.append((config, version, made))
                    break
            if failures:
                raise VersionsUnavailable(name, failures, [version for _, version, _ in built])
        except Exception:
            close_instances(built)
            raise
        return built

    def create_instances(self, name: str, model_dir: Path, config: mc.ModelConfig, backend_name: str, version: int,
                          made: BuiltInstances) -> None:
        """Create and warm up every instance of one version into ``made`` (filled as they are made, so a failure
        part-way leaves the caller the ones to close). A version updated in place with other instance groups
        (``made.previous``) keeps each serving instance whose signature a new one has, as Triton: the last one kept of
        that signature, under its own name, neither initialized nor warmed up again. Not for a sequence model, whose
        scheduler places sequences on every instance at once: all its instances are created again."""
        settings = backend_settings(self.backend_config, backend_name)
        backend = get_backend(backend_name, settings)
        reusable: dict[bytes, list[int]] = {}
        previous = instance_pool(made.previous.pool) if made.previous is not None else None
        if previous is not None and not config.HasField("sequence_batching"):
            for index, signature in enumerate(previous.signatures):
                reusable.setdefault(signature, []).append(index)
        for instance_name, kind, device, group in instance_groups.placements(config):
            signature = instance_groups.signature(group, device)
            made.signatures.append(signature)
            if reusable.get(signature):
                kept = reusable[signature].pop()
                made.kept[len(made.instances)] = kept
                made.instances.append(previous.instances[kept])
                made.names.append(previous.names[kept])
                continue
            context = InstanceContext(
                model_name=name,
                model_version=str(version),
                model_dir=model_dir,
                version_dir=model_dir / str(version),
                config=config,
                name=instance_name,
                kind=kind,
                device_id=device,
                backend_config=settings,
                engine=self.engine,
            )
            made.instances.append(backend.create_instance(context))
            made.names.append(instance_name)
        made.passive = instance_groups.passive_indices(config)  # Triton warms up only the instances it schedules
        fresh = [index for index in range(len(made.instances)) if index not in made.kept and index not in made.passive]
        made.warmups = warm_up(config, model_dir, str(version), [made.instances[i] for i in fresh])

    def assemble(
        self, config: mc.ModelConfig, version: int, pools: Any, duration: float, *, model_dir: Path | None = None
    ) -> Model:
        if isinstance(pools, Model):
            return pools  # updated in place: serving on as it is
        if pools is not None and pools.previous is not None:
            stats = pools.previous.stats  # new instance groups: the version keeps its statistics
        else:
            stats = ModelStats(config.name, str(version))
            stats.load_duration_s = duration
            if self.latency_metrics.per_request:
                stats.latency = recorder_for(self.latency_metrics, config)
        model = Model(config, version, scheduler=None, stats=stats)  # type: ignore[arg-type]
        model.model_dir = model_dir
        pool = None
        if pools is not None:
            mode = config.parameters["ferry_execution_mode"].string_value if "ferry_execution_mode" in config.parameters else "auto"
            previous = instance_pool(pools.previous.pool) if pools.previous is not None else None
            # a kept instance runs on its worker thread still; it is held until the previous pool has drained
            adopted = {index: previous.worker(kept) for index, kept in pools.kept.items()} if previous else {}
            pool = InstancePool(pools.instances, pools.names, stats, model.batch_size_of, execution_mode=mode or "auto",
                                signatures=pools.signatures, adopted=adopted,
                                passive=pools.passive)
        model.pool = pool
        if pool is not None:
            for run in pools.warmups:
                pool.charge(run.requests, run.results, run.dispatch_ns, run.start_ns, run.end_ns, run.done_ns)
        model.scheduler = create_scheduler(model, pool, engine=self.engine)
        return model
