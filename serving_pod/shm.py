"""Client shared memory: registered system (POSIX) and CUDA IPC regions, every access bounds-checked.

The engine owns one ``SharedMemoryManager``. The protocol adapters call ``register_*`` /
``unregister`` / ``status``; the engine calls ``read_inputs`` before validating a request and
``output_targets`` + ``write_outputs`` around inference, so HTTP and gRPC share one code path.

Security rules (Triton has shipped bugs in each of these):

- registration is refused unless the server runs with ``--allow-client-shm=true``;
- a key names one object in ``/dev/shm``: no ``/``, no ``..``, no symlinks, regular files only;
- ``offset + byte_size`` of a registration must lie inside the object;
- every tensor's ``offset + byte_size`` must lie inside its registered region, and the object's
  current size is re-checked before each access (a client that shrinks the object after
  registering gets an error instead of crashing the server with SIGBUS);
- inputs are copied out of the region, so no view into client memory outlives the request.

A region an admitted request reads or writes is held (``hold`` / ``release``) until the request's last response:
unregistering it meanwhile is refused in tritonserver 2.51's words (INTERNAL), so the request still finds its
output region; unregistering every region drops the idle ones and names the held ones.

CUDA regions need ``cuda-python`` (see :mod:`serving_pod.cuda_shm`); without it registering
one is UNSUPPORTED with a message that says so.
"""

from __future__ import annotations

import mmap
import os
import stat
from dataclasses import dataclass
from typing import Any, Protocol

from serving_pod.core import datatypes
from serving_pod.core.errors import (
    AlreadyExistsError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    UnsupportedError,
)
from serving_pod.core.types import InferRequest, InferResponse, RequestedOutput

DISABLED_MESSAGE = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)
RESERVED_PREFIX = "triton_python_backend_shm_region_"
SHM_DIR = "/dev/shm"
SYSTEM, CUDA = "system", "cuda"


