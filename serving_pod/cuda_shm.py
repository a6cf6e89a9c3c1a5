"""CUDA shared memory regions (CUDA IPC handles) for :mod:`serving_pod.shm`, through cuda-python.

Imported only when a client registers a CUDA region. Without ``cuda-python`` (``cuda.bindings``)
or without a GPU the registration fails with UNSUPPORTED and a message naming what is missing.
Reads and writes copy between the device region and host memory; the registered ``byte_size``
is checked against the real allocation size (``cuMemGetAddressRange``) at registration, and the
manager checks every tensor's span against ``byte_size`` before calling ``read`` / ``write``.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

from serving_pod.core.errors import InvalidArgumentError, UnsupportedError

CUDA = "cuda"
log = logging.getLogger(__name__)


def _runtime() -> tuple[Any, Any]:
    try:
        import cuda.bindings.driver as driver
        import cuda.bindings.runtime as runtime
    except ImportError:
        raise UnsupportedError(
            "CUDA shared memory is not supported by this server: cuda-python is not installed "
            "(pip install cuda-python) or no GPU is present"
        ) from None
    error, count = runtime.cudaGetDeviceCount()
    if int(error) != 0 or count < 1:
        raise UnsupportedError(
            f"CUDA shared memory is not supported by this server: no CUDA device is visible ({error!r})"
        )
    return runtime, driver


def _call(function: Any, *args: Any) -> Any:
    result = function(*args)
    error = result[0]
    if int(error) != 0:
        raise InvalidArgumentError(f"CUDA call {function.__name__} failed: {error!r}")
    return result[1] if len(result) == 2 else result[1:]


class CudaRegion:
    """A device allocation of another process, opened from its IPC handle."""

    kind = CUDA

    def __init__(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        runtime, driver = _runtime()
        if byte_size <= 0 or device_id < 0:
            raise InvalidArgumentError(f"failed to register shared memory region '{name}': invalid args")
        size = runtime.CUDA_IPC_HANDLE_SIZE
        if len(raw_handle) != size:
            raise InvalidArgumentError(
                f"failed to register shared memory region '{name}': the raw handle has "
                f"{len(raw_handle)} bytes, a CUDA IPC handle has {size}"
            )
        self._runtime = runtime
        handle = runtime.cudaIpcMemHandle_t()
        ctypes.memmove(handle.getPtr(), raw_handle, size)
        _call(runtime.cudaSetDevice, device_id)
        try:
            self._ptr = int(_call(
                runtime.cudaIpcOpenMemHandle, handle, runtime.cudaIpcMemLazyEnablePeerAccess
            ))
        except InvalidArgumentError as exc:
            log.error("failed to open CUDA IPC handle: %s", exc)  # the client gets Triton's generic answer
            raise InvalidArgumentError(
                f"failed to register shared memory region '{name}': invalid args"
            ) from None
        base, allocated = _call(driver.cuMemGetAddressRange, self._ptr)
        if self._ptr + byte_size > int(base) + int(allocated):
            self.close()
            raise InvalidArgumentError(f"failed to register shared memory region '{name}': invalid args")
        self.name, self.device_id, self.byte_size = name, device_id, byte_size

    def read(self, offset: int, size: int) -> bytes:
        buffer = ctypes.create_string_buffer(size)
        _call(self._runtime.cudaMemcpy, ctypes.addressof(buffer), self._ptr + offset, size,
              self._runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        return buffer.raw

    def write(self, offset: int, data: bytes) -> None:
        _call(self._runtime.cudaMemcpy, self._ptr + offset, data, len(data),
              self._runtime.cudaMemcpyKind.cudaMemcpyHostToDevice)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def close(self) -> None:
        self._runtime.cudaIpcCloseMemHandle(self._ptr)
