"""The one interface every scheduling policy implements (default, dynamic, sequence, ensemble).

The engine validates a request, then hands it to the model's scheduler with ``submit``; the
scheduler decides when and with which other requests it runs, on which instance, and charges
statistics. Schedulers are wired explicitly by ``schedulers.factory.create_scheduler``.
"""

from __future__ import annotations

from typing import Protocol

from serving_pod.core.types import InferRequest, InferResponse


class Scheduler(Protocol):
    """Runs validated requests of one model version."""

    async def submit(self, request: InferRequest) -> InferResponse:
        """Run ``request`` and return its response; raises ``ServerError`` on failure."""
        ...

    def pending(self) -> int:
        """Requests accepted but not yet executing (``nv_inference_pending_request_count``)."""
        ...

    async def drain(self) -> None:
        """Stop accepting new work and wait for everything accepted to finish."""
        ...
