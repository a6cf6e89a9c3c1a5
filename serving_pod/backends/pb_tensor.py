"""Tensors, data types and errors of Ferry's ``triton_python_backend_utils`` (see ``pb_utils``).

``Tensor`` wraps a numpy array without copying; ``Tensor._wrap`` is the trusted fast path the
backend uses for the engine's (already validated) tensors. A read-only view of a request body is
copied once when the model asks for the array (``as_numpy``, ``to_dlpack``), as Triton's stub gives
models arrays of their own. ``TritonError`` is the error value a model attaches to one response;
``TritonModelException`` is what the API raises on misuse.
"""

from __future__ import annotations

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
TRITONSERVER_MEMORY_GPU = 1
TRITONSERVER_MEMORY_CPU = 0

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


class TritonError:
    """An error value a model attaches to one response (``InferenceResponse(error=...)``)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    __slots__ = ("_message", "_code")

    def __init__(self, message: str, code: int = 1) -> None:
        if message is None or code is None:
            raise TypeError("TritonError(message, code): message and code must not be None")
        self._message = str(message)
        self._code = int(code)

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, code={self._code})"


# --------------------------------------------------------------------------- tensors


def _check_name(name: Any) -> None:
    if not isinstance(name, str):  # Triton's binding refuses a non-str name with a TypeError
        raise TypeError(f"Tensor name must be a str, found type '{type(name).__name__}'")
    if not name:
        raise TritonModelException("Tensor name cannot be an empty string.")


class Tensor:
    """A named numpy tensor. ``Tensor(name, array)``; no copy is made."""

    __slots__ = ("_name", "_array", "_datatype", "_device")

    def __init__(self, name: str, numpy_array: Any) -> None:
        _check_name(name)
        if numpy_array is None or isinstance(numpy_array, (str, bytes)):
            # numpy would make a 0-d object array of it: a BYTES scalar "None" the client never asked for
            raise TypeError(f"Tensor '{name}': expected a numpy array, found type '{type(numpy_array).__name__}'")
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        dtype = array.dtype
        kind = dtype.kind
        if kind not in "biufOSU" or (kind == "f" and dtype.itemsize > 8) or not dtype.isnative:
            native = dtype.newbyteorder("=")
            if not dtype.isnative and native in _SUPPORTED_DTYPES:
                array = array.astype(native)
            else:
                raise TritonModelException(
                    f"Tensor '{name}': numpy dtype '{dtype}' has no Triton data type"
                )
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
    def from_dlpack(name: str, dlpack_object: Any) -> "Tensor":
        """Triton's ``from_dlpack``: a capsule or an object with ``__dlpack__`` and ``__dlpack_device__``, in
        CPU, pinned host or (with cuda-python) CUDA memory. Host memory numpy can import is not copied."""
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
