"""DLPack for ``pb_utils.Tensor``: reading capsules (CPU, pinned host, CUDA), exporting GPU and BF16 tensors.

Neighbours: ``pb_tensor.Tensor.from_dlpack`` calls ``take``, ``to_dlpack`` calls ``export``; ``python_bridge`` copies a GPU
output to host memory (``DeviceTensor.to_host``) when a response leaves the model, since the engine's
tensors are host arrays. Semantics follow Triton's python backend (``src/pb_tensor.cc``):

* a capsule or an object with ``__dlpack__`` and ``__dlpack_device__``; a CUDA object is asked for
  its capsule on the legacy default stream (``stream=1``), so its pending work is ordered before the
  copy that reads it;
* devices: CPU and pinned host (kDLCUDAHost) memory, CUDA memory (needs cuda-python and a GPU);
  anything else is refused with Triton's message;
* CUDA tensors must be contiguous in C order (Triton's check and message); CPU tensors may be
  strided (numpy copies them);
* the producer's capsule is kept alive by the tensor that reads it, and frees its memory through
  its own destructor when the tensor goes (the capsule is not renamed, so its deleter still runs).

Both the legacy (``dltensor``) and the versioned DLPack 1.x (``dltensor_versioned``) capsule layouts
are read; exported capsules use the legacy layout, which every consumer accepts.
"""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

K_DL_CPU, K_DL_CUDA, K_DL_CUDA_HOST = 1, 2, 3
_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6
_LEGACY, _VERSIONED = b"dltensor", b"dltensor_versioned"

#: (DLPack type code, bits) -> (host numpy dtype, Triton wire datatype); BF16 rides as uint16
_DTYPES: dict[tuple[int, int], tuple[np.dtype, str]] = {
    (_BOOL, 8): (np.dtype(np.bool_), "BOOL"),
    (_UINT, 1): (np.dtype(np.bool_), "BOOL"),
    (_INT, 8): (np.dtype(np.int8), "INT8"),
    (_INT, 16): (np.dtype(np.int16), "INT16"),
    (_INT, 32): (np.dtype(np.int32), "INT32"),
    (_INT, 64): (np.dtype(np.int64), "INT64"),
    (_UINT, 8): (np.dtype(np.uint8), "UINT8"),
    (_UINT, 16): (np.dtype(np.uint16), "UINT16"),
    (_UINT, 32): (np.dtype(np.uint32), "UINT32"),
    (_UINT, 64): (np.dtype(np.uint64), "UINT64"),
    (_FLOAT, 16): (np.dtype(np.float16), "FP16"),
    (_FLOAT, 32): (np.dtype(np.float32), "FP32"),
    (_FLOAT, 64): (np.dtype(np.float64), "FP64"),
    (_BFLOAT, 16): (np.dtype(np.uint16), "BF16"),
}
_WIRE_TO_DL = {wire: key for key, (_, wire) in _DTYPES.items() if key != (_UINT, 1)}


class DLPackError(ValueError):
    """A DLPack object the python backend cannot take; the message is Triton's where it has one."""


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [
        ("version", _Version),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_api = ctypes.pythonapi
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# the same two calls on a raw pointer, for the capsule destructor (its object must not be referenced again)
_raw_is_valid = _api["PyCapsule_IsValid"]
_raw_is_valid.restype, _raw_is_valid.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p]
_raw_get_pointer = _api["PyCapsule_GetPointer"]
_raw_get_pointer.restype, _raw_get_pointer.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]


