"""What is loaded: model versions, their states (LOADING/READY/UNLOADING/UNAVAILABLE) and model control.

The registry asks the repository what exists, has ``core.builder`` prepare configs and create instances on a
loader thread (the event loop keeps serving), then swaps new versions in atomically. A failed reload keeps
the previous versions serving, and a failed (re)load leaves nothing behind: the instances it made
are finalized and the versions it assembled leave the rate limiter. As Triton 2.51, a first load refused before any
version is tried (its config, an ensemble's composing models) lists no version of the model (its row: UNAVAILABLE
and the reason, where Triton's holds the name only); a config refused where Triton's repository poll refuses it answers
Triton's 500 ``failed to poll from model repository``, with the reason after it; a config Triton checks per version
(tensors, instance groups, label files) and a version whose scheduler refuses it (a sequence state, the response cache
of an ensemble a step makes decoupled) are each version's failure (``core.load_errors``). Unloading drains a version's
scheduler before finalizing its instances.

As Triton, ensembles follow their composing models: unloading a model first unloads the ensembles whose steps
name it (and theirs; at shutdown too, an ensemble goes before its composing models), which load again once all their
composing models are READY (as they were loaded: a load-time config override stays); reloading a composing model
reloads the READY ensembles over it. An ensemble unloaded on purpose stays unloaded. Ensembles over themselves or each
other (loaded at once too, instead of waiting for each other forever) are refused with Triton's ``circular dependency
between ensembles``.

A load of a loaded model does what Triton's does (``core.updates``): nothing when no file of the model directory is
newer than at its last load (a ``config`` override always counts as newer, and makes a later load without one find
nothing newer, keeping the override, as Triton 2.51, even across an unload; but a model first loaded with an override
reads its repository files at the next load without one); else each version is updated in place or loaded afresh.

Poll mode, as Triton 2.51: a model whose directory left the repository unloads and leaves the index, though requests
still find it with no available versions, and loads afresh when it comes back (``ModelEntry.removed``); a version
unloaded (its directory removed, say) is "not at ready state", not "not found", while other versions serve.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tritonclient.grpc import model_config_pb2 as mc

from serving_pod.core.builder import Built, BuiltInstances, VersionBuilder, close_instances
from serving_pod.core.load_errors import (
    CircularDependency,
    EnsembleInvalid,
    NoVersionAvailable,
    PollFailed,
    PollRefused,
    VersionRefused,
    VersionsUnavailable,
    composing_failure,
    version_reason,
)
from serving_pod.core.errors import (
    InvalidArgumentError,
    ModelLoadError,
    ServerError,
    model_not_ready,
    unknown_model,
    unknown_version,
)
from serving_pod.core.latency_metrics import LatencyMetricsSettings
from serving_pod.core.model import Model
from serving_pod.repository import instance_groups
from serving_pod.repository.config import config_path
from serving_pod.repository.timestamps import ModelTimestamp
from serving_pod.repository.repository import ModelRepository, ModelSource
from serving_pod.schedulers.rate_limiter import instance_pool, unregister_pool

log = logging.getLogger("ferry.registry")

READY, LOADING, UNLOADING, UNAVAILABLE = "READY", "LOADING", "UNLOADING", "UNAVAILABLE"
#: ensembles whose dependencies the current task is loading (detects ensembles that contain each other)
_ENSEMBLE_CHAIN: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("ensemble_chain", default=())


_STOL = re.compile(r"\s*[+-]?[0-9]+")


def parse_version(version: str) -> int:
    """A requested model version as Triton reads it (``std::stol``: leading blanks, a sign, then the leading
    digits), with Triton's errors: unparsable or beyond 64 bits, or negative."""
    match = _STOL.match(version)
    number = int(match.group()) if match else None
    if number is None or not -(2**63) <= number < 2**63:
        raise InvalidArgumentError(f"failed to get model version from specified version string '{version}' "
                                   "(details: stol), version should be an integral value > 0")
    if number < 0:
        raise InvalidArgumentError(f"invalid model version specified '{version}' , "
                                   "version should be an integral value > 0")
    return number


def _ready_version(ready: list[Model], version: str) -> Model | None:
    for model in ready:
        if model.version_str == version:
            return model
    return None