class Region(Protocol):
    """A registered region: ``byte_size`` bytes readable and writable at offsets inside it."""

    name: str
    kind: str
    byte_size: int

    def read(self, offset: int, size: int) -> bytes: ...

    def write(self, offset: int, data: bytes) -> None: ...

    def status(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def _invalid_args(name: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"failed to register shared memory region '{name}': invalid args")


def _shm_path(name: str, key: str) -> str:
    """``/dev/shm/<key>`` for a POSIX shm key (``/name`` or ``name``), refusing anything else."""
    stripped = key.lstrip("/")
    if not stripped or stripped in (".", "..") or "/" in stripped or "\0" in stripped:
        raise InvalidArgumentError(
            f"failed to register shared memory region '{name}': invalid key '{key}' "
            "(a POSIX shared memory name such as '/input_data')"
        )
    if stripped.startswith(RESERVED_PREFIX):
        raise InvalidArgumentError(
            f"cannot register shared memory region '{name}' with key '{key}' as the key "
            f"contains the reserved prefix '{RESERVED_PREFIX}'"
        )
    return os.path.join(SHM_DIR, stripped)


class SystemRegion:
    """A POSIX shared memory object mapped read-write; ``[offset, offset+byte_size)`` is the region."""

    kind = SYSTEM

    def __init__(self, name: str, key: str, offset: int, byte_size: int) -> None:
        path = _shm_path(name, key)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise InvalidArgumentError(f"Unable to open shared memory region: '{key}'") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidArgumentError(f"Invalid shared memory region: '{key}'")
            if byte_size <= 0 or offset + byte_size > info.st_size:
                raise _invalid_args(name)
            self._map = mmap.mmap(fd, offset + byte_size, access=mmap.ACCESS_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.name, self.key, self.offset, self.byte_size = name, key, offset, byte_size

    def _check(self, offset: int, size: int) -> int:
        start = self.offset + offset
        if os.fstat(self._fd).st_size < start + size:
            raise InvalidArgumentError(
                f"shared memory region '{self.name}' was truncated below its registered size"
            )
        return start

    def read(self, offset: int, size: int) -> bytes:
        start = self._check(offset, size)
        return self._map[start:start + size]

    def write(self, offset: int, data: bytes) -> None:
        start = self._check(offset, len(data))
        self._map[start:start + len(data)] = data

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def close(self) -> None:
        self._map.close()
        os.close(self._fd)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one tensor lives: region name, offset into the region, byte size."""

    region: str
    offset: int
    byte_size: int


class SharedMemoryManager:
    """Registered regions by name (system and CUDA share one namespace, as in Triton)."""

    def __init__(self, *, allow: bool) -> None:
        self.allow = allow
        self.regions: dict[str, Region] = {}
        #: region name -> how many admitted requests hold it (module docstring)
        self._users: dict[str, int] = {}

    def hold(self, names: list[str]) -> None:
        """Mark the regions ``names`` (one entry per use) as used by a request until ``release(names)``."""
        for name in names:
            self._users[name] = self._users.get(name, 0) + 1

    def in_use(self, name: str) -> bool:
        """Whether an admitted request holds the region ``name``."""
        return name in self._users

    def release(self, names: list[str]) -> None:
        for name in names:
            left = self._users[name] - 1
            if left:
                self._users[name] = left
            else:
                del self._users[name]

    def require_allowed(self) -> None:
        if not self.allow:
            raise UnsupportedError(DISABLED_MESSAGE)

    @staticmethod
    def require_region(name: str, kind: str) -> None:
        """A register request's first check, tritonserver's (``kind``: ``system`` or ``cuda``); the HTTP front end
        makes it before it reads the request's body, as tritonserver does."""
        if not name:
            raise InvalidArgumentError(f"'region name' is necessary to register {kind} shared memory region")

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.require_allowed()
        self.require_region(name, "system")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (offset, byte_size)):
            raise _invalid_args(name)
        if name in self.regions:
            raise AlreadyExistsError(f"shared memory region '{name}' already in manager")
        self.regions[name] = SystemRegion(name, key, offset, byte_size)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self.require_allowed()
        self.require_region(name, "cuda")
        if name in self.regions:
            raise AlreadyExistsError(f"shared memory region '{name}' already in manager")
        from serving_pod.cuda_shm import CudaRegion  # cuda-python, imported on demand

        self.regions[name] = CudaRegion(name, raw_handle, device_id, byte_size)

    def unregister(self, kind: str, name: str = "") -> None:
        """Unregister one region (unknown names are a no-op, as in Triton) or every region of ``kind``; one a
        request holds stays (module docstring), refused as tritonserver refuses it."""
        self.require_allowed()
        names = [name] if name else sorted(n for n, r in self.regions.items() if r.kind == kind)
        busy = []
        for region_name in names:
            region = self.regions.get(region_name)
            if region is not None and region.kind == kind:
                if self.in_use(region_name):
                    busy.append(region_name)
                    continue
                del self.regions[region_name]
                region.close()
        if busy and name:
            raise InternalError(f"Cannot unregister shared memory region '{name}', it is currently in use.")
        if busy:  # Triton's words: its map's (sorted) order, each name followed by " ,"
            raise InternalError(f"Failed to unregister the following {'cuda' if kind == CUDA else 'system'} shared "
                                f"memory regions: {''.join(n + ' ,' for n in busy)}")

    def status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        if not name:  # by name, as Triton's map lists them
            return [r.status() for _, r in sorted(self.regions.items()) if r.kind == kind]
        region = self.regions.get(name)
        label = "cuda" if kind == CUDA else "system"
        if region is None:
            raise NotFoundError(f"Unable to find {label} shared memory region: '{name}'")
        if region.kind != kind:
            other = "CUDA" if region.kind == CUDA else "system"
            raise NotFoundError(
                f"The region named '{name}' is registered as {other} shared memory, "
                f"not {'CUDA' if kind == CUDA else 'system'} shared memory"
            )
        return [region.status()]

    def close(self) -> None:
        for region in self.regions.values():
            region.close()
        self.regions.clear()

    # --- tensors ---------------------------------------------------------------------------
    def locate(self, placement: Placement) -> Region:
        """The region of ``placement`` after checking the span lies inside it."""
        region = self.regions.get(placement.region)
        if region is None:
            raise NotFoundError(f"Unable to find shared memory region: '{placement.region}'")
        if placement.offset >= region.byte_size:
            raise InvalidArgumentError(f"Invalid offset for shared memory region: '{placement.region}'")
        if placement.offset + placement.byte_size > region.byte_size:
            raise InvalidArgumentError(
                f"Invalid offset + byte size for shared memory region: '{placement.region}'"
            )
        return region

    def read_inputs(self, request: InferRequest) -> list[str]:
        """Replace every shared-memory input's placeholder with the bytes from its region; returns the regions read,
        one name per input. Bytes that do not fit the shape (a byte size, malformed BYTES) leave the placeholder and a
        defect, which the model's validation refuses after its other checks in the core's words, as it does binary
        data (Triton's order and words)."""
        regions = []
        for tensor in request.inputs:
            params = tensor.parameters
            if "shared_memory_region" not in params:
                continue
            placement = placement_of(params, f"input '{tensor.name}'")
            raw = self.locate(placement).read(placement.offset, placement.byte_size)
            regions.append(placement.region)
            tensor.data, defect = datatypes.decode_raw(tensor.datatype, tensor.data.shape, raw)
            if defect is not None:
                tensor.defect = defect
        return regions

    def output_targets(self, outputs: list[RequestedOutput]) -> dict[str, Placement] | None:
        """Shared-memory placements of the requested outputs (checked now, before inference)."""
        targets: dict[str, Placement] | None = None
        for output in outputs:
            params = output.parameters
            if "shared_memory_region" not in params:
                continue
            if params.get("binary_data"):
                raise InvalidArgumentError("Output can't set both 'shared_memory_region' and 'binary_data'")
            placement = placement_of(params, f"output '{output.name}'")
            self.locate(placement)
            if targets is None:
                targets = {}
            targets[output.name] = placement
        return targets

    def write_outputs(self, response: InferResponse, targets: dict[str, Placement]) -> None:
        """Write the targeted outputs into their regions; the codecs then send no data for them."""
        for tensor in response.outputs:
            placement = targets.get(tensor.name)
            if placement is None:
                continue
            raw = datatypes.to_raw(tensor.datatype, tensor.data)
            if len(raw) > placement.byte_size:
                raise InvalidArgumentError(
                    f"shared memory size specified with the request for output '{tensor.name}' "
                    f"({placement.byte_size} bytes) should be at least {len(raw)} bytes to hold the results"
                )
            self.locate(placement).write(placement.offset, raw)
            tensor.parameters = {
                "shared_memory_region": placement.region,
                "shared_memory_byte_size": len(raw),
            }
            if placement.offset:
                tensor.parameters["shared_memory_offset"] = placement.offset


def placement_of(params: dict[str, Any], what: str) -> Placement:
    """The validated ``shared_memory_*`` parameters of a tensor (byte size required, offset default 0)."""
    region = params.get("shared_memory_region")
    if not isinstance(region, str):  # '' is a name like any other: no region has it (Triton: not found)
        raise InvalidArgumentError(f"{what}: 'shared_memory_region' must be a string")
    if "shared_memory_byte_size" not in params:
        raise InvalidArgumentError(f"{what}: 'shared_memory_byte_size' is required with 'shared_memory_region'")
    values = (params.get("shared_memory_offset", 0), params["shared_memory_byte_size"])
    for key, value in zip(("shared_memory_offset", "shared_memory_byte_size"), values):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidArgumentError(f"{what}: '{key}' must be a non-negative integer, got {value!r}")
    return Placement(region, values[0], values[1])