@dataclass
class DeviceTensor:
    """A tensor in CUDA memory, read from a DLPack capsule that ``keep`` holds alive."""

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    datatype: str
    device_id: int
    keep: Any

    def to_host(self) -> np.ndarray:
        """A host copy (``cudaMemcpy`` on the legacy default stream, which waits for the producer's work)."""
        import cuda.bindings.runtime as runtime  # type: ignore[import-untyped]  # checked by ``take``

        host = np.empty(self.shape, dtype=self.dtype)
        if host.nbytes:
            _cuda_call(runtime, runtime.cudaSetDevice, self.device_id)
            _cuda_call(runtime, runtime.cudaMemcpy, host.ctypes.data, self.ptr, host.nbytes,
                       runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        return host


@dataclass
class CapsuleView:
    """What a capsule describes: data pointer (byte offset applied), device, shape, strides in elements, type."""

    ptr: int
    device_type: int
    device_id: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    code: int
    bits: int
    lanes: int


def is_capsule(value: Any) -> bool:
    return type(value).__name__ == "PyCapsule"


def read_capsule(capsule: Any) -> CapsuleView:
    """The DLTensor of an unconsumed legacy or versioned DLPack capsule."""
    if _api.PyCapsule_IsValid(capsule, _LEGACY):
        tensor = _Managed.from_address(_api.PyCapsule_GetPointer(capsule, _LEGACY)).dl_tensor
    elif _api.PyCapsule_IsValid(capsule, _VERSIONED):
        tensor = _ManagedVersioned.from_address(_api.PyCapsule_GetPointer(capsule, _VERSIONED)).dl_tensor
    else:
        name = _api.PyCapsule_GetName(capsule)
        raise DLPackError(f"the capsule is not an unconsumed DLPack tensor (its name is {name!r})")
    ndim = tensor.ndim
    shape = tuple(tensor.shape[i] for i in range(ndim))
    strides = tuple(tensor.strides[i] for i in range(ndim)) if tensor.strides else None
    return CapsuleView(
        ptr=(tensor.data or 0) + tensor.byte_offset,
        device_type=tensor.device.device_type,
        device_id=tensor.device.device_id,
        shape=shape,
        strides=strides,
        code=tensor.dtype.code,
        bits=tensor.dtype.bits,
        lanes=tensor.dtype.lanes,
    )


def check_contiguous(view: CapsuleView) -> None:
    """Triton's C-order check: dims of size 1 may have any stride."""
    if view.strides is None:
        return
    expected = 1
    for dim, stride in zip(reversed(view.shape), reversed(view.strides)):
        if dim != 1:
            if stride != expected:
                raise DLPackError(
                    "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in "
                    "C-Order are supported."
                )
            expected *= dim


def dtype_of(view: CapsuleView) -> tuple[np.dtype, str]:
    found = _DTYPES.get((view.code, view.bits)) if view.lanes == 1 else None
    if found is None:
        raise DLPackError(
            f"DLPack data type (code {view.code}, {view.bits} bits, {view.lanes} lanes) has no Triton data type"
        )
    return found


def host_copy(view: CapsuleView, dtype: np.dtype) -> np.ndarray:
    """A copy of a contiguous tensor in CPU or pinned host memory (the layouts numpy cannot import: BF16, pinned)."""
    check_contiguous(view)
    count = int(np.prod(view.shape, dtype=np.int64))
    if not count:
        return np.empty(view.shape, dtype=dtype)
    raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(view.ptr)
    return np.frombuffer(memoryview(raw), dtype=dtype).reshape(view.shape).copy()


def check_data(view: CapsuleView) -> None:
    """A tensor with elements must point somewhere: reading address 0 would end the server, not a request."""
    if not view.ptr and all(view.shape):
        raise DLPackError(f"DLPack tensor of shape {list(view.shape)} has no data pointer")


def take(name: str, source: Any) -> DeviceTensor | tuple[np.ndarray, str | None]:
    """What ``Tensor.from_dlpack(name, source)`` holds: a ``DeviceTensor`` for CUDA memory, else a host array
    and its Triton datatype where numpy cannot say it (BF16), None where it can. DLPackError otherwise."""
    if is_capsule(source):
        capsule, keep = source, source
    elif hasattr(source, "__dlpack__") and hasattr(source, "__dlpack_device__"):
        capsule = _capsule_of(name, source)
        keep = (source, capsule)
    else:
        raise DLPackError(
            # sic: Triton's stub continues the literal across a line, indentation included
            "Provided tensor is not supported. Tensor must be a DLPack capsule         or have `__dlpack__` and "
            "`__dlpack_device__` attributes"
        )
    view = read_capsule(capsule)
    if view.device_type == K_DL_CUDA:
        cuda_runtime()  # Triton's message where this host cannot read GPU memory
        check_data(view)
        check_contiguous(view)
        dtype, datatype = dtype_of(view)
        return DeviceTensor(view.ptr, view.shape, dtype, datatype, view.device_id, keep)
    if view.device_type not in (K_DL_CPU, K_DL_CUDA_HOST):
        raise _unsupported_device(view.device_type)
    check_data(view)
    dtype, datatype = dtype_of(view)
    if datatype == "BF16" or view.device_type == K_DL_CUDA_HOST:
        return host_copy(view, dtype), datatype
    try:
        return np.from_dlpack(_Capsule(capsule)), None
    except (BufferError, TypeError, RuntimeError) as exc:
        raise DLPackError(f"Tensor '{name}': cannot import DLPack object: {exc}") from None


def _capsule_of(name: str, source: Any) -> Any:
    """The producer's capsule; a CUDA producer's pending work is ordered before the legacy default stream,
    which our copy uses. What the producer raises (an object array, a read-only one) is the model's error."""
    try:
        device_type = int(source.__dlpack_device__()[0])
        if device_type == K_DL_CUDA:
            try:
                return source.__dlpack__(stream=1)
            except TypeError:
                return source.__dlpack__()
        if device_type in (K_DL_CPU, K_DL_CUDA_HOST):
            return source.__dlpack__()
    except (BufferError, TypeError, ValueError, RuntimeError) as exc:
        raise DLPackError(f"Tensor '{name}': cannot export the object to DLPack: {exc}") from None
    raise _unsupported_device(device_type)


def _unsupported_device(device_type: int) -> DLPackError:
    return DLPackError(f"DLDevice type {device_type} is not support by Python backend.")


class _Capsule:
    """Lets ``numpy.from_dlpack`` consume a bare DLPack capsule (Triton accepts both)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (K_DL_CPU, 0)


# --------------------------------------------------------------------------- CUDA runtime


_NO_GPU = "DLPack capsule passed pointer to memory allocated on GPU device, when GPU is not available"


def cuda_runtime() -> Any:
    """cuda-python's runtime module where a GPU is visible, else DLPackError with Triton's message."""
    try:
        import cuda.bindings.runtime as runtime  # type: ignore[import-untyped]  # optional: ferry[gpu]
    except ImportError:
        raise DLPackError(f"{_NO_GPU} (cuda-python is not installed: pip install cuda-python)") from None
    error, count = runtime.cudaGetDeviceCount()
    if int(error) != 0 or count < 1:
        raise DLPackError(f"{_NO_GPU} (no CUDA device: {error!r})")
    return runtime


def _cuda_call(runtime: Any, function: Any, *args: Any) -> Any:
    result = function(*args)
    error = result[0] if isinstance(result, tuple) else result
    if int(error) != 0:
        raise DLPackError(f"CUDA call {function.__name__} failed: {runtime.cudaGetErrorString(error)[1]!r}")
    return result


# --------------------------------------------------------------------------- export


_exported: dict[int, tuple[Any, ...]] = {}
_ids = itertools.count(1)


@_DELETER
def _delete(managed: Any) -> None:
    _exported.pop(managed.contents.manager_ctx or 0, None)


@_CAPSULE_DESTRUCTOR
def _destroy(capsule: int) -> None:
    # an unconsumed capsule owns its tensor; a consumer renamed it and calls the deleter itself
    if _raw_is_valid(capsule, _LEGACY):
        managed = _Managed.from_address(_raw_get_pointer(capsule, _LEGACY))
        managed.deleter(ctypes.pointer(managed))


def export(ptr: int, shape: tuple[int, ...], datatype: str, device_type: int, device_id: int, owner: Any) -> Any:
    """A legacy DLPack capsule over ``ptr`` (contiguous, C order); ``owner`` lives until the consumer lets go."""
    code, bits = _WIRE_TO_DL[datatype]
    dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
    managed = _Managed()
    managed.dl_tensor.data = ptr or None
    managed.dl_tensor.device = _Device(device_type, device_id)
    managed.dl_tensor.ndim = len(shape)
    managed.dl_tensor.dtype = _DataType(code, bits, 1)
    managed.dl_tensor.shape = dims
    managed.dl_tensor.strides = None
    managed.dl_tensor.byte_offset = 0
    key = next(_ids)
    managed.manager_ctx = key
    managed.deleter = _delete
    _exported[key] = (managed, dims, owner)
    return _api.PyCapsule_New(ctypes.addressof(managed), _LEGACY, _destroy)
