"""``pb_utils.load_model`` / ``unload_model`` / ``is_model_ready``: Triton's BLS model loading API.

The calls reach the engine the way BLS requests do (``pb_request.current_engine``): in the server
process the engine itself, in an isolated model's process the proxy of ``python_stub``, whose
calls ``serve`` answers in the server. Load and unload run the engine's own verbs (the ones the
repository extension serves), so they are refused unless ``--model-control-mode=explicit``, with
the engine's message. Errors are ``TritonModelException`` worded as Triton's python backend words
them: ``Failed to load model: Failed to process the request for model '<caller>', message: ...``.

As in Triton, unloading a model that was never loaded is not an error, and ``is_model_ready`` of
an unknown model is False. A model that loads or unloads itself does not wait for the result
(waiting would deadlock on its own request); the engine logs errors of that background work.
"""

from __future__ import annotations

import sys
from typing import Any

from serving_pod.backends import pb_request
from serving_pod.backends.pb_tensor import TritonModelException
from serving_pod.core import errors


def _engine(frame: Any, prefix: str) -> tuple[Any, str]:
    engine = pb_request.current_engine(frame)
    if engine is None or not hasattr(engine, "load_model_from_thread"):
        raise TritonModelException(f"{prefix}: this python model instance is not attached to an inference engine")
    return engine, pb_request.current_owner(frame)


def _failure(prefix: str, owner: str, exc: BaseException) -> TritonModelException:
    message = exc.message if isinstance(exc, errors.ServerError) else f"{type(exc).__name__}: {exc}"
    name = pb_request.instance_name(owner)
    if name:
        message = f"Failed to process the request for model '{name}', message: {message}"
    return TritonModelException(f"{prefix}: {message}")


def _is_self(target: str, owner: str) -> bool:
    """True when a model loads or unloads itself (waiting for that would deadlock)."""
    return bool(owner) and pb_request.model_name(owner) == target


def load_model(model_name: str, config: str = "", files: dict[str, bytes] | None = None) -> None:
    """Load (or reload) ``model_name``; ``config`` overrides its config (JSON), ``files`` its directory."""
    if not isinstance(model_name, str) or not isinstance(config, str):
        raise TypeError("load_model(): model_name and config must be str")
    if files is not None and not isinstance(files, dict):
        raise TritonModelException(
            f"failed to load model '{model_name}', files should be a dictionary of file paths and file contents"
        )
    overrides: dict[str, bytes] = {}
    for key, content in (files or {}).items():
        if not isinstance(key, str) or not isinstance(content, (bytes, bytearray, memoryview)):
            raise TypeError("load_model(): files must map str paths to bytes contents")
        if key.startswith("file:"):  # other keys are ignored, as the server's load parameters ignore them
            overrides[key[5:]] = bytes(content)
    engine, owner = _engine(sys._getframe(1), "Failed to load model")
    try:
        engine.load_model_from_thread(
            model_name, config or None, overrides or None, wait=not _is_self(model_name, owner)
        )
    except (errors.ServerError, ConnectionError) as exc:
        raise _failure("Failed to load model", owner, exc) from None


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload ``model_name`` (with ``unload_dependents``, an ensemble's composing models too)."""
    if not isinstance(model_name, str):
        raise TypeError("unload_model(): model_name must be str")
    engine, owner = _engine(sys._getframe(1), "Failed to unload model")
    try:
        engine.unload_model_from_thread(
            model_name, bool(unload_dependents), wait=not _is_self(model_name, owner)
        )
    except errors.NotFoundError:
        return  # Triton: unloading a model that is not loaded succeeds
    except (errors.ServerError, ConnectionError) as exc:
        raise _failure("Failed to unload model", owner, exc) from None


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """True when ``model_name`` (the given version, or its default one) is READY."""
    if not isinstance(model_name, str) or not isinstance(model_version, str):
        raise TypeError("is_model_ready(): model_name and model_version must be str")
    engine, owner = _engine(sys._getframe(1), "Failed to check model readiness")
    try:
        version = _version(model_version) if model_version else ""
        return bool(engine.model_ready(model_name, version))
    except (errors.ServerError, ConnectionError) as exc:
        raise _failure("Failed to check model readiness", owner, exc) from None


def _version(text: str) -> str:
    """A version string read as Triton reads it (``std::stol``), or Triton's error."""
    try:
        number = int(text)
    except ValueError:
        details = " (details: stol)"
    else:
        if number >= 0:
            return str(number)
        details = ""
    raise errors.InvalidArgumentError(
        f"failed to get model version from specified version string '{text}'{details}, "
        "version should be an integral value > 0"
    )


# --------------------------------------------------------------------------- server side of isolated models


def serve(engine: Any, operation: str, args: tuple) -> Any:
    """Answer an isolated model's model-control call (``python_isolated``) with the real engine."""
    if engine is None or not hasattr(engine, "load_model_from_thread"):
        raise errors.UnavailableError("this python model instance is not attached to an inference engine")
    if operation == "load":
        return engine.load_model_from_thread(*args)
    if operation == "unload":
        return engine.unload_model_from_thread(*args)
    if operation == "ready":
        return engine.model_ready(*args)
    raise errors.InternalError(f"unknown model control request '{operation}'")
