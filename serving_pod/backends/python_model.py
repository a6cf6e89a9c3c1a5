"""One running Triton ``TritonPythonModel``: load, initialize, execute, finalize.

The in-process python backend uses ``PythonModelInstance`` directly; the isolated mode runs the
very same class inside a child process (``python_stub``). Everything it needs arrives as a
picklable ``ModelSpec`` (no protobuf), so the child does not depend on the server's config code.

Each instance imports its ``model.py`` as a fresh, uniquely named module, so module globals
are per instance (as with Triton's one stub process per instance) and two models that both
ship ``model.py`` or a helper ``utils.py`` next to it never clash. ``async def execute`` runs
on a per-instance event loop in the calling thread; for decoupled models it runs in the
background (as Triton does), so the instance can take the next batch while responses flow.

A non-decoupled model may also return None for a request and answer it later through
``request.get_response_sender()``: ``execute`` then gives a ``concurrent.futures.Future`` for that
request, set when the model sends (``schedulers.instances`` hands it to the caller), and the
instance is free for the next ``execute`` meanwhile, as in Triton.
"""

from __future__ import annotations

import asyncio
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import json
import logging
import os
import re
import sys
import threading
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from serving_pod.backends import pb_utils, python_argv
from serving_pod.backends.pb_metrics import metric_store
from serving_pod.backends.pb_request import (
    RESCHEDULE_REFUSED,
    RESCHEDULED,
    bind_thread,
    binding_type,
    register_module,
    running_model_dir,
    set_serving,
    unregister_module,
)
from serving_pod.backends.base import VersionLoadError, names_network_client
from serving_pod.backends.python_bridge import ResponseLink
from serving_pod.core import errors
from serving_pod.core.types import InferRequest, InferResponse

_log = logging.getLogger(__name__)
_load_lock = threading.Lock()
_counter = itertools.count(1)
#: how long an unload waits for the answers a non-decoupled model still owes through its response senders
UNLOAD_GRACE_S = 5.0


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What an instance needs to know, in plain picklable values."""

    model_name: str
    model_version: str
    model_dir: str
    version_dir: str
    model_file: str
    instance_name: str
    instance_kind: str
    device_id: int
    config_json: str
    decoupled: bool
    output_types: tuple[tuple[str, str], ...]

    def initialize_args(self) -> dict[str, str]:
        """Triton's ``initialize(args)``: every value a string."""
        return {
            "model_config": self.config_json,
            "model_instance_kind": self.instance_kind,
            "model_instance_name": self.instance_name,
            "model_instance_device_id": str(self.device_id),
            "model_repository": self.model_dir,
            "model_version": self.model_version,
            "model_name": self.model_name,
        }


def install_pb_utils() -> None:
    """Make ``import triton_python_backend_utils`` resolve to our module, sibling imports made while a
    model runs find its version directory (``_VersionDirFinder``), and model code see ``sys.argv`` as
    in Triton's stub (``python_argv``)."""
    if sys.modules.get("triton_python_backend_utils") is not pb_utils:
        sys.modules["triton_python_backend_utils"] = pb_utils
    python_argv.install()  # model code reads the stub's ``sys.argv`` (``[""]``), the server keeps its own
    if not any(isinstance(finder, _VersionDirFinder) for finder in sys.meta_path):
        sys.meta_path.append(_VersionDirFinder())


#: top-level module names ``_VersionDirFinder`` found, forgotten once the model call returns
_lazy_imports: set[str] = set()


