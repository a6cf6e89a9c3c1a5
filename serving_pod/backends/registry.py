"""Backend name -> backend object, imported on first use (heavy libraries load only when a model needs them)."""

from __future__ import annotations

import importlib
import logging

from serving_pod.backends.base import Backend, VersionLoadError

#: backend name -> module exposing ``create_backend() -> Backend``.
BACKEND_MODULES: dict[str, str] = {
    "onnxruntime": "serving_pod.backends.onnxruntime",
    "python": "serving_pod.backends.python",
    "tensorrt": "serving_pod.backends.tensorrt",
    "ferry_test": "serving_pod.backends.testing",
    "ferry_callable": "serving_pod.backends.callable",
}

log = logging.getLogger("ferry.backends")

_cache: dict[tuple[str, frozenset], Backend] = {}


def get_backend(name: str, backend_config: dict[str, str] | None = None) -> Backend:
    """The backend called ``name`` with its ``--backend-config`` settings (one object per distinct settings).

    ``VersionLoadError`` in Triton's words when there is none (the backends there are go to the log).
    """
    key = (name, frozenset((backend_config or {}).items()))
    backend = _cache.get(key)
    if backend is not None:
        return backend
    module_name = BACKEND_MODULES.get(name)
    if module_name is None:
        log.error("unable to find backend '%s'; available backends: %s", name, ", ".join(sorted(BACKEND_MODULES)))
        raise VersionLoadError(f"unable to find backend library for backend '{name}', try specifying runtime on the "
                               "model configuration.", status="Invalid argument")
    module = importlib.import_module(module_name)
    backend = module.create_backend(backend_config) if backend_config else module.create_backend()
    _cache[key] = backend
    return backend
