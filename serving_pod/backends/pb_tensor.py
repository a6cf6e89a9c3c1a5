"""Tensors, data types and errors of Ferry's ``triton_python_backend_utils`` (see ``pb_utils``).

``Tensor`` wraps a numpy array without copying; ``Tensor._wrap`` is the trusted fast path the
backend uses for the engine's (already validated) tensors. A read-only view of a request body is
copied once when the model asks for the array (``as_numpy``, ``to_dlpack``), as Triton's stub gives
models arrays of their own. ``TritonError`` is the error value a model attaches to one response;
``TritonModelException`` is what the API raises on misuse.
"""

from __future__ import annotations

import enum
import struct
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from serving_pod.backends.pb_dlpack import DeviceTensor
    from serving_pod.backends.pb_request import InferenceRequest, InferenceResponse

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class _MemoryType(enum.IntEnum):
    """``pb_utils.TRITONSERVER_MEMORY_*``: Triton's ``PreferredMemory.MemoryType`` (pybind11's enum), GPU 0 and CPU 1
    (not ``TRITONSERVER_MemoryType``'s numbers); a member compares and hashes as its number."""

    TRITONSERVER_MEMORY_GPU = 0
    TRITONSERVER_MEMORY_CPU = 1

    def __str__(self) -> str:
        return f"MemoryType.{self.name}"


_MemoryType.__name__ = "MemoryType"  # its repr: <MemoryType.TRITONSERVER_MEMORY_CPU: 1> (__qualname__ kept for pickle)
TRITONSERVER_MEMORY_GPU = _MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = _MemoryType.TRITONSERVER_MEMORY_CPU
_PREFERRED_MEMORY_SIGNATURE = ("c_python_backend_utils.PreferredMemory(preferred_memory_type: "
                               "triton::backend::python::PreferredMemory::MemoryType, preferred_device_id: int = 0)")


class PreferredMemory:
    """``PreferredMemory(TRITONSERVER_MEMORY_CPU, 0)`` for a BLS request's outputs. Taken for compatibility (outputs
    live in CPU memory here); as Triton's binding, the type must be a ``TRITONSERVER_MEMORY_*`` member (a bare number
    is pybind11's ``TypeError``) and the device id an int, and nothing of it is readable back."""

    __slots__ = ("_memory_type", "_device_id")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        memory_type, device_id = bind_arguments(("preferred_memory_type", "preferred_device_id"), (0,), args, kwargs,
                                                _PREFERRED_MEMORY_SIGNATURE)
        if type(memory_type) is not _MemoryType or not isinstance(device_id, int):
            raise incompatible_arguments(_PREFERRED_MEMORY_SIGNATURE, args, kwargs)
        self._memory_type = memory_type
        self._device_id = device_id

# --------------------------------------------------------------------------- data types

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

#: TRITONSERVER_DataType codes (BOOL=1 ... BYTES=13, BF16=14) <-> numpy.
_CODE_TO_NUMPY: dict[int, Any] = {
    1: np.bool_, 2: np.uint8, 3: np.uint16, 4: np.uint32, 5: np.uint64, 6: np.int8,
    7: np.int16, 8: np.int32, 9: np.int64, 10: np.float16, 11: np.float32, 12: np.float64,
    13: np.object_,
}
_NUMPY_TO_CODE: dict[np.dtype, int] = {
    np.dtype(t): code for code, t in _CODE_TO_NUMPY.items() if code != 13
}
_SUPPORTED_DTYPES = frozenset(_NUMPY_TO_CODE)


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    return _CODE_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    dtype = np.dtype(data_type)
    if dtype.kind in "OS":
        return 13
    return _NUMPY_TO_CODE.get(dtype)


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | tuple[()] | None:
    """Object/bytes array -> length-prefixed bytes in C order (Triton's BYTES layout)."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype.kind not in "OSU":
        return None
    parts: list[bytes] = []
    for item in input_tensor.flat:
        data = item if isinstance(item, bytes) else str(item).encode("utf-8")
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """Length-prefixed bytes -> 1-D object array of ``bytes``."""
    items: list[bytes] = []
    offset, total = 0, len(encoded_tensor)
    while offset < total:
        (length,) = struct.unpack_from("<I", encoded_tensor, offset)
        offset += 4
        items.append(bytes(encoded_tensor[offset : offset + length]))
        offset += length
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array


# --------------------------------------------------------------------------- errors


class TritonModelException(Exception):
    """Raised by the API on misuse; a model may raise it to fail the whole batch."""


class _ErrorCode(enum.IntEnum):
    """``TritonError``'s codes, Triton's ``TritonError.__ErrorCode`` enum (pybind11's): a code compares equal to its
    number, and ``TritonError(message, code)`` takes only a member, never a bare number."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __str__(self) -> str:
        return f"__ErrorCode.{self.name}"


_ErrorCode.__name__ = "__ErrorCode"  # its repr: <__ErrorCode.INTERNAL: 1>

_ERROR_SIGNATURE = ("c_python_backend_utils.TritonError(message: str, code: "
                    "c_python_backend_utils.TritonError.__ErrorCode = <__ErrorCode.INTERNAL: 1>)")


class TritonError:
    """An error value a model attaches to one response (``InferenceResponse(error=...)``)."""

    UNKNOWN = _ErrorCode.UNKNOWN
    INTERNAL = _ErrorCode.INTERNAL
    NOT_FOUND = _ErrorCode.NOT_FOUND
    INVALID_ARG = _ErrorCode.INVALID_ARG
    UNAVAILABLE = _ErrorCode.UNAVAILABLE
    UNSUPPORTED = _ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _ErrorCode.ALREADY_EXISTS
    CANCELLED = _ErrorCode.CANCELLED

    __slots__ = ("_message", "_code")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not kwargs and type(args[0] if args else None) is str:  # the common calls first
            if len(args) == 1:
                self._message, self._code = args[0], _ErrorCode.INTERNAL
                return
            if len(args) == 2 and type(args[1]) is _ErrorCode:
                self._message, self._code = args
                return
        message, code = bind_arguments(("message", "code"), (_ErrorCode.INTERNAL,), args, kwargs, _ERROR_SIGNATURE)
        if isinstance(message, bytes):
            message = message.decode()
        if not isinstance(message, str) or type(code) is not _ErrorCode:
            raise incompatible_arguments(_ERROR_SIGNATURE, args, kwargs)
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> _ErrorCode:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code.name})"