class _VersionDirFinder(importlib.abc.MetaPathFinder):
    """Triton's stub keeps the version directory on ``sys.path`` for the model's life, so ``import helper``
    inside ``execute`` (or ``unittest.main("model")``) works. Here many models share one process: a
    top-level import made on a thread running model code looks in that model's directory last (after the
    installed packages, as an appended ``sys.path`` entry would), and ``forget_lazy_imports`` drops what it
    found when the call returns, so two models' ``helper`` never clash."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if path is not None or "." in fullname:
            return None
        directory = running_model_dir()
        if not directory:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, [directory])
        if spec is not None:
            _lazy_imports.add(fullname)
        return spec


def forget_lazy_imports() -> None:
    """Drop the modules ``_VersionDirFinder`` imported (the model keeps its own references)."""
    while _lazy_imports:
        sys.modules.pop(_lazy_imports.pop(), None)


#: ``pb_utils`` classes that are bindings in Triton's stub: an AttributeError names them with their module there
_BINDING_MODULES = ("serving_pod.backends.pb_request", "serving_pod.backends.pb_tensor")
_MISSING_ATTRIBUTE = re.compile(r"'(\w+)' object has no attribute ")


def describe(exc: BaseException) -> str:
    """``<type>: <message>`` as Triton's stub words an exception (an attribute missing on a ``pb_utils`` object: its
    class as ``c_python_backend_utils.<name>``, pybind11's type name)."""
    message = str(exc)
    if type(exc) is AttributeError:
        match = _MISSING_ATTRIBUTE.match(message)
        if match is not None and _is_binding(match.group(1), exc):
            message = f"'c_python_backend_utils.{match.group(1)}'{message[match.end(1) + 1:]}"
    return f"{type(exc).__name__}: {message}"


def _is_binding(name: str, exc: AttributeError) -> bool:
    """Whether the object an AttributeError is about is a ``pb_utils`` binding class (the model's own class of the
    same name is not; a refused ``setattr`` names no object: its class name decides)."""
    kind = getattr(pb_utils, name, None)
    if not isinstance(kind, type) or kind.__module__ not in _BINDING_MODULES:
        return False
    obj = getattr(exc, "obj", None)
    return obj is None or type(obj) is kind


#: module name -> the files of the helper modules its import loaded from its own directory (``helper_files``)
_helpers: dict[str, tuple[str, ...]] = {}


def helper_files(module: ModuleType) -> tuple[str, ...]:
    """The files of the modules that importing ``module`` (``load_model_module``) loaded from the model's own
    directory: ``import helper`` or ``from . import helper`` at the top of ``model.py``, and what those import there."""
    return _helpers.get(module.__name__, ())


def load_model_module(model_file: str, search_dir: str, label: str) -> ModuleType:
    """Import ``model_file`` as a new module; helpers beside it stay private to it (``helper_files`` names them).

    No bytecode is written into the model repository (a read-only or polled repository must
    not change because a model was loaded).
    """
    install_pb_utils()
    # Triton imports ``<version>.model``, so ``from . import helper`` works: the module lives in a
    # private package whose ``__path__`` is the version directory (kept until ``unload_module``).
    package_name = f"_ferry_model_{re.sub(r'[^0-9A-Za-z_]', '_', label)}_{next(_counter)}"
    package = ModuleType(package_name)
    package.__path__ = [search_dir]
    package.__package__ = package_name
    name = f"{package_name}.{Path(model_file).stem.replace('.', '_')}"
    spec = importlib.util.spec_from_file_location(name, model_file)
    if spec is None:
        raise ImportError(f"cannot import {model_file}")
    module = importlib.util.module_from_spec(spec)
    with open(model_file, "rb") as handle:
        code = compile(handle.read(), model_file, "exec")
    prefix = os.path.abspath(search_dir) + os.sep
    with _load_lock:
        before = set(sys.modules)
        sys.modules[package_name] = package
        sys.modules[name] = module
        sys.path.insert(0, search_dir)
        saved_flag, sys.dont_write_bytecode = sys.dont_write_bytecode, True
        try:
            exec(code, module.__dict__)
        except BaseException:
            sys.modules.pop(name, None)
            sys.modules.pop(package_name, None)
            raise
        finally:
            sys.dont_write_bytecode = saved_flag
            try:
                sys.path.remove(search_dir)
            except ValueError:
                pass
            helpers = []
            for other in set(sys.modules) - before - {name, package_name}:
                path = getattr(sys.modules[other], "__file__", None) or ""
                if os.path.abspath(path).startswith(prefix):
                    if path.endswith(".py"):  # source to read (an extension module's is not)
                        helpers.append(path)
                    del sys.modules[other]
    _helpers[name] = tuple(sorted(helpers))
    return module


def unload_module(module: ModuleType | None) -> None:
    """Forget a module of ``load_model_module`` and its private package."""
    if module is None:
        return
    _helpers.pop(module.__name__, None)
    if sys.modules.get(module.__name__) is module:
        del sys.modules[module.__name__]
    package = module.__name__.rpartition(".")[0]
    if package.startswith("_ferry_model_"):
        sys.modules.pop(package, None)
        python_argv.forget(package)


