"""The small interface every backend implements (onnxruntime, python, tensorrt, and the test backend).

A backend turns a model version on disk into model instances. An instance executes a list of
requests at a time (the scheduler decides the list: one request, or a dynamic batch) and returns
one response, or one error, per request, in order. ``execute`` is synchronous and runs on the
instance's own worker thread, so a slow model never blocks the server's event loop. An instance that
only waits on another process may also offer ``execute_on_loop``; one whose ``execute`` spends its time in
native code with the GIL released declares ``releases_gil``, one that only computes on the CPU (never waits on
a device or I/O) ``cpu_bound``, one that never blocks on the engine ``inline_safe``, and one that blocks only on
the engine (through ``Engine.infer_from_thread`` and its kin, which may suspend it: ``core/suspend.py``)
``suspends_on_engine``, with ``on_resume`` to restore its thread state after a wait (see ``schedulers.instances``).

Heavy imports (onnxruntime, tensorrt, a model's own module) happen inside each backend's
functions, never at import time of this package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from serving_pod.core.errors import ModelLoadError, ServerError
from serving_pod.core.types import InferRequest, InferResponse

if TYPE_CHECKING:
    from tritonclient.grpc.model_config_pb2 import ModelConfig

#: source fragments of network clients: code that names one may call this very server, whose answer the event loop
#: thread would have to give while that code waits there (the server would hang until the client's timeout), so
#: such code is never ``inline_safe``
NETWORK_CLIENTS = ("tritonclient", "ModelClient", "socket", "urllib", "http.client", "httpx", "aiohttp",
                   "import requests", "from requests", "grpc")


def names_network_client(source: str) -> bool:
    """Whether ``source`` names a network client (``NETWORK_CLIENTS``)."""
    return any(fragment in source for fragment in NETWORK_CLIENTS)


class VersionLoadError(ModelLoadError):
    """A backend could not make a model version: the registry words it as Triton does, per version
    (``version N is at UNAVAILABLE state: <status>: <message>;``). ``status``: Triton's words for its status code
    ("Internal" for what a model's own code raised, "Invalid argument" for a config the backend refuses);
    ``versions``: the versions it fails, where it fails all of a model's (set where they are known)."""

    def __init__(self, message: str, *, status: str = "Internal") -> None:
        super().__init__(message)
        self.status = status
        self.versions: list[int] = []


@dataclass(frozen=True, slots=True)
class InstanceContext:
    """Everything an instance needs to know about where and what it is.

    ``kind`` is Triton's instance kind name (KIND_CPU, KIND_GPU, KIND_MODEL); ``device_id`` the
    GPU index for KIND_GPU (0 otherwise); ``name`` Triton's instance name (``<model>_<group>_<i>``).
    ``backend_config`` holds ``--backend-config`` settings for this backend.
    ``engine`` is the owning engine (for BLS calls from python models); None in isolated tests.
    """

    model_name: str
    model_version: str
    model_dir: Path
    version_dir: Path
    config: "ModelConfig"
    name: str
    kind: str = "KIND_CPU"
    device_id: int = 0
    backend_config: dict[str, str] = field(default_factory=dict)
    engine: Any = None


class ModelInstance(Protocol):
    """One executing copy of a model."""

    def execute(self, requests: list[InferRequest]) -> list[InferResponse | ServerError]:
        """Run ``requests`` (already validated against the config) and answer each, in order."""
        ...

    def close(self) -> None:
        """Release the instance (python models: ``finalize``)."""
        ...


class Backend(Protocol):
    """Creates instances of one kind of model file."""

    name: str

    def default_model_filename(self) -> str:
        """The file a version folder must hold when config's ``default_model_filename`` is empty."""
        ...

    def auto_complete(self, config: "ModelConfig", model_dir: Path, version_dir: Path | None) -> None:
        """Fill what the config leaves out (inputs, outputs, max_batch_size) from the model itself."""
        ...

    def create_instance(self, context: InstanceContext) -> ModelInstance:
        """Load one instance; raise ``ModelLoadError`` with a clear message on failure."""
        ...
