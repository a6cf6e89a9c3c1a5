"""Why a model's versions failed to load, in Triton 2.51's words (the registry raises these; pure, no I/O).

A load error reads ``load failed for model '<m>': version N is at UNAVAILABLE state: <reason>;`` for each failed
version, then a newline; a version's ``reason`` (also the repository index's) is ``<status>: <cause>``, with the
status in Triton's words (``Status::CodeString``): a python model's own exception is ``Internal: ValueError: ...``.
"""

from __future__ import annotations

from serving_pod.backends.base import VersionLoadError
from serving_pod.core.errors import ModelLoadError, ServerError

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


class VersionsUnavailable(ModelLoadError):
    """Versions of a model failed to load, worded as Triton 2.51's load error: ``load failed for model '<m>': ``
    then ``version N is at UNAVAILABLE state: <reason>;`` for each failed version (ascending), then a newline.
    ``reasons``: version -> its index reason; ``loaded``: the versions that did load (none serves)."""

    def __init__(self, name: str, reasons: dict[int, str], loaded: list[int] | None = None) -> None:
        self.reasons = dict(sorted(reasons.items()))
        self.loaded = loaded or []
        states = "".join(f"version {v} is at UNAVAILABLE state: {reason};" for v, reason in self.reasons.items())
        super().__init__(f"load failed for model '{name}': {states}\n")
