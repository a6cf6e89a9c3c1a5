"""The one error root of the engine, and its single mapping to HTTP and gRPC status codes.

Every layer raises a ``ServerError`` subclass; the HTTP and gRPC adapters translate it with
``http_status`` / ``grpc_code`` from the table below, so the two protocols cannot disagree.
Messages keep Triton's wording where Triton has one (clients and scripts match on it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # grpc is imported lazily: isolated python model processes need not have grpcio
    import grpc


class ServerError(Exception):
    """Base of every error the engine reports to a client."""

    code: ClassVar[str] = "INTERNAL"
    #: the engine refused the request before it was queued: no model could be had for it, or it did not suit the
    #: model (``Engine._admit``), or its scheduler would not queue it (``not_enqueued``). BLS calls, the generate
    #: routes and gRPC streams answer such errors as Triton does.
    refused_before_queue: bool = False
    #: a model answered its request with this error (a python model's ``InferenceResponse(error=...)``): the
    #: execution succeeded, and Triton counts the request a success in its statistics
    sent_as_response: bool = False
    #: the model answered its request with this error after its ``execute`` returned (a python model's response
    #: sender): Triton's python backend counted the request a success when ``execute`` returned, whatever came later
    answered_later: bool = False
    #: the model's execution failed with this error (its backend raised it or returned it for the request), as
    #: opposed to a refusal before the model ran; tritonserver's HTTP front end types these answers text/plain
    in_execution: bool = False
    #: an HTTP inference error tritonserver finds before it parses the body (``http.responses.before_parsing``)
    before_parsing: bool = False
    #: a scheduler took the request into its queue and later answered it with this error instead of running it (a
    #: queue or backlog timeout, ``rejected_from_queue``): tritonserver sends it from the response callback, as it
    #: sends an execution's errors, so its HTTP front end types the answer text/plain
    from_queue: bool = False
    #: the front end found it while writing the model's response (an FP16 output asked for as JSON, an output that
    #: cannot be classified): the model ran and counts a success; tritonserver sends it from the response callback,
    #: so its HTTP front end types the answer text/plain
    writing_response: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgumentError(ServerError):
    code = "INVALID_ARG"


class NotFoundError(ServerError):
    code = "NOT_FOUND"


class UnavailableError(ServerError):
    code = "UNAVAILABLE"


class InternalError(ServerError):
    code = "INTERNAL"


class UnsupportedError(ServerError):
    code = "UNSUPPORTED"


class DecoupledModelError(UnsupportedError):
    """A decoupled model asked for one response (not over a stream); each front end words it as Triton's does."""


class AlreadyExistsError(ServerError):
    code = "ALREADY_EXISTS"


class CancelledError(ServerError):
    code = "CANCELLED"


class UnknownError(ServerError):
    """Triton's TRITONSERVER_ERROR_UNKNOWN (a python model's ``pb_utils.TritonError.UNKNOWN``)."""

    code = "UNKNOWN"


def rejected_from_queue(message: str) -> UnavailableError:
    """An UNAVAILABLE answer to a request its scheduler had queued and dropped unrun (``ServerError.from_queue``)."""
    error = UnavailableError(message)
    error.from_queue = True
    return error


def not_enqueued(error: ServerError) -> ServerError:
    """``error`` marked ``refused_before_queue``: a scheduler would not take the request into its queue (a full
    queue, a sequence request without a correlation id or START). Triton's scheduler ``Enqueue`` returns such an
    error, so ``TRITONSERVER_ServerInferAsync`` fails as for a request refused before its model: on a gRPC stream
    it is named by its id alone and does not end a ``triton_grpc_error`` stream."""
    error.refused_before_queue = True
    return error


def writing_response(error: ServerError) -> ServerError:
    """``error`` marked ``writing_response``: found while the model's response was being written out."""
    error.writing_response = True
    return error


def execution_error(message: str) -> InternalError:
    """An INTERNAL error of a model's execution (``ServerError.in_execution``): its backend failed the requests."""
    error = InternalError(message)
    error.in_execution = True
    return error


class ModelLoadError(ServerError):
    """A model failed to load: bad config, missing files, backend failure."""

    code = "INVALID_ARG"


#: code -> (HTTP status, gRPC status code name). The only place these numbers live.
STATUS_TABLE: dict[str, tuple[int, str]] = {
    "INVALID_ARG": (400, "INVALID_ARGUMENT"),
    "NOT_FOUND": (404, "NOT_FOUND"),
    "UNAVAILABLE": (503, "UNAVAILABLE"),
    "INTERNAL": (500, "INTERNAL"),
    "UNSUPPORTED": (501, "UNIMPLEMENTED"),
    # tritonserver's HTTP front end answers 400 for these three (HttpCodeFromError), gRPC keeps each code
    "ALREADY_EXISTS": (400, "ALREADY_EXISTS"),
    "CANCELLED": (400, "CANCELLED"),
    "UNKNOWN": (400, "UNKNOWN"),
}


def http_status(error: ServerError) -> int:
    return STATUS_TABLE[error.code][0]


def grpc_code(error: ServerError) -> "grpc.StatusCode":
    import grpc

    return grpc.StatusCode[STATUS_TABLE[error.code][1]]


def unknown_model(name: str) -> NotFoundError:
    return NotFoundError(f"Request for unknown model: '{name}' is not found")


def unknown_version(name: str, version: str) -> NotFoundError:
    return NotFoundError(
        f"Request for unknown model: '{name}' version {version} is not found"
    )


def model_not_ready(name: str, version: str | None = None) -> ServerError:
    """Triton's answers for a known model with no READY version: a named version that is loading or failed is
    UNAVAILABLE; with no version asked, the model "has no available versions", which Triton reports as NOT_FOUND."""
    if version:
        return UnavailableError(f"Request for unknown model: '{name}' version {version} is not at ready state")
    return NotFoundError(f"Request for unknown model: '{name}' has no available versions")