@dataclass
class VersionState:
    version: int
    state: str
    reason: str = ""
    model: Model | None = None


@dataclass
class ModelEntry:
    """Everything known about one model name."""

    name: str
    versions: dict[int, VersionState] = field(default_factory=dict)
    signature: str = ""
    #: versions currently serving, newest first (the default version is the first).
    ready: list[Model] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: an ensemble unloaded with a composing model: its steps' models, all READY again -> it loads again
    awaiting: frozenset[str] = frozenset()
    #: how its READY versions were loaded (a load-time config override, a file-override directory): loading it
    #: again because a composing model came back loads it the same way, as Triton keeps a model's info
    config_override: str | None = None
    override_dir: Path | None = None
    #: the model directory's times at the last successful load (None: the next load is a fresh one)
    timestamp: ModelTimestamp | None = None
    #: why its last load failed before any version was tried (a refused config, an ensemble's dependencies): the
    #: index lists it with this reason and no version
    refused: str = ""
    #: its version policy left no version to load once: Triton's life cycle holds it from then on, with no version,
    #: so a request for it finds it "has no available versions" (not "is not found": a refused config is not held)
    held: bool = False
    #: its directory left the repository (poll mode): unloaded, and no longer listed by the index, while requests
    #: for it still find it "has no available versions", as Triton 2.51's life cycle keeps the name; back in the
    #: repository, it loads afresh whatever its files' times
    removed: bool = False


