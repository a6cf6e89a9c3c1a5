"""``ferry-analyzer profile``: validate inputs, start (or reach) the server, sweep each model, recommend.

Inputs are checked before anything starts (unknown model, unreadable config, output repository
collisions). One server serves the whole sweep; for each model the search (``search``) runs through a
``runner.ModelRunner`` (which starts the server on its first measurement); afterwards every measurement
of the model in the checkpoint is ranked (``objectives``, verified points first), the winner's
``config.pbtxt`` is written into a copy of the model in the output repository, and the outcome (recommended point, default point, gain, or why nothing qualifies) is stored
in the checkpoint for the report.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving_pod.analyzer import loadgen
from serving_pod.analyzer.checkpoint import Checkpoint
from serving_pod.analyzer.errors import AnalyzerError, InputError
from serving_pod.analyzer.measure import Measurement, points
from serving_pod.analyzer.objectives import Constraints, Objective, closest, recommendable
from serving_pod.analyzer.progress import Progress
from serving_pod.analyzer.runner import ModelRunner
from serving_pod.analyzer.search import Candidate, SearchSettings, search
from serving_pod.analyzer.space import (SearchSpace, apply_point, config_from_dict, config_pbtxt, point_of,
                                       read_base_config)
from serving_pod.analyzer.target import LaunchSettings, Session


@dataclass(frozen=True)
class ProfileSettings:
    repository: Path
    models: tuple[str, ...]
    output_repository: Path
    checkpoint_dir: Path
    space: SearchSpace
    objective: Objective
    constraints: Constraints
    window: loadgen.WindowSettings
    search: SearchSettings = SearchSettings()
    override_output: bool = False
    load_generator: str = "auto"
    perf_analyzer: str | None = None
    server_url: str | None = None
    server_grpc_url: str | None = None
    launch: LaunchSettings | None = None
    progress: bool = True


@dataclass(frozen=True)
class ModelResult:
    model: str
    feasible: bool
    message: str
    best: Measurement | None
    default: Measurement | None
    gain: float | None
    output_dir: Path | None
    measured: int
    reused: int


def check_inputs(settings: ProfileSettings) -> dict[str, tuple[Path, Any]]:
    """Each model's directory and on-disk config; raises :class:`InputError` on the first problem."""
    repo = settings.repository
    if not repo.is_dir():
        raise InputError(f"model repository {repo} is not a directory")
    available = sorted(p.name for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))
    found: dict[str, tuple[Path, Any]] = {}
    for name in settings.models:
        if name not in available:
            raise InputError(f"unknown model '{name}': not in {repo} (available: {', '.join(available) or 'none'})")
        found[name] = (repo / name, read_base_config(repo / name, name))
    out = settings.output_repository
    if out.resolve() == repo.resolve():
        raise InputError("--output-model-repository must differ from --model-repository (it would overwrite it)")
    for name in settings.models:
        if (out / name).exists() and not settings.override_output:
            raise InputError(f"{out / name} exists; pass --override-output-model-repository to replace it")
    return found


def run_profile(settings: ProfileSettings) -> list[ModelResult]:
    models = check_inputs(settings)
    generator = loadgen.select(settings.load_generator, window=settings.window, perf_analyzer=settings.perf_analyzer)
    checkpoint = Checkpoint.open(settings.checkpoint_dir,
                                 settings={"load_generator": generator.name, "window": settings.window.signature()})
    launch = settings.launch or LaunchSettings(repository=settings.repository)
    with Session(launch=None if settings.server_url else launch, server_url=settings.server_url,
                 server_grpc_url=settings.server_grpc_url) as session:
        return [_profile_model(settings, checkpoint, session, generator, name, model_dir, base)
                for name, (model_dir, base) in models.items()]


