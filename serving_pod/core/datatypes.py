"""Triton / KServe V2 data types: names, numpy dtypes, byte layouts.

Shared by both protocol codecs, the repository validator and the backends, so every layer
speaks the same vocabulary: wire names (``FP32``), config names (``TYPE_FP32``) and numpy.

Byte layout (the same on HTTP binary data, gRPC raw contents, shared memory and warmup files):
little-endian, row-major, unpadded; BOOL is one byte; BF16 is the upper two bytes of an FP32
(carried here as ``uint16``); a BYTES element is a 4-byte little-endian length then the bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class DataDefect:
    """Tensor data that does not fit its datatype and shape, found while decoding a request.

    Triton's core checks sizes last, once the model's own checks (input count, names, batch, datatype, shape)
    have passed, so a codec does not refuse such a tensor: it gives it a placeholder and this defect, which
    ``Model.validate`` words in Triton's terms at that point (``message``). ``kind``: ``byte_size`` (expected
    and got bytes), ``length_indicator`` (got: bytes left for a 4-byte BYTES length), ``too_many_strings`` (got:
    the element seen past ``expected``), ``too_few_strings``, ``string_data`` (expected: an element's length,
    got: bytes left; the python backend's words in Triton, without the request id, after every other check).
    """

    kind: str
    expected: int = 0
    got: int = 0

    @property
    def late(self) -> bool:
        """Reported after every input passed the core's checks (Triton: by the backend, not the core)."""
        return self.kind == "string_data"

    def message(self, tensor: str, model: str) -> str:
        """Triton 2.51's words, without the ``[request id: ...]`` prefix its core adds (``late`` ones get none)."""
        where = f"for inference input '{tensor}' for model '{model}'"
        if self.kind == "byte_size":
            return (f"input byte size mismatch for input '{tensor}' for model '{model}'. Expected {self.expected}, "
                    f"got {self.got}")
        if self.kind == "length_indicator":
            return (f"incomplete string length indicator {where}, expecting 4 bytes but only {self.got} bytes "
                    "available. Please make sure the string length indicator is in one buffer.")
        if self.kind == "too_many_strings":
            return f"unexpected number of string elements {self.got} {where}, expecting {self.expected}"
        if self.kind == "too_few_strings":
            return f"expected {self.expected} string elements {where}, got {self.got}"
        return (f"incomplete string data for inference input '{tensor}', expecting string of length "
                f"{self.expected} but only {self.got} bytes available")


def count_defect(datatype: str, expected: int, got: int) -> DataDefect:
    """The defect of typed values (JSON ``data``, gRPC ``contents``) that are ``got`` many where the shape holds
    ``expected``: a count of strings for BYTES (Triton's core stops at one past ``expected``), else a byte size."""
    if datatype == "BYTES":
        return (DataDefect("too_many_strings", expected, expected + 1) if got > expected
                else DataDefect("too_few_strings", expected, got))
    size = ELEMENT_SIZE[datatype]
    return DataDefect("byte_size", expected * size, got * size)


def scan_bytes(buffer: bytes | memoryview, count: int | None) -> tuple[list[bytes], DataDefect | None]:
    """Length-prefixed BYTES elements, read as Triton's core reads them (``ValidateBytesInputs``): stop at a
    length prefix cut short or at element ``count + 1``; then too few elements; then (the python backend's
    check) an element longer than the bytes left. The elements, and the first defect found (None if none)."""
    view = memoryview(buffer)
    total = len(view)
    items: list[bytes] = []
    offset = 0
    truncated: DataDefect | None = None
    while offset < total:
        if total - offset < 4:
            return items, DataDefect("length_indicator", 4, total - offset)
        (length,) = _LEN.unpack_from(view, offset)
        if count is not None and len(items) == count:
            return items, DataDefect("too_many_strings", count, count + 1)
        offset += 4
        end = offset + length
        if end > total:
            truncated = DataDefect("string_data", length, total - offset)
            end = total
        items.append(bytes(view[offset:end]))
        offset = end
    if count is not None and len(items) != count:
        return items, DataDefect("too_few_strings", count, len(items))
    return items, truncated


def deserialize_bytes(buffer: bytes | memoryview, count: int | None = None) -> np.ndarray:
    """Length-prefixed BYTES elements -> 1-D object array of ``bytes``.

    Raises InvalidArgumentError when the buffer is truncated or holds a different number of
    elements than ``count`` (when given).
    """
    items, defect = scan_bytes(buffer, count)
    if defect is not None:
        if defect.kind == "length_indicator":
            raise InvalidArgumentError("unexpected end of BYTES tensor data: truncated length prefix")
        if defect.kind == "string_data":
            raise InvalidArgumentError(
                f"unexpected end of BYTES tensor data: element of {defect.expected} bytes with "
                f"{defect.got} bytes left"
            )
        got = defect.got if defect.kind == "too_few_strings" else f"more than {count}"
        raise InvalidArgumentError(f"BYTES tensor data holds {got} elements, expected {count}")
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


#: the 0-d zero each ``placeholder`` of a numpy dtype broadcasts: ``is_placeholder`` knows them by it
_PLACEHOLDER_BASES: dict[np.dtype, np.ndarray] = {}


def placeholder(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    """A read-only array of ``shape`` that holds no memory: the data of a tensor whose bytes come later (shared
    memory) or are refused later (``decode_raw``). An unknown datatype gets bytes (its model refuses it)."""
    dtype = WIRE_TO_NUMPY.get(datatype, np.dtype(np.uint8))
    base = _PLACEHOLDER_BASES.get(dtype)
    if base is None:
        base = _PLACEHOLDER_BASES.setdefault(dtype, np.zeros((), dtype))
    return np.broadcast_to(base, shape)


def is_placeholder(array: np.ndarray) -> bool:
    """Whether ``array`` is a ``placeholder``: its shape is all it holds (a broadcast a model or client made is
    not one)."""
    return array.base is not None and array.base is _PLACEHOLDER_BASES.get(array.dtype)


def decode_raw(datatype: str, shape: tuple[int, ...], raw: bytes | memoryview) -> tuple[np.ndarray, DataDefect | None]:
    """A request input's raw bytes -> its array, or a placeholder and the ``DataDefect`` that refuses it once
    the model's checks pass (Triton's order). An unknown datatype is left to the model's datatype check."""
    if datatype == "BYTES":
        count = element_count(shape)
        items, defect = scan_bytes(raw, count)
        if defect is not None:
            return placeholder(datatype, shape), defect
        array = np.empty(count, dtype=np.object_)
        array[:] = items
        return array.reshape(shape), None
    dtype = WIRE_TO_NUMPY.get(datatype)
    if dtype is None:
        return placeholder(datatype, shape), None
    expected = element_count(shape) * dtype.itemsize
    if len(raw) != expected:
        return placeholder(datatype, shape), DataDefect("byte_size", expected, len(raw))
    return np.frombuffer(raw, dtype=dtype).reshape(shape), None


def to_raw(datatype: str, array: np.ndarray) -> bytes:
    """Numpy array -> raw little-endian bytes in the wire layout for ``datatype``."""
    raw = raw_view(datatype, array)
    return raw if type(raw) is bytes else raw.tobytes()


#: outputs of at least this many bytes are viewed by ``raw_view``, smaller ones copied
VIEW_FROM = 16 * 1024


def raw_view(datatype: str, array: np.ndarray) -> bytes | memoryview:
    """``to_raw`` without its copy where the array already has the wire layout: a byte view of the array's memory
    (a copy for another dtype, a non-contiguous or small array, or BYTES). For a caller that copies the bytes right away
    (into a joined body, a region), so the view never outlives what the array holds now."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    dtype = WIRE_TO_NUMPY[datatype]
    if array.dtype != dtype:
        array = array.astype(dtype)
    if array.nbytes < VIEW_FROM:  # a copy of a few bytes costs less than making the view
        return np.ascontiguousarray(array).tobytes()
    return memoryview(np.ascontiguousarray(array).reshape(-1).view(np.uint8))


def fp32_to_bf16(array: np.ndarray) -> np.ndarray:
    """FP32 array -> BF16 bit patterns (uint16, truncation as Triton's clients do)."""
    return (np.ascontiguousarray(array, dtype="<f4").view("<u4") >> 16).astype("<u2")


def bf16_to_fp32(array: np.ndarray) -> np.ndarray:
    """BF16 bit patterns (uint16) -> FP32 array."""
    return (array.astype("<u4") << 16).view("<f4")