class ModelRegistry:
    """Loaded models and model control (none / poll / explicit)."""

    def __init__(
        self,
        repository: ModelRepository,
        *,
        autocomplete: bool = True,
        backend_config: dict[str, dict[str, str]] | None = None,
        engine: Any = None,
        default_instance_kind: str = "KIND_AUTO",
        min_compute_capability: float = instance_groups.MIN_COMPUTE_CAPABILITY,
        config_name: str = "",
        latency_metrics: LatencyMetricsSettings | None = None,
        load_retry_count: int = 0,
    ) -> None:
        self.repository = repository
        self.builder = VersionBuilder(
            engine, autocomplete, backend_config or {}, default_instance_kind, min_compute_capability, config_name,
            latency_metrics or LatencyMetricsSettings(), load_retry_count,
        )
        self.config_name = config_name
        self.entries: dict[str, ModelEntry] = {}
        #: ensemble being loaded -> the model its load waits for (a step's load, its own or one under way)
        self._waits: dict[str, str] = {}
        self.on_change: list[Callable[[], None]] = []

    # --- look-ups on the request path -------------------------------------------------------
    def get(self, name: str, version: str = "") -> Model:
        """The READY model version for a request; Triton's errors otherwise."""
        entry = self.entries.get(name)
        ready = entry.ready if entry is not None else []
        if version:
            model = _ready_version(ready, version)  # as asked ("3"): the usual case, parsed no further
            if model is not None:
                return model
            version = str(parse_version(version))  # as Triton: a bad version string is refused before the look-up
        elif ready:
            return ready[0]
        if not ready:
            if entry is None or (not entry.versions and not entry.held):
                raise unknown_model(name)
            if version and int(version) not in entry.versions:
                raise unknown_version(name, version)  # as Triton: a version never loaded is not found
            raise model_not_ready(name, version or None)
        model = _ready_version(ready, version)  # as Triton reads it ("03" -> "3")
        if model is None:
            if int(version) in entry.versions:  # as Triton: a version its life cycle holds (unloaded, failed)
                raise model_not_ready(name, version)
            raise unknown_version(name, version)
        return model

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            self.get(name, version)
        except ServerError:
            return False
        return True

    def all_ready(self) -> bool:
        """Strict readiness as Triton 2.51 reads its life cycle's models (``InferenceServer::IsReady``): a model held
        with no version, or a version neither READY nor unloaded, holds readiness back. A load refused before the life
        cycle holds the model (its config at the repository poll, an ensemble's steps) does not; a model that failed
        at start-up does (``Engine.startup_failures``)."""
        for entry in self.entries.values():
            if entry.held and not entry.versions:
                return False
            states = [v.state for v in entry.versions.values()]
            if states and not entry.ready and any(s in (LOADING, UNAVAILABLE) for s in states):
                if any(v.reason and v.reason != "unloaded" for v in entry.versions.values()):
                    return False
                if LOADING in states:
                    return False
        return True

    def ready_models(self) -> list[Model]:
        return [model for entry in self.entries.values() for model in entry.ready]

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Repository index rows: every model in the repository, with its versions' states."""
        sources, _ = self.repository.scan()
        rows: list[dict[str, str]] = []
        names = sorted(set(sources) | set(self.entries))
        for name in names:
            entry = self.entries.get(name)
            if entry is not None and entry.removed and name not in sources:
                continue  # as Triton: a model whose directory left the repository is not listed
            if entry is None or not entry.versions:
                if not ready_only:
                    # refused before any version was tried: Triton lists the name only (the reason only in its log);
                    # Ferry keeps the reason in view, with no version (none was tried)
                    refused = {"state": UNAVAILABLE, "reason": entry.refused} if entry and entry.refused else {}
                    rows.append({"name": name, **refused})
                continue
            for version in sorted(entry.versions):
                state = entry.versions[version]
                if ready_only and state.state != READY:
                    continue
                row = {"name": name, "version": str(version), "state": state.state}
                if state.reason:  # Triton leaves an empty reason out (a READY version has none)
                    row["reason"] = state.reason
                rows.append(row)
        return rows

    # --- model control -----------------------------------------------------------------------
    async def load(
        self,
        name: str,
        *,
        config_override: str | None = None,
        model_dir: Path | None = None,
        source: ModelSource | None = None,
        composing_changed: bool = False,
    ) -> None:
        """Load (or reload) ``name``; raises ModelLoadError and keeps old versions serving on failure.
        ``composing_changed``: an ensemble loaded again because a composing model was, even with no newer file.

        The entry and its lock are taken before the repository is scanned, so an ensemble loading at the same
        time sees this load under way and waits for it instead of loading the model a second time."""
        entry = self.entries.get(name)
        if entry is None:
            entry = self.entries[name] = ModelEntry(name)
        override_dir = model_dir
        async with entry.lock:
            if model_dir is None:
                try:
                    model_dir, source = await self._locate(name, source)
                except ServerError:
                    if not entry.versions and self.entries.get(name) is entry:
                        del self.entries[name]  # nothing of it was ever loaded: no trace in the index
                    raise
            entry.awaiting = frozenset()  # loading now: no longer waits for its composing models
            entry.removed = False
            first_load = not entry.ready
            timestamp = None
            if override_dir is None:
                timestamp = await asyncio.to_thread(ModelTimestamp.read, model_dir, config_path(model_dir, self.config_name))
                if (not first_load and not composing_changed and config_override is None and entry.timestamp is not None
                        and not entry.timestamp.modified(timestamp)):
                    entry.signature = source.signature if source else entry.signature
                    log.info("'%s' is unchanged since it was loaded: nothing to load", name)
                    return
                if config_override is not None:
                    timestamp = timestamp.with_config_time(time.time_ns())
            previous = entry.timestamp
            in_place = {} if previous is None or timestamp is None else {
                m.version: m for m in entry.ready if not previous.version_modified(timestamp, m.version)}
            # a model never loaded from its repository files and loaded with a config override: a later load without
            # one reads the repository again (Triton keeps no times for it)
            recorded = None if config_override is not None and previous is None else timestamp
            if first_load:
                for state in entry.versions.values():
                    state.state, state.reason = LOADING, ""
            start = time.monotonic()
            built: list[Built] = []
            models: list[Model] = []
            try:
                built = await asyncio.to_thread(self.builder.build, name, model_dir, config_override, in_place)
                if built and built[0][2] is None:  # an ensemble: composing models first, then its graph
                    await self._prepare_ensemble(built[0][0])
                    for _, version, _ in built:  # as tritonserver: once its composing models have loaded
                        log.info("loading: %s:%d", name, version)
                duration = time.monotonic() - start
                failures: dict[int, str] = {}
                for config, version, pools in built:
                    try:
                        models.append(self.builder.assemble(config, version, pools, duration, model_dir=model_dir))
                    except ServerError as exc:
                        if pools is None and not isinstance(exc, VersionRefused):
                            raise  # an ensemble's scheduler: refused for the model, not a version
                        # a version's scheduler refused it (a sequence state; the response cache an ensemble's
                        # decoupled step rules out): that version is UNAVAILABLE
                        failures[version] = version_reason(exc)
                if failures:
                    raise VersionsUnavailable(name, failures, [m.version for m in models])
            except Exception as exc:
                # versions assembled before the failing one joined the rate limiter: none of them serves
                for model in models:
                    if all(model is not kept for _, _, kept in built):  # one updated in place serves on
                        unregister_pool(model.pool)
                await asyncio.to_thread(close_instances, built)  # a scheduler may refuse the config
                error = exc if isinstance(exc, ServerError) else ModelLoadError(
                    f"failed to load '{name}': {type(exc).__name__}: {exc}"
                )
                if isinstance(error, PollRefused):  # Triton's 500 "failed to poll", with the reason it only logs
                    error = PollFailed(name, str(error))
                message = str(error)
                if isinstance(error, VersionsUnavailable):  # Triton's log lines: one per failed version
                    for version, reason in error.reasons.items():
                        log.error("failed to load '%s' version %d: %s", name, version, reason)
                    log.info("failed to load '%s'", name)
                elif isinstance(exc, PollRefused):  # tritonserver's line, with Ferry's reason (it names the file only)
                    log.error("Poll failed for model directory '%s': %s", name, exc)
                elif isinstance(error, EnsembleInvalid):  # tritonserver's line: the status of its dependency check
                    log.error("Invalid argument: %s", error.why.rstrip("\n"))
                else:
                    log.error("%s", message if message.startswith("failed to load") else f"failed to load '{name}': {message}")
                if first_load and isinstance(error, VersionsUnavailable):  # each version's own reason, as Triton
                    entry.refused = ""
                    entry.versions = {v: VersionState(v, UNAVAILABLE, reason) for v, reason in error.reasons.items()}
                    for version in error.loaded:
                        entry.versions[version] = VersionState(version, UNAVAILABLE, "unloaded")
                elif first_load:
                    entry.held = entry.held or isinstance(error, NoVersionAvailable)
                    # refused before any version was tried (its config, an ensemble's composing models): as Triton,
                    # no version is listed for it (a version 1 need not exist); versions unloaded before stay
                    entry.refused = message
                    for state in entry.versions.values():
                        state.state, state.reason = UNAVAILABLE, state.reason or "unloaded"
                raise error from None
            for config, _, kept in built:
                if isinstance(kept, Model):
                    kept.config = config  # as Triton: the new version_policy is served from now on
            taken_over = [(model, made) for model, (_, _, made) in zip(models, built)
                          if isinstance(made, BuiltInstances) and made.kept]
            for _, made in taken_over:  # the previous pool leaves these instances running when it closes
                previous = instance_pool(made.previous.pool)  # type: ignore[union-attr]
                for kept in made.kept.values():
                    previous.hand_over(kept)
            old = entry.ready
            entry.ready = sorted(models, key=lambda m: m.version, reverse=True)
            log.info("successfully loaded '%s'", name)  # tritonserver's line: before the versions it replaces unload
            entry.versions = {m.version: VersionState(m.version, READY, "", m) for m in entry.ready}
            entry.signature = source.signature if source else ""
            entry.config_override, entry.override_dir = config_override, override_dir
            entry.timestamp = recorded
            entry.refused = ""
            retired = [model for model in old if all(model is not new for new in models)]
            for model in retired:
                entry.versions.setdefault(model.version, VersionState(model.version, UNLOADING))
            await self._retire(retired)
            for model, made in taken_over:  # the previous pool has drained: the kept instances serve the new one
                for index in made.kept:
                    model.pool.admit(index)
            for model in old:
                if model.version not in {m.version for m in entry.ready}:
                    entry.versions[model.version] = VersionState(model.version, UNAVAILABLE, "unloaded")
        self._changed()
        await self._load_dependents(name, reloaded=not first_load)

    async def _locate(self, name: str, source: ModelSource | None) -> tuple[Path, ModelSource]:
        """The repository's directory of ``name`` (``source`` when the caller scanned already)."""
        if source is None:
            sources, duplicates = await asyncio.to_thread(self.repository.scan)
            if name in duplicates:
                raise ModelLoadError(duplicates[name])
            source = sources.get(name)
            if source is None:
                log.error("failed to poll model '%s': model not found in any model repository.", name)
                # Triton's status for a name its repositories do not hold: INTERNAL (HTTP 500), not NOT_FOUND
                raise PollFailed(name)
        return source.path, source

    async def unload(self, name: str) -> None:
        """Unload ``name`` and, as Triton, the ensembles over it, before it (module docstring)."""
        entry = self.entries.get(name)
        if entry is None:
            return  # tritonserver answers success to unloading a model it never loaded (HTTP and gRPC)
        for dependent, steps in self._dependents(name):
            await self.unload(dependent.name)
            dependent.awaiting = steps
        async with entry.lock:
            entry.awaiting = frozenset()  # unloaded on purpose: it stays unloaded
            entry.refused = ""  # its row is the name only again, as Triton's always is
            # the times stay: loaded again it is a fresh load (nothing READY), and one with a config override keeps it
            # from a later load without one, as Triton keeps a model's times across an unload
            old = entry.ready
            entry.ready = []
            for model in old:
                entry.versions[model.version] = VersionState(model.version, UNLOADING)
            await self._retire(old)
            for model in old:  # as Triton: a version that failed to load keeps its state and reason
                entry.versions[model.version] = VersionState(model.version, UNAVAILABLE, "unloaded")
        self._changed()

    async def load_many(self, names: list[str]) -> dict[str, str]:
        """Load several models concurrently; returns failures by model name (others keep going)."""
        async def one(name: str) -> tuple[str, str]:
            try:
                await self.load(name)
                return name, ""
            except ServerError as exc:
                return name, str(exc)

        results = await asyncio.gather(*(one(n) for n in names))
        return {name: error for name, error in results if error}

    async def poll(self) -> dict[str, str]:
        """Poll mode: load new models, reload changed ones, unload removed ones."""
        sources, duplicates = await asyncio.to_thread(self.repository.scan)
        failures: dict[str, str] = dict(duplicates)
        for name, loaded in list(self.entries.items()):
            if name not in sources and not loaded.removed:
                await self._remove(name)
        changed = [
            name for name, source in sources.items()
            if name not in self.entries or self.entries[name].signature != source.signature
        ]
        for name in changed:
            entry = self.entries.get(name)
            if entry is not None and entry.ready and entry.signature == sources[name].signature:
                continue  # loaded meanwhile, as a dependency of an ensemble
            try:
                await self.load(name, source=sources[name])
            except ServerError as exc:
                failures[name] = str(exc)
                entry = self.entries.get(name)
                if entry is not None:
                    # remember the broken signature so the same broken edit is not retried every poll
                    entry.signature = sources[name].signature
        return failures

    async def _remove(self, name: str) -> None:
        """Poll mode: ``name``'s directory left the repository (``ModelEntry.removed``)."""
        entry = self.entries[name]
        if entry.ready:
            await self.unload(name)
        entry.removed = True
        entry.refused = ""
        entry.signature = ""  # back in the repository it is new, even with the times it had

    async def close(self) -> None:
        for name in list(self.entries):
            if self.entries[name].ready:
                await self.unload(name)

    # --- internals ---------------------------------------------------------------------------
    async def _prepare_ensemble(self, config: mc.ModelConfig) -> None:
        """Load what an ensemble's steps need (as Triton does), then validate its graph against them. A refusal of its
        own config reads as Triton's poll failure reason; one met with its composing models reads as Triton's
        dependency failure: ``load failed for model '<ensemble>': <why>`` and a newline (``core.load_errors``). As
        Triton's dependency graph, a step naming the ensemble itself is found before its config is checked."""
        from serving_pod.schedulers.ensemble_graph import ensemble_steps, validate_structure

        if any(step.model_name == config.name for step in ensemble_steps(config)):
            cycle = str(CircularDependency.between(config.name, config.name))
            raise EnsembleInvalid(config.name, cycle, cycle=cycle)
        steps = validate_structure(config)
        try:
            await self._prepare_steps(config, steps)
        except CircularDependency as exc:
            raise EnsembleInvalid(config.name, str(exc), cycle=str(exc)) from None
        except ModelLoadError as exc:
            raise EnsembleInvalid(config.name, str(exc)) from None

    async def _prepare_steps(self, config: mc.ModelConfig, steps: Any) -> None:
        from serving_pod.schedulers.ensemble_graph import validate_mapping

        chain = _ENSEMBLE_CHAIN.get()
        token = _ENSEMBLE_CHAIN.set(chain + (config.name,))
        try:
            for step in steps:
                if step.model_name in chain:  # an ensemble over this one, loading it: Triton's circular dependency
                    raise CircularDependency.between(step.model_name, config.name)
                self._wait_for(config.name, step)
                try:
                    entry = self.entries.get(step.model_name)
                    if entry is not None and not entry.ready and entry.lock.locked():
                        async with entry.lock:  # being loaded by someone else: wait for that load
                            pass
                        entry = self.entries.get(step.model_name)
                    if entry is None or not entry.ready:
                        await self.load(step.model_name)
                except ServerError as exc:
                    raise composing_failure(config.name, step.model_name, exc) from None
                finally:
                    self._waits.pop(config.name, None)
        finally:
            _ENSEMBLE_CHAIN.reset(token)
        composing = {}
        for step in steps:
            try:
                composing[step.index] = self.get(step.model_name, step.model_version).config
            except ServerError as exc:
                raise ModelLoadError(f"ensemble '{config.name}' {step.label}: {exc}") from None
        validate_mapping(config, steps, composing)

    def _wait_for(self, ensemble: str, step: Any) -> None:
        """Note that loading ``ensemble`` now waits for its step's model; refuse it where that model's load waits,
        through other ensembles' loads, for ``ensemble`` (ensembles over each other, loaded at once: each would
        wait for the other forever; Triton's circular dependency)."""
        name: str | None = step.model_name
        path = [ensemble]
        while name is not None and name not in path[1:]:
            path.append(name)
            if name == ensemble:
                raise CircularDependency.between(ensemble, path[-2])
            name = self._waits.get(name)
        self._waits[ensemble] = step.model_name

    def _dependents(self, name: str) -> list[tuple[ModelEntry, frozenset[str]]]:
        """The READY ensembles whose steps name ``name``, each with all its steps' model names."""
        found = []
        for entry in list(self.entries.values()):
            steps = frozenset(step.model_name for step in entry.ready[0].config.ensemble_scheduling.step) \
                if entry.ready else frozenset()
            if name in steps:
                found.append((entry, steps))
        return found

    async def _load_dependents(self, name: str, *, reloaded: bool) -> None:
        """After ``name`` loaded: load the ensembles awaiting it once all their composing models are READY and, when
        it was a reload, reload the READY ensembles over it (Triton's fresh versions and statistics). Called with
        no lock held; an ensemble loading ``name`` as its step is skipped (it is loading already)."""
        loading = _ENSEMBLE_CHAIN.get()
        awaiting = [entry.name for entry in list(self.entries.values())
                    if name in entry.awaiting and entry.name not in loading
                    and all(self.entries.get(step) is not None and self.entries[step].ready for step in entry.awaiting)]
        over = [entry.name for entry, _ in self._dependents(name) if entry.name not in loading] if reloaded else []
        for dependent in dict.fromkeys(awaiting + over):
            entry = self.entries[dependent]
            try:
                await self.load(dependent, config_override=entry.config_override, model_dir=entry.override_dir,
                                composing_changed=True)
            except ServerError as exc:  # the composing model loaded: its own load succeeded
                log.error("ensemble '%s' did not load again after '%s' loaded: %s", dependent, name, exc)

    async def _retire(self, models: list[Model]) -> None:
        for model in models:
            await model.scheduler.drain()
            if model.pool is not None:
                await asyncio.to_thread(model.pool.close)
            log.info("successfully unloaded '%s' version %d", model.name, model.version)  # tritonserver's line

    def _changed(self) -> None:
        for callback in self.on_change:
            callback()

