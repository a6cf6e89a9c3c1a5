"""tritonserver's verbose line for each RPC its gRPC front end takes, for both of Ferry's gRPC front ends.

At ``--log-verbose`` 1 and above tritonserver writes ``Process for <rpc>, rpc_ok=1, <n> step START`` as it takes an
RPC (``CommonCallData::Process`` in its ``grpc_server.cc``, ``InferHandler::Process`` for the inference RPCs), then
more lines per step that Ferry does not write (``test_log_lines_triton``). ``RpcLog.started`` writes that line: the
native front end (``grpc.native``) as it starts an RPC's handler; on the grpc.aio one, each unary RPC's method as
``logged_servicer`` registers it, and ``ModelStreamInfer`` (``grpc.service``, an async generator) for its stream.
Either way, one flag check per RPC while the verbose level is 0. Callers check ``logging_settings.VERBOSE`` first.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from serving_pod import logging_settings

log = logging.getLogger("ferry.grpc")

#: tritonserver's names for two RPCs in its verbose lines
_RPC_NAMES = {"TraceSetting": "Trace", "LogSettings": "Logging"}


class RpcLog:
    """One gRPC front end's RPC counts, which number its verbose lines."""

    def __init__(self) -> None:
        #: RPCs started by name
        self.counts: dict[str, int] = {}

    def started(self, method: str) -> None:
        """The line for an RPC taken (``method``: its name, or its ``/package.Service/Method`` path).

        n counts that RPC's calls, as tritonserver's ``CommonCallData`` id does; its inference handlers are named
        ``ModelInferHandler`` and ``ModelStreamInferHandler`` (``context 0, 0``), with n always 0: a release build
        numbers their states with ``NEXT_UNIQUE_ID``, which is 0 under ``NDEBUG`` (``infer_handler.h``)."""
        name = method.rsplit("/", 1)[-1]
        if name == "ModelInfer":
            log.debug("Process for ModelInferHandler, rpc_ok=1, 0 step START")
        elif name == "ModelStreamInfer":
            log.debug("Process for ModelStreamInferHandler, rpc_ok=1, context 0, 0 step START")
        else:
            name = _RPC_NAMES.get(name, name)
            count = self.counts.get(name, 0)
            self.counts[name] = count + 1
            log.debug("Process for %s, rpc_ok=1, %d step START", name, count)


class _Logged:
    """A servicer as the grpc.aio front end registers it: each unary RPC method writes its line first (module
    docstring); a streaming method (an async generator) is the servicer's own."""

    def __init__(self, servicer: Any, rpc_log: RpcLog) -> None:
        self._servicer, self._rpc_log = servicer, rpc_log

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._servicer, name)
        if not inspect.iscoroutinefunction(method):
            return method
        started = self._rpc_log.started

        async def logged(request: Any, context: Any) -> Any:
            if logging_settings.VERBOSE:
                started(name)
            return await method(request, context)

        return logged


def logged_servicer(servicer: Any, rpc_log: RpcLog) -> Any:
    """``servicer`` for the grpc.aio front end, its RPCs logged with ``rpc_log`` (``_Logged``)."""
    return _Logged(servicer, rpc_log)
