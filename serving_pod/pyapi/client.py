"""``ModelClient``: PyTriton's client helper over tritonclient, for any Triton-compatible server.

``ModelClient("grpc://localhost:8001", "add_sub").infer_batch(a=x, b=y)`` -> dict of output arrays.
The URL scheme picks the protocol (``http://``, ``grpc://``; no scheme means HTTP). The model's
config is read once to learn its inputs, outputs and whether it batches; ``infer_sample`` adds and
removes the batch dimension for you. tritonclient's synchronous HTTP client is bound to the thread
that created it, so use one ``ModelClient`` per thread.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

import numpy as np


class ModelClientError(RuntimeError):
    """The server refused or failed a call; ``status`` is the server's status (HTTP code or gRPC code name)."""

    def __init__(self, message: str, status: str | None = None) -> None:
        super().__init__(message)
        self.status = status


def parse_url(url: str) -> tuple[str, str]:
    """(protocol, "host:port") from ``http://host:port``, ``grpc://host:port`` or ``host:port``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "http", url
    scheme = scheme.lower()
    if scheme not in ("http", "grpc"):
        raise ValueError(f"unsupported URL scheme '{scheme}' in {url!r}: use http:// or grpc://")
    rest = rest.rstrip("/")
    if not rest or "/" in rest:
        raise ValueError(f"invalid server URL {url!r}: expected <scheme>://<host>:<port>")
    if ":" not in rest.rsplit("]", 1)[-1]:
        rest += ":8000" if scheme == "http" else ":8001"
    return scheme, rest


class ModelClient:
    """Synchronous client of one model over HTTP or gRPC (tritonclient underneath)."""

    def __init__(self, url: str, model_name: str, model_version: str = "", *, timeout_s: float = 60.0) -> None:
        self.protocol, self.address = parse_url(url)
        self.model_name = model_name
        self.model_version = model_version
        self.timeout_s = timeout_s
        self._client: Any = None
        self._config: dict[str, Any] | None = None

    # --- connection --------------------------------------------------------------------------
    @property
    def _module(self) -> Any:
        if self.protocol == "http":
            import tritonclient.http as module
        else:
            import tritonclient.grpc as module
        return module

    def _connect(self) -> Any:
        if self._client is None:
            if self.protocol == "http":
                self._client = self._module.InferenceServerClient(
                    self.address, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
                )
            else:
                self._client = self._module.InferenceServerClient(self.address)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> "ModelClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def wait_for_model(self, timeout_s: float) -> None:
        """Wait until the model is ready; ``TimeoutError`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self._connect().is_model_ready(self.model_name, self.model_version):
                    return
            except Exception:  # server not up yet: keep waiting
                pass
            if time.monotonic() >= deadline:
                raise TimeoutError(f"model '{self.model_name}' not ready at {self.address} after {timeout_s}s")
            time.sleep(0.05)

    @property
    def model_config(self) -> dict[str, Any]:
        """The model's config as JSON (read once)."""
        if self._config is None:
            config = self._call(lambda c: c.get_model_config(self.model_name, self.model_version, **(
                {"as_json": True} if self.protocol == "grpc" else {}
            )))
            self._config = config.get("config", config) if self.protocol == "grpc" else config
        return self._config

    # --- inference ---------------------------------------------------------------------------
    def infer_sample(self, *inputs: Any, parameters: Mapping[str, Any] | None = None, **named: Any) -> dict[str, np.ndarray]:
        """One sample without its batch dimension; the batch dimension is added and removed here."""
        batching = int(self.model_config.get("max_batch_size", 0)) > 0
        arrays = self._inputs(inputs, named)
        if batching:
            arrays = {name: value[np.newaxis, ...] for name, value in arrays.items()}
        outputs = self._infer(arrays, parameters)
        return {name: value[0] for name, value in outputs.items()} if batching else outputs

    def infer_batch(self, *inputs: Any, parameters: Mapping[str, Any] | None = None, **named: Any) -> dict[str, np.ndarray]:
        """A batch (dim 0 is the batch for batching models); positional inputs follow the config's order."""
        return self._infer(self._inputs(inputs, named), parameters)

    def _inputs(self, positional: tuple[Any, ...], named: dict[str, Any]) -> dict[str, np.ndarray]:
        if positional and named:
            raise ValueError("pass inputs either positionally (in the config's order) or by name, not both")
        if positional:
            names = [entry["name"] for entry in self.model_config.get("input", [])]
            if len(positional) != len(names):
                raise ValueError(f"model '{self.model_name}' takes {len(names)} inputs {names}, got {len(positional)}")
            named = dict(zip(names, positional))
        if not named:
            raise ValueError("no inputs given")
        return {name: np.asarray(value) for name, value in named.items()}

    def _infer(self, arrays: dict[str, np.ndarray], parameters: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
        from tritonclient.utils import np_to_triton_dtype

        module = self._module
        inputs = []
        for name, array in arrays.items():
            if array.dtype.kind in "OSU":
                array = array.astype(np.object_)
                datatype = "BYTES"
            else:
                datatype = np_to_triton_dtype(array.dtype)
                if datatype is None:
                    raise ValueError(f"input '{name}': numpy dtype {array.dtype} has no Triton data type")
            item = module.InferInput(name, list(array.shape), datatype)
            item.set_data_from_numpy(array)
            inputs.append(item)
        names = [entry["name"] for entry in self.model_config.get("output", [])]
        if self.protocol == "http":
            outputs = [module.InferRequestedOutput(name, binary_data=True) for name in names]
        else:
            outputs = [module.InferRequestedOutput(name) for name in names]
        result = self._call(lambda c: c.infer(
            self.model_name, inputs, model_version=self.model_version, outputs=outputs,
            parameters=dict(parameters) if parameters else None,
        ))
        return {name: result.as_numpy(name) for name in names}

    def _call(self, action: Any) -> Any:
        from tritonclient.utils import InferenceServerException

        try:
            return action(self._connect())
        except InferenceServerException as exc:
            raise ModelClientError(exc.message(), exc.status()) from None