setattr(TritonError, "__ErrorCode", _ErrorCode)  # Triton's name, set outside the class body (no mangling)
_ErrorCode.__qualname__ = "TritonError.__ErrorCode"  # so that pickle finds it


def incompatible_arguments(signature: str, args: tuple, kwargs: dict, function: str = "__init__") -> TypeError:
    """pybind11's refusal of arguments that match none of a binding's signatures, in its words."""
    given = ", ".join(map(repr, args))
    if kwargs:
        given += ("; " if given else "") + "kwargs: " + ", ".join(f"{key}={value!r}" for key, value in kwargs.items())
    what = "constructor" if function == "__init__" else "function"
    return TypeError(f"{function}(): incompatible {what} arguments. The following argument types are supported:\n"
                     f"    1. {signature}\n\nInvoked with: {given}")


def bind_arguments(names: tuple[str, ...], defaults: tuple, args: tuple, kwargs: dict, signature: str) -> list[Any]:
    """``args`` and ``kwargs`` as the values of ``names`` (the last ones defaulting to ``defaults``), as pybind11
    binds them; anything that does not fit is its TypeError."""
    if len(args) > len(names):
        raise incompatible_arguments(signature, args, kwargs)
    values = list(args) + [_MISSING] * (len(names) - len(args))
    for key, value in kwargs.items():
        try:
            index = names.index(key)
        except ValueError:
            raise incompatible_arguments(signature, args, kwargs) from None
        if values[index] is not _MISSING:
            raise incompatible_arguments(signature, args, kwargs)
        values[index] = value
    first_default = len(names) - len(defaults)
    for index, value in enumerate(values):
        if value is _MISSING:
            if index < first_default:
                raise incompatible_arguments(signature, args, kwargs)
            values[index] = defaults[index - first_default]
    return values


_MISSING = object()


# --------------------------------------------------------------------------- tensors


def _check_name(name: Any) -> None:
    if not isinstance(name, str):  # Triton's binding refuses a non-str name with a TypeError
        raise TypeError(f"Tensor name must be a str, found type '{type(name).__name__}'")
    if not name:
        raise TritonModelException("Tensor name cannot be an empty string.")


_TENSOR_SIGNATURE = "c_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)"
_FROM_DLPACK_SIGNATURE = "(self: str, arg0: object) -> c_python_backend_utils.Tensor"