def _profile_model(settings: ProfileSettings, checkpoint: Checkpoint, session: Session,
                   generator: loadgen.LoadGenerator, name: str, model_dir: Path, base: Any) -> ModelResult:
    default_point = point_of(base)
    exact = apply_point(base, default_point) == base
    default = Candidate(default_point.key if exact else "default", default_point)
    checkpoint.model(name)["default_key"] = default.key
    progress = Progress(f"profile {name}", enabled=settings.progress)
    runner = ModelRunner(name, base, default.key, session, generator, checkpoint, settings.window.signature(),
                         progress)
    try:
        search(runner, settings.space.for_model(default_point), default, settings.objective, settings.constraints,
               settings.search)
    finally:
        progress.close()
        with contextlib.suppress(AnalyzerError):
            runner.restore()
    return _recommend(settings, checkpoint, runner, name, model_dir, default.key)


def _recommend(settings: ProfileSettings, checkpoint: Checkpoint, runner: ModelRunner, name: str,
               model_dir: Path, default_key: str) -> ModelResult:
    objective, constraints = settings.objective, settings.constraints
    measurements = checkpoint.measurements(name)
    ranked = recommendable(measurements, objective, constraints)
    best = ranked[0] if ranked else None
    ranked_default = recommendable([m for m in measurements if m.config_key == default_key], objective, constraints)
    default = ranked_default[0] if ranked_default else None
    result: dict[str, Any] = {"objective": objective.as_dict(), "constraints": constraints.as_dict(),
                              "default_key": default_key, "recommended": None, "default": None, "gain": None,
                              "closest": None, "output": None}
    output_dir: Path | None = None
    gain: float | None = None
    if best is None:
        near = closest(points(measurements), constraints)
        message = f"no configuration of '{name}' meets the constraints ({constraints.describe()})"
        if near is not None:
            message += (f"; the closest was {near.config_key} at concurrency {near.concurrency}: p99 "
                        f"{near.p99_ms:.3f} ms, {near.throughput:.1f} infer/s"
                        + (f", {near.rss_mb:.0f} MiB" if near.rss_mb is not None else ""))
            result["closest"] = _ref(near)
        else:
            message += "; no measurement succeeded"
    else:
        result["recommended"] = _ref(best)
        config = config_from_dict(checkpoint.model(name)["configs"][best.config_key]["config"])
        output_dir = write_model(model_dir, settings.output_repository / name, config)
        result["output"] = str(output_dir)
        runs = f" (median of {best.trial} runs)" if best.trial > 1 else ""
        message = (f"recommended {best.config_key} at concurrency {best.concurrency}: {best.throughput:.1f} infer/s, "
                   f"p99 {best.p99_ms:.3f} ms{runs}")
        if default is not None:
            gain = objective.gain(best, default)
            result["default"], result["gain"] = _ref(default), gain
            runs = f" (median of {default.trial} runs)" if default.trial > 1 else ""
            message += (f"; default config ({default_key}) at concurrency {default.concurrency}: "
                        f"{default.throughput:.1f} infer/s, p99 {default.p99_ms:.3f} ms{runs}; "
                        f"gain {gain * 100:+.1f}% {objective.gain_meaning}")
        else:
            message += f"; the default config ({default_key}) met the constraints at no concurrency measured"
    served_as = checkpoint.model(name).get("default_served_as")
    if served_as:
        result["default_served_as"] = served_as
        message += (f"; note: the server serves the model's own config ({default_key}) as {served_as} "
                    f"(config auto-complete), and it was measured so")
    result["message"] = message
    checkpoint.set_result(name, result)
    return ModelResult(name, best is not None, message, best, default, gain, output_dir,
                       runner.measured, runner.reused)


def _ref(m: Measurement) -> dict[str, Any]:
    return {"config_key": m.config_key, "concurrency": m.concurrency}


def write_model(source: Path, dest: Path, config: Any) -> Path:
    """Copy the model directory to ``dest`` (replacing it) with ``config`` as its ``config.pbtxt``."""
    try:
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(source, dest, ignore=shutil.ignore_patterns("config.pbtxt", "__pycache__"))
        (dest / "config.pbtxt").write_text(config_pbtxt(config))
    except OSError as exc:
        raise AnalyzerError(f"cannot write the recommended model to {dest}: {exc}") from None
    return dest
