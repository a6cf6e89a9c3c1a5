"""Why a model's versions failed to load, in Triton 2.51's words (the registry raises these; pure, no I/O).

A load error reads ``load failed for model '<m>': version N is at UNAVAILABLE state: <reason>;`` for each failed
version, then a newline; a version's ``reason`` (also the repository index's) is ``<status>: <cause>``, with the
status in Triton's words (``Status::CodeString``): a python model's own exception is ``Internal: ValueError: ...``.

A config refused where Triton refuses it while it polls the repository (reading, parsing and ``ValidateModelConfig``:
batch settings, sequence batching controls, a response cache the model cannot use, an ensemble's own steps; the
tensors too under ``--disable-auto-complete-config``), before any version is tried, is a ``PollRefused``; its load
answers as Triton's, INTERNAL (HTTP 500) ``failed to load '<m>', failed to poll from model repository``
(``PollFailed``), but with Ferry's reason after a colon where Triton's is only in its log. A config Triton refuses
for each version it tries (its tensors, instance groups, label files) is a ``VersionRefused``: each version's failure.

An ensemble refused with its composing models reads ``load failed for model '<ens>': <why>`` and a newline, ``<why>``
quoting the composing model's own failure (``composing_failure``) or the cycle of ensembles over each other
(``CircularDependency``), in Triton 2.51's words.
"""

from __future__ import annotations

from serving_pod.backends.base import VersionLoadError
from serving_pod.core.errors import ModelLoadError, ServerError

POLL_FAILED = "failed to poll from model repository"

#: Triton's words for its status codes, as its messages print them (``Status::CodeString``)
_STATUS_WORDS = {"INVALID_ARG": "Invalid argument", "NOT_FOUND": "Not found", "UNAVAILABLE": "Unavailable",
                 "INTERNAL": "Internal", "UNSUPPORTED": "Unsupported", "ALREADY_EXISTS": "Already exists",
                 "CANCELLED": "Cancelled", "UNKNOWN": "Unknown"}


def version_reason(exc: BaseException) -> str:
    """Why a version failed to load, as Triton's index ``reason`` words it: ``<status>: <cause>`` (a python model's
    own exception: ``Internal: ValueError: boom``)."""
    if isinstance(exc, VersionLoadError):
        return f"{exc.status}: {exc}"
    if isinstance(exc, ServerError):
        return f"{_STATUS_WORDS.get(exc.code, 'Internal')}: {exc}"
    return f"Internal: {type(exc).__name__}: {exc}"


class PollRefused(ModelLoadError):
    """A config Triton 2.51 refuses while polling the repository (module docstring): Ferry's reason, INTERNAL."""

    code = "INTERNAL"


class VersionRefused(ModelLoadError):
    """A config Triton 2.51 refuses for each version it tries (``ValidateModelIOConfig`` with auto-complete on,
    ``ValidateInstanceGroup``, label files, an ensemble's derived decoupled policy under the response cache): the
    registry words it ``version N is at UNAVAILABLE state: <status>: <why>;`` for every version
    (``VersionsUnavailable``).
    ``code``: the status, INVALID_ARG unless given (a label file Triton cannot read is INTERNAL)."""

    def __init__(self, message: str, *, code: str = "INVALID_ARG") -> None:
        super().__init__(message)
        self.code = code


class PollFailed(ModelLoadError):
    """A load refused at Triton's repository poll: a model the repositories do not hold (Triton's words exactly) or
    whose config is refused there (``PollRefused``: Triton's words, then a colon and the reason Triton only logs)."""

    code = "INTERNAL"

    def __init__(self, name: str, reason: str = "") -> None:
        super().__init__(f"failed to load '{name}', {POLL_FAILED}" + (f": {reason}" if reason else ""))


class LoadFailed(ModelLoadError):
    """A model passed its repository poll and failed at load: ``load failed for model '<m>': <why>`` and a newline
    (Triton 2.51's words). ``why`` is what an ensemble over the model quotes of it."""

    def __init__(self, name: str, why: str) -> None:
        self.model_name = name
        self.why = why
        super().__init__(f"load failed for model '{name}': {why}\n")


class NoVersionAvailable(LoadFailed):
    """The version policy leaves no version folder to load: ``load failed for model '<m>': at least one version must
    be available under the version policy of model '<m>'`` and a newline (Triton 2.51's words). Triton's life cycle
    holds the model from then on, with no version: a request for it ``has no available versions``."""

    def __init__(self, name: str) -> None:
        super().__init__(name, f"at least one version must be available under the version policy of model '{name}'")


class VersionsUnavailable(LoadFailed):
    """Versions of a model failed to load, worded as Triton 2.51's load error: ``load failed for model '<m>': ``
    then ``version N is at UNAVAILABLE state: <reason>;`` for each failed version (ascending), then a newline.
    ``reasons``: version -> its index reason; ``loaded``: the versions that did load (none serves)."""

    def __init__(self, name: str, reasons: dict[int, str], loaded: list[int] | None = None) -> None:
        self.reasons = dict(sorted(reasons.items()))
        self.loaded = loaded or []
        super().__init__(name, "".join(f"version {v} is at UNAVAILABLE state: {reason};"
                                       for v, reason in self.reasons.items()))


class EnsembleInvalid(LoadFailed):
    """An ensemble refused with its composing models (one failed, a step does not fit, ensembles over each other) or
    for its own tensors; ``cycle``: the ``CircularDependency`` text when that is why, which the ensembles over this one
    report as theirs."""

    def __init__(self, name: str, why: str, cycle: str = "") -> None:
        self.cycle = cycle
        super().__init__(name, why)


class CircularDependency(ModelLoadError):
    """Ensembles over each other, in Triton 2.51's words: ``circular dependency between ensembles: <first> -> ... ->
    <last> -> <first>``, ``<last>`` the ensemble whose step is ``<first>`` (both the same for an ensemble over itself).
    Triton starts at the ensemble loaded when it is in the cycle (for three or more, at one its hash map picks);
    an ensemble over a cycle it is not in reports the cycle (Triton 2.51 crashes on it)."""

    @classmethod
    def between(cls, first: str, last: str) -> CircularDependency:
        return cls(f"circular dependency between ensembles: {first} -> ... -> {last} -> {first}")


def composing_failure(ensemble: str, model: str, error: ServerError) -> ModelLoadError:
    """Why ``ensemble`` is refused when its step's ``model`` failed to load with ``error``, in Triton 2.51's words: a
    model that is not in the repository or whose config was refused there (Triton's poll) is ``not available``; one
    whose load failed ``has no loaded version``; a composing ensemble refused ``is not valid``; a cycle is the cycle."""
    if isinstance(error, EnsembleInvalid) and error.cycle:
        return CircularDependency(error.cycle)
    if isinstance(error, EnsembleInvalid):
        return ModelLoadError(f"ensemble '{ensemble}' depends on '{model}' which is not valid. Model '{model}' failed "
                              f"with error: {error.why}")
    if isinstance(error, LoadFailed):
        return ModelLoadError(f"ensemble '{ensemble}' depends on '{model}' which has no loaded version. Model "
                              f"'{model}' loading failed with error: {error.why}")
    return ModelLoadError(f"ensemble {ensemble} contains models that are not available or ambiguous: {model}")