def settle_later(later: Future, answer: Any) -> None:
    """Set the future of an answer given later through a response sender (``PythonModelInstance._answer_later``, an
    isolated child's ``answer`` message), unless its caller went away (cancelled) or it is set."""
    try:
        later.set_result(answer)
    except InvalidStateError:
        pass


def unloaded_before_answer(model_name: str) -> errors.UnavailableError:
    """The answer, at unload, to a request the model still owes through its response sender (Triton leaves the
    client waiting and the model UNLOADING for good)."""
    return errors.UnavailableError(
        f"model '{model_name}' was unloaded before it sent a response through the response sender of this request"
    )


class _BackgroundLoop:
    """An event loop on its own daemon thread (decoupled ``async def execute``, or the instance's own loop once
    an ``async def execute`` left tasks running: they go on between executions, as on Triton's stub loop)."""

    def __init__(self, name: str, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop if loop is not None else asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


class PythonModelInstance:
    """A loaded ``TritonPythonModel`` answering ``execute(list[InferRequest])``.

    Non-decoupled models: returns one ``InferResponse`` or ``ServerError`` per request, or a ``Future`` of one
    for a request the model answers later through its response sender (``_answer_later``).
    Decoupled models: returns a list of ``None`` (one per request) — every response, and any
    error raised by ``execute``, goes through each request's ``responder``; a request
    without a responder gets an ``UnsupportedError`` in the list instead.
    """

    def __init__(self, spec: ModelSpec, engine: Any = None) -> None:
        self._spec = spec
        self._engine = engine
        self._link = ResponseLink(spec.model_name, spec.model_version, spec.decoupled, spec.output_types)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: _BackgroundLoop | None = None
        self._closed = False
        #: answers a non-decoupled model owes through its response senders (``_answer_later``)
        self._later: set[Future] = set()
        self._later_lock = threading.Lock()
        self._module: ModuleType | None = None
        try:
            self._module = load_model_module(spec.model_file, spec.version_dir, spec.instance_name)
        except BaseException as exc:  # a model's sys.exit() or KeyboardInterrupt fails its load, not the server
            _log.exception("python model '%s': importing %s failed", spec.model_name, spec.model_file)
            raise VersionLoadError(describe(exc)) from None  # Triton's words: the bare exception (traceback: log)
        self._owner = self._module.__name__  # unique per instance: owns its custom metric families
        register_module(self._owner, engine, spec.version_dir, spec.instance_name, spec.model_name)
        try:
            self._model = self._instantiate()
        except BaseException:
            self._release()
            unload_module(self._module)
            raise
        set_serving(self._owner, True)
        self._execute = self._model.execute
        self.inline_safe, self.suspends_on_engine = self._where_it_may_run()
        #: ``sequence_batching { iterative_sequence: true }``: a request released with RESCHEDULE runs again
        self._iterative = bool(json.loads(spec.config_json).get("sequence_batching", {}).get("iterative_sequence"))

    #: source fragments of models that call back into the engine (BLS, model loading) or stream responses
    _ENGINE_CALLS = (".exec(", "async_exec", "InferenceRequest(", "get_response_sender", "load_model(")
    #: source fragments of models that may block on something but the engine (another thread, a process) or answer
    #: through a response sender: their executions stay on the instance's thread
    _THREAD_CALLS = ("thread", "Thread", "concurrent", "multiprocessing", "subprocess", "asyncio", "get_response_sender",
                     "async_exec")

    def _where_it_may_run(self) -> tuple[bool, bool]:
        """(inline_safe, suspends_on_engine) as ``schedulers/instances.py`` reads them, from a synchronous
        ``execute``'s source (``model.py`` and the helper modules its import loaded from its directory): inline-safe
        when it makes no BLS call (nothing it does waits on the engine), suspendable on the loop thread
        (``core/suspend.py``) when it calls the engine but blocks on nothing else (no threads, processes or event
        loops of its own, no response sender). A decoupled model's response
        sender does not count: its ``send`` only queues the response for the loop, so a quick decoupled model
        streams from the loop thread too (its responses go out when ``execute`` returns or suspends, which the
        pool's wall-time judgement keeps short). A model that names a network client (it may call this server
        over HTTP or gRPC) is neither."""
        if asyncio.iscoroutinefunction(self._execute):
            return False, False
        files = (self._spec.model_file, *(helper_files(self._module) if self._module is not None else ()))
        try:
            source = "\n".join(Path(file).read_text(encoding="utf-8") for file in files)
        except (OSError, UnicodeDecodeError):
            return False, False
        if names_network_client(source):  # it may call this server over HTTP or gRPC (backends/base.py)
            return False, False
        engine_calls, thread_calls = self._ENGINE_CALLS, self._THREAD_CALLS
        if self._link.decoupled:  # its sender only queues each response for the loop: sending never waits
            engine_calls = tuple(f for f in engine_calls if f != "get_response_sender")
            thread_calls = tuple(f for f in thread_calls if f != "get_response_sender")
        if not any(fragment in source for fragment in engine_calls):
            return True, False
        return False, not any(fragment in source for fragment in thread_calls)

    def on_resume(self) -> None:
        """Before an execution suspended on the loop thread goes on: its thread state again (other models ran)."""
        bind_thread(self._engine, self._spec.version_dir, self._owner)

    def _instantiate(self) -> Any:
        spec = self._spec
        model_class = getattr(self._module, "TritonPythonModel", None)
        if model_class is None:
            raise VersionLoadError(f"python model '{spec.model_name}': {spec.model_file} does not define class "
                                   "TritonPythonModel")
        bind_thread(self._engine, spec.version_dir, self._owner)
        try:
            model = model_class()
            if not callable(getattr(model, "execute", None)):
                raise errors.ModelLoadError(
                    f"Python model {spec.model_file} does not implement `execute` method."
                )
            initialize = getattr(model, "initialize", None)
            if initialize is not None:
                self._await(initialize(spec.initialize_args()))
        except errors.ModelLoadError:
            raise
        except BaseException as exc:
            _log.exception("python model '%s': initialize failed", spec.model_name)
            raise VersionLoadError(describe(exc)) from None  # Triton's words: the bare exception (traceback: log)
        finally:
            forget_lazy_imports()
        return model

    # ------------------------------------------------------------------ execute
    def execute(self, requests: list[InferRequest]) -> list[Any]:
        bind_thread(self._engine, self._spec.version_dir, self._owner)
        if self._link.decoupled:
            return self._execute_decoupled(requests)
        link = self._link
        wrap = pb_utils.InferenceRequest._from_domain
        pb_requests = [wrap(request, link) for request in requests]
        count = len(requests)
        try:
            result = self._execute(pb_requests)
            if type(result) is not list and asyncio.iscoroutine(result):
                result = self._run(result)
        except BaseException as exc:  # KeyboardInterrupt too: a model's exception fails its requests only
            return self._fail_all(count, exc)
        finally:
            if _lazy_imports:
                forget_lazy_imports()
        if type(result) is not list:
            if result is None:  # Triton 2.51 waits for ever here; each request is answered by its sender or fails
                result = [None] * count
            else:  # a tuple too, as Triton's stub
                return self._fail_all(
                    count, f"Expected a list in the execute return, found type '{binding_type(result)}'."
                )
        if len(result) != count:
            return self._fail_all(
                count,
                "Number of InferenceResponse objects do not match the number of InferenceRequest "
                f"objects. InferenceRequest(s) size is:{count}, and InferenceResponse(s) size "
                f"is:{len(result)}\n",  # Triton's message ends its line
            )
        for response, pb_request in zip(result, pb_requests):  # Triton fails the whole call, in its words
            if response is not None and pb_request._rescheduled():
                return self._fail_all(
                    count,
                    "Expected a None object in the execute function return list for reschduled request, "
                    f"found type '{binding_type(response)}'.",  # sic: Triton's spelling
                )
            if response is not None and not isinstance(response, pb_utils.InferenceResponse):
                return self._fail_all(
                    count,
                    "Expected an 'InferenceResponse' object in the execute function return list, "
                    f"found type '{binding_type(response)}'.",
                )
        to_domain = link.to_domain
        answers: list[InferResponse | errors.ServerError | Future] = []
        for request, pb_request, response in zip(requests, pb_requests, result):
            if pb_request._rescheduled():
                answers.append(self._rescheduled())
                continue
            sender = pb_request._sender
            if response is None and sender is not None and pb_request._result is None:
                later = self._answer_later(request, pb_request, sender)
                if later is not None:
                    answers.append(later)
                    continue
            if pb_request._result is not None:  # a response sent before one returned wins (Triton)
                if response is not None and not sender._closed:
                    answers.append(self._answered_twice())
                    continue
                response = pb_request._result
            if response is None:
                answers.append(errors.InternalError(
                    f"python model '{self._spec.model_name}' returned no response for request '{request.id}'"
                ))
                continue
            answers.append(to_domain(request, response))
        self._released(pb_requests)
        return answers

    def _answered_twice(self) -> errors.ServerError:
        """A response sent without the final flag and another returned for the same request: Triton's stub refuses
        the second (logged) and its front ends fail the request (gRPC: these words; HTTP: a 500)."""
        _log.error("Failed to process the request(s) for model '%s', message: Unable to send response. "
                   "Non-decoupled model cannot send more than one response.", self._spec.instance_name)
        return errors.InternalError("expected a single response, got 2")

    def _answer_later(self, request: InferRequest, pb_request: pb_utils.InferenceRequest, sender: Any) -> Future | None:
        """A non-decoupled ``execute`` returned None after taking a response sender: the answer comes when the model
        sends it, and as in Triton the instance is free for the next ``execute`` meanwhile. A future of the domain
        answer (set on the sending thread; cancelled by the caller when its client goes away), or None when the answer
        is in already. An unload answers what is still owed after ``UNLOAD_GRACE_S`` (``close``)."""
        later: Future = Future()
        link = self._link

        def answered() -> None:
            try:
                answer: Any = link.to_domain(request, pb_request._result)
            except Exception as exc:  # never into the model's send()
                answer = errors.InternalError(f"python model '{self._spec.model_name}': {describe(exc)}")
            settle_later(later, answer)

        with self._later_lock:
            self._later.add(later)
        later.add_done_callback(self._forget)
        if not sender.when_answered(answered):
            self._forget(later)
            return None
        return later

    def _forget(self, later: Future) -> None:
        with self._later_lock:
            self._later.discard(later)

    def _fail_later(self) -> None:
        """At unload: answer, with a clear error, what the model still owes through its response senders (Triton
        leaves the client waiting and the model UNLOADING for good)."""
        with self._later_lock:
            owed, self._later = list(self._later), set()
        for later in owed:
            settle_later(later, unloaded_before_answer(self._spec.model_name))

    def _message(self, exc: BaseException | str) -> str:
        """Triton's wording; a misuse the backend found (a ``str``) carries no exception type."""
        detail = exc if isinstance(exc, str) else describe(exc)
        return f"Failed to process the request(s) for model '{self._spec.instance_name}', message: {detail}"

    def _fail_all(self, count: int, exc: BaseException | str) -> list[Any]:
        message = self._message(exc)
        _log.error("%s", message, exc_info=None if isinstance(exc, str) else exc)
        return [errors.execution_error(message) for _ in range(count)]

    def _execute_decoupled(self, requests: list[InferRequest]) -> list[Any]:
        answers: list[Any] = [None] * len(requests)
        link = self._link
        pb_requests = []
        for index, request in enumerate(requests):
            if request.responder is None:
                answers[index] = errors.UnsupportedError(
                    f"model '{self._spec.model_name}' is decoupled: its responses can only be "
                    "delivered over a stream"
                )
            else:
                pb_requests.append(pb_utils.InferenceRequest._from_domain(request, link))
        if not pb_requests:
            return answers
        try:
            result = self._execute(pb_requests)
            if asyncio.iscoroutine(result):
                self._released(pb_requests)  # it runs on after execute returned: flags it sets come too late (Triton)
                future = self._background_loop().submit(result)
                future.add_done_callback(lambda f: self._background_done(f, pb_requests))
            elif result is not None:
                failure = self._fail_open(pb_requests, self._returned_a_value())
                return [failure if answer is None else answer for answer in answers]
            elif any(pb_request._rescheduled() for pb_request in pb_requests):  # only before execute returns
                rescheduled = {id(r._domain) for r in pb_requests if r._rescheduled()}
                answers = [self._rescheduled() if id(request) in rescheduled else answer
                           for request, answer in zip(requests, answers)]
            self._released(pb_requests)
        except BaseException as exc:
            failure = self._fail_open(pb_requests, exc)
            return [failure if answer is None else answer for answer in answers]
        finally:
            if _lazy_imports:
                forget_lazy_imports()
        return answers

    def _released(self, pb_requests: list[pb_utils.InferenceRequest]) -> None:
        """The release flags were read (``execute`` returned): a RESCHEDULE set later is only warned about."""
        for pb_request in pb_requests:
            pb_request._release(self._spec.instance_name)

    def _rescheduled(self) -> Any:
        """The answer for a request released with RESCHEDULE: queued again by an iterative sequence batcher;
        elsewhere Triton's error (Triton 2.51 leaves such a request unanswered: its client hangs)."""
        if self._iterative:
            return RESCHEDULED
        return errors.InvalidArgumentError(RESCHEDULE_REFUSED)

    def _background_done(self, future: Any, pb_requests: list[pb_utils.InferenceRequest]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            self._fail_open(pb_requests, exc)
        elif future.result() is not None:
            self._fail_open(pb_requests, self._returned_a_value())

    def _returned_a_value(self) -> str:
        """Triton's wording (instance name, no exception type) for a decoupled execute that returns a value."""
        return (f"Python model '{self._spec.instance_name}' is using the decoupled mode and the "
                "execute function must return None.")

    def _fail_open(self, pb_requests: list[pb_utils.InferenceRequest], exc: BaseException | str) -> errors.ServerError:
        """Deliver a final error to every request whose sender is still open (``exc``: as ``_message``).

        Returns the error: an ``execute`` that failed before returning fails all its requests in the statistics
        too, as in Triton (the responders have already delivered it: the engine does not send it again).
        """
        message = self._message(exc)
        _log.error("%s", message, exc_info=None if isinstance(exc, str) else exc)
        for pb_request in pb_requests:
            sender = pb_request.get_response_sender()
            with sender._lock:
                if sender._closed:
                    continue
                sender._closed = True
            try:
                pb_request._domain.responder(errors.InternalError(message), True)
            except Exception:
                _log.exception("python model '%s': delivering an error failed", self._spec.model_name)
        return errors.InternalError(message)

    # ------------------------------------------------------------------ coroutines
    def _run(self, coro: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            background = self._background
            if background is not None and background.loop is self._loop:  # see _keep_running
                return background.submit(coro).result()
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.new_event_loop()
            result = loop.run_until_complete(coro)
            if background is None and asyncio.all_tasks(loop):
                self._keep_running(loop)
            return result
        # Called from inside a running loop: run_until_complete is impossible on this thread.
        return self._background_loop().submit(coro).result()

    def _keep_running(self, loop: asyncio.AbstractEventLoop) -> None:
        """An ``async def execute`` left tasks behind (one may answer through a response sender later): Triton's
        stub loop runs them on between executions, so from now on this instance's loop runs on a thread of its
        own and ``_run`` hands it each coroutine."""
        self._background = _BackgroundLoop(f"python-model-{self._spec.instance_name}", loop)

    def _await(self, value: Any) -> Any:
        return self._run(value) if asyncio.iscoroutine(value) else value

    def _background_loop(self) -> _BackgroundLoop:
        if self._background is None:
            self._background = _BackgroundLoop(f"python-model-{self._spec.instance_name}")
        return self._background

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Call ``finalize`` (if defined) once; errors are logged, never raised."""
        if self._closed:
            return
        self._closed = True
        if self._later:  # answers still owed through response senders: the model may send them a little later
            wait_futures(list(self._later), timeout=UNLOAD_GRACE_S)
        bind_thread(self._engine, self._spec.version_dir, self._owner)
        set_serving(self._owner, False)
        finalize = getattr(self._model, "finalize", None)
        if finalize is not None:
            try:
                self._await(finalize())
            except BaseException:
                _log.exception("python model '%s': finalize failed", self._spec.model_name)
            finally:
                forget_lazy_imports()
        self._fail_later()  # finalize may still have sent some
        background = self._background
        if background is not None:
            background.stop()
        if self._loop is not None and (background is None or background.loop is not self._loop):
            self._loop.close()
        self._release()
        unload_module(self._module)

    def _release(self) -> None:
        """Forget the module's context; its metric families leave /metrics (as the model unloads)."""
        unregister_module(self._owner)
        metric_store(self._engine).release(self._owner)
