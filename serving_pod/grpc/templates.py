"""Parsed ``ModelInferRequest`` messages, kept by their bytes up to the tensor data: the gRPC codec's fast path.

A client sends the same message with every request of a stream but for the tensor bytes: the same model,
inputs, shapes, datatypes and requested outputs (perf_analyzer, tritonclient with ``raw_input_contents``, a
service calling one model). Protobuf writes fields in number order, and ``raw_input_contents`` (field 7) is
the message's last, so such a message is a fixed *prefix* followed by one ``raw_input_contents`` entry per
input (tag, length, bytes). ``decode_serialized`` parses and checks a message once; when a message of the
same size starts with the same prefix and its entries have the same tags and lengths, the request is made
from what that parse found, each input a zero-copy view of the message's bytes, skipping the protobuf
objects and the per-field checks (about 14 against 3 µs per request here). A request built so is equal to
one the full parse gives.

Only messages that decoded without error become templates, and only when every input's data is in
``raw_input_contents`` (no typed ``contents``, no shared memory), the ``id`` is empty (a client numbering
its requests makes every prefix unique), so a built request's id is always empty, and the prefix parses on
its own without tensor data (the entries are the message's own, not the end of a field that spans them). The
table is process-wide, like ``http.templates``: a template depends on nothing but the bytes. It holds at most
``MAX_TEMPLATES`` prefixes of at most ``MAX_PREFIX_BYTES`` each and is emptied when full.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from serving_pod.core.templates import InputTemplate
from serving_pod.core.types import InferRequest, RequestedOutput

MAX_TEMPLATES = 256
MAX_PREFIX_BYTES = 4096
_RAW_INPUT_TAG = b"\x3a"  # field 7 (raw_input_contents), wire type 2 (length-delimited)


def varint(value: int) -> bytes:
    """Protobuf's base-128 encoding of an unsigned integer (lengths of length-delimited fields)."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@dataclass(frozen=True, slots=True)
class RequestTemplate:
    """What a successful parse of one message found; ``build`` turns a message with its prefix into a request."""

    prefix: bytes
    model_name: str
    model_version: str
    #: each input's bytes (``offset`` from the message's start) and, before them, its entry's tag and length
    inputs: tuple[InputTemplate, ...]
    heads: tuple[bytes, ...]
    outputs: tuple[tuple[str, dict[str, Any]], ...] | None
    parameters: dict[str, Any]

    def build(self, body: bytes) -> InferRequest | None:
        """The request for ``body`` (already known to be this template's size), or None when it is not one."""
        if not body.startswith(self.prefix):
            return None
        for spec, head in zip(self.inputs, self.heads):
            if body[spec.offset - len(head):spec.offset] != head:
                return None
        inputs = [spec.tensor(body) for spec in self.inputs]
        outputs = None if self.outputs is None else [RequestedOutput(name, params) for name, params in self.outputs]
        # the parameters are copied: the front end adds forwarded headers to a request's own
        return InferRequest(self.model_name, self.model_version, inputs, outputs, "", dict(self.parameters))


#: message size -> the templates of that size (a few: models whose messages happen to be as long)
_templates: dict[int, list[RequestTemplate]] = {}


def lookup(body: bytes) -> InferRequest | None:
    """The request a known template makes of ``body``, or None (then the full parse)."""
    candidates = _templates.get(len(body))
    if candidates is not None:
        for template in candidates:
            request = template.build(body)
            if request is not None:
                return request
    return None


def learn(body: bytes, message: pb.ModelInferRequest, request: InferRequest) -> None:
    """Keep a template of ``body`` (``message`` and ``request``: what the full parse made of it) if it can be one."""
    raw = message.raw_input_contents
    if request.id or not raw or len(raw) != len(request.inputs):
        return
    heads = [_RAW_INPUT_TAG + varint(len(data)) for data in raw]
    prefix_size = len(body) - sum(len(head) + len(data) for head, data in zip(heads, raw))
    if not 0 <= prefix_size <= MAX_PREFIX_BYTES:
        return
    inputs = []
    offset = prefix_size
    for tensor, head, data in zip(request.inputs, heads, raw):
        offset += len(head)
        # the entries must be where protobuf's field order puts them, else this message is not a template
        if body[offset - len(head):offset + len(data)] != head + data or "shared_memory_region" in tensor.parameters:
            return
        inputs.append(InputTemplate.of(tensor, offset, len(data)))
        offset += len(data)
    if not _whole_fields(body[:prefix_size]):
        return
    outputs = None
    if request.outputs is not None:
        if any("shared_memory_region" in out.parameters for out in request.outputs):
            return
        outputs = tuple((out.name, out.parameters) for out in request.outputs)
    if sum(len(group) for group in _templates.values()) >= MAX_TEMPLATES:
        clear()
    template = RequestTemplate(body[:prefix_size], request.model_name, request.model_version, tuple(inputs),
                               tuple(heads), outputs, dict(request.parameters))
    _templates.setdefault(len(body), []).append(template)


def _whole_fields(prefix: bytes) -> bool:
    """Whether ``prefix`` is complete fields without ``raw_input_contents``, so that the entries after it are the
    message's. Bytes equal to the entries can also end another field that spans them (an unknown field, a
    string): that message's data is elsewhere, and a template of it would answer with the wrong bytes."""
    try:
        return not pb.ModelInferRequest.FromString(prefix).raw_input_contents
    except DecodeError:
        return False


def clear() -> None:
    """Forget every template (tests, and a full table)."""
    _templates.clear()
