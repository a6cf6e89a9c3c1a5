"""Backend name -> backend object, imported on first use (heavy libraries load only when a model needs them)."""

from __future__ import annotations

import importlib

from serving_pod.backends.base import Backend
from serving_pod.core.errors import ModelLoadError

#: backend name -> module exposing ``create_backend() -> Backend``.
BACKEND_MODULES: dict[str, str] = {
    "onnxruntime": "serving_pod.backends.onnxruntime",
    "python": "serving_pod.backends.python",
    "tensorrt": "serving_pod.backends.tensorrt",
    "ferry_test": "serving_pod.backends.testing",
    "ferry_callable": "serving_pod.backends.callable",
}

_cache: dict[tuple[str, frozenset], Backend] = {}


def get_backend(name: str, backend_config: dict[str, str] | None = None) -> Backend:
    """The backend called ``name`` with its ``--backend-config`` settings (one object per distinct settings).

    ModelLoadError naming the known backends when there is none.
    """
    key = (name, frozenset((backend_config or {}).items()))
    backend = _cache.get(key)
    if backend is not None:
        return backend
    module_name = BACKEND_MODULES.get(name)
    if module_name is None:
        raise ModelLoadError(
            f"unable to find backend '{name}'; available backends: {', '.join(sorted(BACKEND_MODULES))}"
        )
    module = importlib.import_module(module_name)
    backend = module.create_backend(backend_config) if backend_config else module.create_backend()
    _cache[key] = backend
    return backend
