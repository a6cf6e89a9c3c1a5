"""Triton / KServe V2 data types: names, numpy dtypes, byte layouts.

Shared by both protocol codecs, the repository validator and the backends, so every layer
speaks the same vocabulary: wire names (``FP32``), config names (``TYPE_FP32``) and numpy.

Byte layout (the same on HTTP binary data, gRPC raw contents, shared memory and warmup files):
little-endian, row-major, unpadded; BOOL is one byte; BF16 is the upper two bytes of an FP32
(carried here as ``uint16``); a BYTES element is a 4-byte little-endian length then the bytes.
"""

from __future__ import annotations

import struct
from typing import Final

import numpy as np

from serving_pod.core.errors import InvalidArgumentError

#: wire datatype -> numpy dtype. BYTES uses object arrays of ``bytes``; BF16 rides as uint16.
WIRE_TO_NUMPY: Final[dict[str, np.dtype]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BF16": np.dtype("<u2"),
    "BYTES": np.dtype(np.object_),
}

#: numpy dtype -> wire datatype (BF16 cannot be inferred from numpy; it is always explicit).
NUMPY_TO_WIRE: Final[dict[np.dtype, str]] = {
    dtype: name for name, dtype in WIRE_TO_NUMPY.items() if name != "BF16"
}

#: size in bytes of one element, for fixed-size types.
ELEMENT_SIZE: Final[dict[str, int]] = {
    name: dtype.itemsize for name, dtype in WIRE_TO_NUMPY.items() if name != "BYTES"
}

_LEN = struct.Struct("<I")


def config_to_wire(config_type: str) -> str:
    """``TYPE_FP32`` -> ``FP32``; ``TYPE_STRING`` -> ``BYTES``."""
    name = config_type[5:] if config_type.startswith("TYPE_") else config_type
    return "BYTES" if name == "STRING" else name


def wire_to_config(datatype: str) -> str:
    """``FP32`` -> ``TYPE_FP32``; ``BYTES`` -> ``TYPE_STRING``."""
    return "TYPE_STRING" if datatype == "BYTES" else "TYPE_" + datatype


def numpy_dtype(datatype: str) -> np.dtype:
    """Numpy dtype for a wire datatype, or a clear error for an unknown one."""
    try:
        return WIRE_TO_NUMPY[datatype]
    except KeyError:
        raise InvalidArgumentError(f"invalid datatype '{datatype}'") from None


def wire_datatype(array: np.ndarray) -> str:
    """Wire datatype of a numpy array (object and string arrays are BYTES)."""
    kind = array.dtype.kind
    if kind in ("O", "S", "U"):
        return "BYTES"
    try:
        return NUMPY_TO_WIRE[array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype]
    except KeyError:
        raise InvalidArgumentError(f"unsupported numpy dtype '{array.dtype}'") from None


def element_count(shape: tuple[int, ...] | list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count


#: numpy's bound on an array's dimensions: their product (zeros counted as ones) times 16 bytes must fit ``intp``
_MAX_DIMS_PRODUCT: Final[int] = np.iinfo(np.intp).max // 16
#: the most dimensions an array may have (numpy 2; numpy 1 allowed 32)
_MAX_RANK: Final[int] = 64 if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else 32


def check_shape(what: str, shape: tuple[int, ...]) -> None:
    """InvalidArgumentError for a shape numpy cannot hold: too many dimensions, or dimensions whose product
    overflows numpy's index type, e.g. ``[2**62, 2**62, 0]`` (refused even though the zero makes it empty).
    Such a request is the client's error, not a ValueError deep in the server."""
    if len(shape) > _MAX_RANK:
        raise InvalidArgumentError(f"{what}: shape {list(shape)} has more than {_MAX_RANK} dimensions")
    product = 1
    for dim in shape:
        product *= dim or 1
    if product > _MAX_DIMS_PRODUCT:
        raise InvalidArgumentError(f"{what}: shape {list(shape)} has too many elements")


def check_element_count(name: str, shape: tuple[int, ...], got: int) -> int:
    """The element count of ``shape``; InvalidArgumentError when ``got`` elements were sent instead."""
    count = element_count(shape)
    if got != count:
        raise InvalidArgumentError(
            f"unexpected number of elements for input '{name}': shape {list(shape)} needs {count}, "
            f"got {got}"
        )
    return count


def deserialize_bytes(buffer: bytes | memoryview, count: int | None = None) -> np.ndarray:
    """Length-prefixed BYTES elements -> 1-D object array of ``bytes``.

    Raises InvalidArgumentError when the buffer is truncated or holds a different number of
    elements than ``count`` (when given).
    """
    view = memoryview(buffer)
    total = len(view)
    items: list[bytes] = []
    offset = 0
    while offset < total:
        if offset + 4 > total:
            raise InvalidArgumentError("unexpected end of BYTES tensor data: truncated length prefix")
        (length,) = _LEN.unpack_from(view, offset)
        offset += 4
        end = offset + length
        if end > total:
            raise InvalidArgumentError(
                f"unexpected end of BYTES tensor data: element of {length} bytes with "
                f"{total - offset} bytes left"
            )
        items.append(bytes(view[offset:end]))
        offset = end
    if count is not None and len(items) != count:
        raise InvalidArgumentError(
            f"BYTES tensor data holds {len(items)} elements, expected {count}"
        )
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array


def serialize_bytes(array: np.ndarray) -> bytes:
    """Object/str/bytes array -> length-prefixed BYTES layout (row-major)."""
    parts: list[bytes] = []
    for item in array.flat:
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, (bytes, bytearray)):
            item = str(item).encode("utf-8")
        parts.append(_LEN.pack(len(item)))
        parts.append(bytes(item))
    return b"".join(parts)


def from_raw(datatype: str, shape: tuple[int, ...], raw: bytes | memoryview, what: str) -> np.ndarray:
    """Raw little-endian bytes -> numpy array of ``shape``; sizes are checked, not trusted.

    ``what`` names the tensor in errors (e.g. ``input 'INPUT0'``).
    """
    count = element_count(shape)
    if datatype == "BYTES":
        try:
            return deserialize_bytes(raw, count).reshape(shape)
        except InvalidArgumentError as error:  # name the tensor, as Triton does (on the error branch only)
            raise InvalidArgumentError(f"{what}: {error.message}") from None
    dtype = numpy_dtype(datatype)
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise InvalidArgumentError(
            f"{what}: expected {expected} bytes of {datatype} data for shape "
            f"{list(shape)}, got {len(raw)}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def to_raw(datatype: str, array: np.ndarray) -> bytes:
    """Numpy array -> raw little-endian bytes in the wire layout for ``datatype``."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    dtype = WIRE_TO_NUMPY[datatype]
    if array.dtype != dtype:
        array = array.astype(dtype)
    return np.ascontiguousarray(array).tobytes()


def fp32_to_bf16(array: np.ndarray) -> np.ndarray:
    """FP32 array -> BF16 bit patterns (uint16, truncation as Triton's clients do)."""
    return (np.ascontiguousarray(array, dtype="<f4").view("<u4") >> 16).astype("<u2")


def bf16_to_fp32(array: np.ndarray) -> np.ndarray:
    """BF16 bit patterns (uint16) -> FP32 array."""
    return (array.astype("<u4") << 16).view("<f4")
