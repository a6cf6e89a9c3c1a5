"""What the HTTP and gRPC request templates share: an input found at a fixed place of a repeated message.

``http.templates`` (binary requests after a repeated JSON header) and ``grpc.templates`` (``ModelInferRequest``
messages repeated up to their tensor bytes) each keep, per input, where its bytes lie and what the first full
parse found; ``InputTemplate.tensor`` makes the input of a later message from its bytes, as that parse would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from serving_pod.core import datatypes
from serving_pod.core.types import Tensor


@dataclass(frozen=True, slots=True)
class InputTemplate:
    """One input: its bytes are ``size`` bytes at ``offset`` (from a base the template knows); ``dtype`` None for
    BYTES, whose element lengths are in the data and checked every time."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: dict[str, Any]
    offset: int
    size: int
    dtype: np.dtype | None
    count: int

    @classmethod
    def of(cls, tensor: Tensor, offset: int, size: int) -> "InputTemplate":
        """The template of ``tensor`` as a full parse made it, its bytes ``size`` bytes at ``offset``."""
        dtype = None if tensor.datatype == "BYTES" else tensor.data.dtype
        return cls(tensor.name, tensor.datatype, tensor.data.shape, tensor.parameters, offset, size, dtype,
                   tensor.data.size)

    def tensor(self, body: bytes, base: int = 0) -> Tensor:
        """The input of ``body``, whose bytes start at ``base + offset``: a view, no copy (BYTES: checked)."""
        start = base + self.offset
        if self.dtype is None:  # a defect is the model's to refuse, as on a full parse (``core.validation``)
            data, defect = datatypes.decode_raw(self.datatype, self.shape, memoryview(body)[start:start + self.size])
            return Tensor(self.name, self.datatype, data, self.parameters, defect)
        data = np.frombuffer(body, self.dtype, self.count, start).reshape(self.shape)
        return Tensor(self.name, self.datatype, data, self.parameters)