class Tensor:
    """A named numpy tensor. ``Tensor(name, array)``; no copy is made of a C-contiguous array.

    As Triton's binding: the two arguments are positional, the array must be a ``numpy.ndarray`` (a list, a
    scalar or None is a ``TypeError``), of a Triton data type in native byte order, bytes (``S``) or objects
    (anything else, unicode ``U`` arrays included: "NumPy dtype is not supported."); a non-contiguous array is
    copied into C order; a ``bytes`` name is decoded.
    """

    __slots__ = ("_name", "_array", "_datatype", "_device")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs or len(args) != 2:
            raise incompatible_arguments(_TENSOR_SIGNATURE, args, kwargs)
        name, array = args
        if type(array) is not np.ndarray:
            if not isinstance(array, np.ndarray):
                raise incompatible_arguments(_TENSOR_SIGNATURE, args, kwargs)
            array = np.asarray(array)  # a subclass (np.matrix...) as the plain array it is: its data, no copy
        if type(name) is not str:
            if isinstance(name, bytes):
                name = name.decode()
            elif not isinstance(name, str):
                raise incompatible_arguments(_TENSOR_SIGNATURE, args, kwargs)
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        dtype = array.dtype
        if dtype not in _SUPPORTED_DTYPES and dtype.kind not in "OS":
            raise TritonModelException("NumPy dtype is not supported.")
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        self._name = name
        self._array = array
        self._datatype: str | None = None
        self._device: DeviceTensor | None = None

    @classmethod
    def _wrap(cls, name: str, array: np.ndarray, datatype: str | None = None) -> "Tensor":
        """Trusted fast path for tensors coming from the engine (already validated)."""
        tensor = object.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._datatype = datatype
        tensor._device = None
        return tensor

    @classmethod
    def _on_device(cls, name: str, device: "DeviceTensor") -> "Tensor":
        """A tensor in GPU memory (from DLPack); ``_array`` is None until ``_host`` copies it."""
        tensor = cls._wrap(name, None, device.datatype)  # type: ignore[arg-type]
        tensor._device = device
        return tensor

    def _host(self) -> np.ndarray:
        """The host array: the tensor's own, or a copy of its GPU memory (a response leaving the model)."""
        if self._array is None:
            assert self._device is not None
            self._array = self._device.to_host()
            self._device = None
        return self._array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        if self._device is not None:
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        return self._writable()

    def _writable(self) -> np.ndarray:
        """The array, copied once if it is a read-only view (a request body's bytes): Triton's stub hands
        models arrays of their own, which they may write into and export with DLPack (numpy refuses to
        export a read-only one)."""
        array = self._array
        if not array.flags.writeable:
            array = self._array = array.copy()
        return array

    def shape(self) -> list[int]:
        if self._device is not None:
            return list(self._device.shape)
        return list(self._array.shape)

    def triton_dtype(self) -> int | None:
        if self._datatype == "BF16":
            return 14
        if self._device is not None:
            return numpy_to_triton_type(self._device.dtype)
        return numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return self._device is None

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the tensor: numpy's for host arrays; our own over GPU memory, and for BF16
        (DLPack's bfloat16 type, which numpy cannot describe)."""
        if self._device is not None:
            from serving_pod.backends import pb_dlpack

            device = self._device
            return pb_dlpack.export(device.ptr, device.shape, device.datatype, pb_dlpack.K_DL_CUDA,
                                    device.device_id, device.keep)
        if self._array.dtype.kind in "OSU":
            raise TritonModelException("DLPack does not have support for string tensors.")
        if self._datatype == "BF16":
            from serving_pod.backends import pb_dlpack

            array = np.ascontiguousarray(self._array)
            return pb_dlpack.export(array.ctypes.data, array.shape, "BF16", pb_dlpack.K_DL_CPU, 0, array)
        try:
            return self._writable().__dlpack__()
        except (BufferError, TypeError) as exc:
            raise TritonModelException(f"Tensor '{self._name}' cannot be exported to DLPack: {exc}") from None

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        if self._device is not None:
            return (2, self._device.device_id)
        return (1, 0)

    @staticmethod
    def from_dlpack(*args: Any, **kwargs: Any) -> "Tensor":
        """Triton's ``from_dlpack(name, dlpack_object)``: a capsule or an object with ``__dlpack__`` and
        ``__dlpack_device__``, in CPU, pinned host or (with cuda-python) CUDA memory. Host memory numpy can import
        is not copied. Other arguments than a str name and one object are pybind11's ``TypeError``, as in Triton."""
        if kwargs or len(args) != 2 or not isinstance(args[0], str):
            raise incompatible_arguments(_FROM_DLPACK_SIGNATURE, args, kwargs, "from_dlpack")
        name, dlpack_object = args
        _check_name(name)
        from serving_pod.backends import pb_dlpack

        try:
            taken = pb_dlpack.take(name, dlpack_object)
        except pb_dlpack.DLPackError as exc:
            raise TritonModelException(str(exc)) from None
        if isinstance(taken, pb_dlpack.DeviceTensor):
            return Tensor._on_device(name, taken)
        array, datatype = taken
        return Tensor(name, array) if datatype is None else Tensor._wrap(name, array, datatype)

    def __repr__(self) -> str:
        if self._device is not None:
            device = self._device
            return f"Tensor({self._name!r}, shape={list(device.shape)}, dtype={device.dtype}, gpu={device.device_id})"
        return f"Tensor({self._name!r}, shape={list(self._array.shape)}, dtype={self._array.dtype})"


def get_input_tensor_by_name(inference_request: "InferenceRequest", name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor._name == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: "InferenceResponse", name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor._name == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict, name: str) -> dict | None:
    for item in model_config.get("input", ()):
        if item["name"] == name:
            return item
    return None


def get_output_config_by_name(model_config: dict, name: str) -> dict | None:
    for item in model_config.get("output", ()):
        if item["name"] == name:
            return item
    return None


def using_decoupled_model_transaction_policy(model_config: dict) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))
