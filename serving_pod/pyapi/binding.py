"""Bound models of one engine: register the functions, write their model folders, load and unload them.

The registry loads models from directories, so binding a function writes an empty model folder
(``<tmp>/<name>/1/``) under a temporary root owned by the engine, registers the functions in the
callable backend's process-wide table (``serving_pod.backends.callable.CALLABLES``) under a unique
key, and loads the folder with a generated config (backend ``ferry_callable``, the key as parameter
``ferry_callable_key``). Unbinding unloads the model, then drops the key and the folder.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

from serving_pod.backends import callable as callable_backend
from serving_pod.pyapi.config import BoundModel, ModelConfig, Tensor, check_declaration, triton_config


def as_functions(infer_func: Callable[..., Any] | Sequence[Callable[..., Any]], config: ModelConfig) -> tuple[tuple[Callable[..., Any], ...], ModelConfig]:
    """One function per instance: a list of functions sets the instance count (PyTriton's multi-instance form)."""
    functions = tuple(infer_func) if isinstance(infer_func, (list, tuple)) else (infer_func,)
    if not functions:
        raise ValueError("bind: infer_func is an empty list")
    for function in functions:
        if not callable(function):
            raise ValueError(f"bind: infer_func must be callable, got {type(function).__name__}")
    if len(functions) > 1:
        if config.instances not in (1, len(functions)):
            raise ValueError(
                f"bind: {len(functions)} functions given but ModelConfig(instances={config.instances}); "
                "pass one function per instance, or one function and instances=N"
            )
        from dataclasses import replace

        config = replace(config, instances=len(functions))
    return functions, config


class Bindings:
    """The functions bound to one engine (``core`` is a ``serving_pod.core.engine.Engine``)."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self._root: Path | None = None
        self._keys: dict[str, str] = {}
        self.models: dict[str, BoundModel] = {}

    async def bind(
        self,
        name: str,
        infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        config: ModelConfig | None = None,
    ) -> BoundModel:
        check_declaration(name, inputs, outputs)
        functions, config = as_functions(infer_func, config or ModelConfig())
        if self.core.options.model_control_mode == "poll":
            raise ValueError(
                f"bind '{name}': the engine polls its repository (model_control_mode='poll') and would unload "
                "bound models that are not on disk; use 'explicit' or 'none'"
            )
        if name in self._keys:
            raise ValueError(f"bind: model '{name}' is already bound; unbind it first")
        entry = self.core.registry.entries.get(name)
        if entry is not None and entry.ready:
            raise ValueError(f"bind: a model named '{name}' is already loaded from the model repository")
        bound = BoundModel(name, tuple(inputs), tuple(outputs), config)
        key = f"{name}:{uuid.uuid4().hex}"
        document = triton_config(bound, key, "ferry_callable", callable_backend.KEY_PARAMETER)
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="ferry-bound-"))
        model_dir = self._root / name
        (model_dir / "1").mkdir(parents=True, exist_ok=True)
        callable_backend.register(key, callable_backend.CallableEntry(functions, bound))
        try:
            await self.core.registry.load(name, config_override=json.dumps(document), model_dir=model_dir)
        except BaseException:
            callable_backend.unregister(key)
            shutil.rmtree(model_dir, ignore_errors=True)
            raise
        self._keys[name] = key
        self.models[name] = bound
        return bound

    async def unbind(self, name: str) -> None:
        key = self._keys.get(name)
        if key is None:
            raise ValueError(f"unbind: no function is bound as model '{name}' (bound: {sorted(self._keys)})")
        await self.core.registry.unload(name)
        self._forget(name)

    def _forget(self, name: str) -> None:
        callable_backend.unregister(self._keys.pop(name))
        self.models.pop(name, None)
        if self._root is not None:
            shutil.rmtree(self._root / name, ignore_errors=True)

    def close(self) -> None:
        """After the engine unloaded everything: drop every key and the temporary folders."""
        for name in list(self._keys):
            self._forget(name)
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
