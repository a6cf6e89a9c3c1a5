"""The search's :class:`~serving_pod.analyzer.search.Runner`: checkpoint first, then load and measure.

For each point asked for, a successful measurement already in the checkpoint is returned as is (that is
how an interrupted sweep resumes). Otherwise the candidate's configuration is loaded on the server through
the repository API with a ``config`` override — only when it differs from what is loaded — measured, and
recorded in the checkpoint before the next point starts. A configuration the server refuses is recorded
with its error and yields failed measurements; the sweep goes on — except the model's own configuration,
whose refusal ends the sweep. A candidate the server serves at another point than asked (read back from
``/v2/models/<m>/config``) is recorded the same way: Triton's and Ferry's config auto-complete turn dynamic
batching on for a model with ``max_batch_size`` > 1 and no scheduler, so a "dynamic batching off" candidate
would otherwise be measured batched and reported as unbatched. The server is only started
(``target.Session``) when something must be measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from serving_pod.analyzer.checkpoint import Checkpoint
from serving_pod.analyzer.errors import AnalyzerError
from serving_pod.analyzer.loadgen import LoadGenerator
from serving_pod.analyzer.measure import Measurement, failed, measure
from serving_pod.analyzer.progress import Progress
from serving_pod.analyzer.search import Candidate
from serving_pod.analyzer.space import ConfigPoint, apply_point, config_dict, config_from_dict, config_json, point_of
from serving_pod.analyzer.target import LoadError, Session


@dataclass
class ModelRunner:
    """Measures candidates of one model; counts what it measured and what it reused."""

    model: str
    base_config: Any
    default_key: str
    session: Session
    load: LoadGenerator
    checkpoint: Checkpoint
    window: str
    progress: Progress
    measured: int = 0
    reused: int = 0
    loaded_key: str | None = None
    load_errors: dict[str, str] = field(default_factory=dict)
    #: whether a remote server had the model ready before the sweep (None until the first load)
    was_ready: bool | None = None

    def config_for(self, candidate: Candidate) -> Any:
        return self.base_config if candidate.key == self.default_key else apply_point(self.base_config,
                                                                                       candidate.point)

    def ensure_loaded(self, candidate: Candidate) -> str:
        """Load ``candidate`` unless it is loaded; returns the server's error ('' on success)."""
        if candidate.key in self.load_errors:
            return self.load_errors[candidate.key]
        if self.loaded_key == candidate.key:
            return ""
        config = self.config_for(candidate)
        self.checkpoint.add_config(self.model, candidate.key, candidate.point.as_dict(), config_dict(config))
        client = self.session.client()
        if self.was_ready is None:
            self.was_ready = self.session.remote and client.model_ready(self.model)
        try:
            client.load(self.model, config_json(config))
            self._check_served(point_of(config_from_dict(client.model_config(self.model))), candidate)
        except LoadError as exc:
            if candidate.key == self.default_key:
                raise AnalyzerError(f"model '{self.model}' does not load with its own configuration: {exc}") from None
            self.loaded_key = None
            self.load_errors[candidate.key] = str(exc)
            self.checkpoint.config_error(self.model, candidate.key, str(exc))
            self.progress.note(f"{self.model}: configuration {candidate.key} did not load: {exc}")
            return str(exc)
        self.loaded_key = candidate.key
        return ""

    def _check_served(self, actual: ConfigPoint, candidate: Candidate) -> None:
        """Compare the point the server serves with ``candidate``'s. The model's own config is measured as served
        (a different point is noted in the checkpoint, so re-ranking keeps saying it); any other candidate served
        elsewhere is a ``LoadError``."""
        point, actual = candidate.point, _batcher_default(actual)
        elsewhere = actual != _batcher_default(point.normalized())
        if candidate.key == self.default_key:
            entry = self.checkpoint.model(self.model)
            if elsewhere:
                entry["default_served_as"] = actual.key
            else:
                entry.pop("default_served_as", None)
            return
        if not elsewhere:
            return
        hint = ""
        if actual.dynamic_batching and not point.dynamic_batching:
            hint = ("; the server's config auto-complete turns dynamic batching on for a model with max_batch_size > 1 "
                    "and no scheduler: start it with --disable-auto-complete-config (--server-arg) to measure it off")
        raise LoadError(f"the server serves '{self.model}' as {actual.key}, not {point.key}{hint}")

    def measure(self, candidate: Candidate, concurrency: int, trial: int = 0) -> Measurement:
        label = f"{self.model} {candidate.key} c={concurrency}" + (f" verify#{trial}" if trial else "")
        known = self.checkpoint.find(self.model, candidate.key, concurrency, trial)
        if known is not None:
            self.reused += 1
            self.progress.update(f"{label} (from checkpoint)")
            return known
        error = self.ensure_loaded(candidate)
        if error:
            return failed(self.model, candidate.key, concurrency, error, self.window, trial)
        url = self.session.url(self.load.window.protocol)
        result = measure(self.session.client(), self.session.pid, self.load, url, self.model, candidate.key,
                         concurrency, self.window, trial)
        self.checkpoint.record(result)
        self.measured += 1
        figures = (f"{result.throughput:.0f}/s p99={result.p99_ms:.2f}ms" if result.ok
                   else f"failed: {result.error[:80]}")
        self.progress.update(f"{label} {figures}")
        return result

    def restore(self) -> None:
        """Leave the server as found: unload the model, or reload a remote server's own config of it."""
        if self.was_ready is None:
            return  # never touched the server
        client = self.session.client()
        client.load(self.model) if self.was_ready else client.unload(self.model)
        self.loaded_key = None


def _batcher_default(point: ConfigPoint) -> ConfigPoint:
    """``point`` with preferred sizes [max_batch_size] read as none: the same batcher, and what Triton serves for a
    dynamic batcher configured without preferred sizes."""
    if point.preferred_batch_sizes == (point.max_batch_size,):
        return replace(point, preferred_batch_sizes=())
    return point
