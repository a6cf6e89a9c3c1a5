"""The lines Ferry logs about models and requests, next to NVIDIA Triton 2.51's (scripts and operators grep them).

Ferry and Triton are started from the command line on the same repository (python models, an ensemble over one,
one whose ``initialize`` raises, one whose config does not parse), their log read back entry by entry and compared
by structure: level letter and message, never time, pid or ``file:line``. Each step (a start, a load or unload over
the API, a change the poller sees, a stop) is compared with the entries it produced, as recorded from Triton; the
Ferry half runs by default against those recordings, the Triton half (``-m slow``) checks that they are Triton's.
Within a step entries are compared in order where Triton's order is fixed (a version's ``loading:`` before the
model's ``successfully loaded``, an ensemble's after its composing model's; an ensemble's ``successfully unloaded``
before its composing model's, at an unload and at stop) and as a multiset where it depends on
Triton's threads (concurrent loads at start, the versions a reload retires).

Compared: the lifecycle lines (``loading: m:1``, ``successfully loaded 'm'``, ``successfully unloaded 'm' version
1``, ``failed to load 'm' version 1: ...`` and ``failed to load 'm'``, ``failed to poll model 'm': ...``, ``Poll
failed for model directory 'm'``, an ensemble's ``Invalid argument: ...`` when its composing models fail it,
``Internal: failed to load all models``, the ``Started ...`` lines), the start-up
model table (``| Model | Version | Status |``, in its place before the ``Started`` lines) and options table, and at
``--log-verbose=1`` the request lines (``HTTP request: <method number> <path>``, gRPC's ``Process for <rpc>,
rpc_ok=1, <n> step START`` and, over both, ``[request id: <id>] Infer failed: <message>``), none at level 0: for
requests answered and refused, on Ferry's default front ends and on its ``--http-workers`` processes and
``--grpc-server=grpcio`` front end, which follow a verbose level changed at run time.

Kept different on purpose:
- Backend-internal lines are not copied: the python backend's ``TRITONBACKEND_ModelInstanceInitialize: m_0 (CPU
  device 0)`` (a C API function name), ``ERROR: Failed to create instance: ...`` and ``Failed to initialize Python
  stub: ...`` (Ferry logs a model's failing ``initialize`` with its traceback instead), Triton's CUDA-stream error
  for an ensemble on a machine without CUDA, and the ``Invalid argument: ensemble ... not available`` line Triton
  writes when it tries to load again an ensemble whose composing model is being unloaded.
- A config that does not parse: Triton's line ends ``failed to read text proto from <path>``; Ferry's ends with the
  parser's reason (line, column, the offending text). Compared up to the model directory's name.
- A version that failed: Triton's reason carries the python traceback (``\\n\\nAt:\\n  <file>(6): initialize``, also as
  extra rows of the model table); Ferry's stops at the exception. Compared up to the traceback.
- The options table has no ``pinned_memory_pool_byte_size`` row: Ferry has no pinned memory pool.
- Ferry does not print Triton's empty ``Repository Agent`` and ``Backend`` tables.
- Verbose gRPC lines: only the ``step START`` line of tritonserver's per-RPC state machine (not its ``Ready for
  RPC``, ``step COMPLETE``/``FINISH`` and ``Done for`` lines, nor its request-state and buffer lines).
- Verbose HTTP lines: not tritonserver's core and buffer lines (``Setting state from ...``, ``prepared: ...``,
  ``HTTP using buffer for: ...``). A body that is not JSON: Ferry's ``Infer failed`` line has its parser's words,
  as its answer does. A body over ``--http-max-input-size`` (a limit tritonserver 2.51 does not have: it parses
  the body and its line says why that failed) gets the request line only.
- ``'m' is unchanged since it was loaded: nothing to load`` is Ferry's own line (Triton writes nothing then).
- Triton's poller loads a python model again once after it loaded: the python stub writes ``__pycache__`` into the
  model's directory, which Triton counts as a change of the model. Ferry does not. The tests give both servers
  models with their byte code already compiled (``compileall``), so that only the changes the tests make count.
"""

from __future__ import annotations

import compileall
import contextlib
import json
import os
import py_compile
import queue
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from support.python_models import ADD_SUB_CONFIG, ADD_SUB_ENSEMBLE, ADD_SUB_MODEL
from support.server import free_ports, kill_process_group, write_model
from support.triton import triton_or_skip, triton_repositories

from serving_pod import server as ferry_server
from serving_pod.logging_settings import LogSettings

ROOT = Path(__file__).resolve().parents[2]
SLOW = pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
SERVERS = ["ferry", pytest.param("triton", marks=SLOW)]

ENSEMBLE = ADD_SUB_ENSEMBLE
BROKEN_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("boom in initialize")

    def execute(self, requests):
        return []
'''
FAILING_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise RuntimeError("boom in execute")
'''
BAD_CONFIG = 'name: "badcfg"\nbackend: "python"\nmax_batch_size: 8\ninput [ { name: "X" data_type: TYPE_BOGUS dims: [1] } ]\n'

#: the lifecycle lines compared (module docstring); other entries are not
LIFECYCLE = ("loading: ", "successfully loaded '", "successfully unloaded '", "failed to load '", "failed to poll model '",
             "Poll failed for model directory '", "Invalid argument: ", "Internal: failed to load all models", "Started ")
#: the verbose request lines compared (module docstring)
REQUESTS = re.compile(r"^HTTP request: \d+ |^Process for .* step START$|^\[request id: [^\]]*\] Infer failed: ")
STARTED = [("I", "Started GRPCInferenceService at 0.0.0.0:<port>"), ("I", "Started HTTPService at 0.0.0.0:<port>"),
           ("I", "Started Metrics Service at 0.0.0.0:<port>")]
MODEL_TABLE = ("Model", "Version", "Status")
OPTION_TABLE = ("Option", "Value")
EXTENSIONS = ("classification sequence model_repository model_repository(unload_dependents) schedule_policy "
              "model_configuration system_shared_memory cuda_shared_memory binary_tensor_data parameters statistics "
              "trace logging")
BROKEN = [("I", "loading: broken:1"),
          ("E", "failed to load 'broken' version 1: Internal: RuntimeError: boom in initialize"),
          ("I", "failed to load 'broken'")]
LOADS_ENSEMBLE = [("I", "loading: add_sub:1"), ("I", "successfully loaded 'add_sub'"), ("I", "loading: ens:1"),
                  ("I", "successfully loaded 'ens'")]
RELOADS_ENSEMBLE = LOADS_ENSEMBLE + [("I", "successfully unloaded 'add_sub' version 1"),
                                     ("I", "successfully unloaded 'ens' version 1")]
#: unloading the composing model, or stopping: the ensemble goes first
UNLOADS_ENSEMBLE = [("I", "successfully unloaded 'ens' version 1"), ("I", "successfully unloaded 'add_sub' version 1")]


# --- the log, read back -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    """One log entry: its level letter, its message (decoded), and a table's rows if it is one."""

    letter: str
    message: str
    rows: tuple[tuple[str, ...], ...] = ()


def parse_entries(text: str) -> list[Entry]:
    """Entries of a log in the default format (``LMMDD hh:mm:ss.uuuuuu pid file:line] message``), the lines that
    follow an entry's first line being its own (a table, a traceback)."""
    head = re.compile(r"^([IWE])\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [^\]\s]+\] ?(.*)$")
    entries: list[tuple[str, str, list[str]]] = []
    for line in text.splitlines():
        match = head.match(line)
        if match:
            entries.append((match[1], match[2], []))
        elif entries:
            entries[-1][2].append(line)
    parsed = []
    for letter, message, more in entries:
        if message.startswith('"'):
            message = json.JSONDecoder().raw_decode(message)[0]
        rows = tuple(tuple(cell.strip() for cell in line.strip()[1:-1].split("|")) for line in more
                     if line.startswith("|"))
        parsed.append(Entry(letter, message, rows))
    return parsed


def normalize(message: str) -> str:
    """A message as compared (module docstring): ports, paths and the reasons kept different made alike."""
    message = re.sub(r"at 0\.0\.0\.0:\d+$", "at 0.0.0.0:<port>", message)
    message = re.sub(r"\n\nAt:\n(?:  [^\n]*\n)*", "", message)  # Triton's python traceback
    if message.startswith("Poll failed for model directory '"):
        message = message.split(": ", 1)[0]
    return message


def lifecycle(entries: list[Entry]) -> list[tuple[str, str]]:
    return [(e.letter, normalize(e.message)) for e in entries if not e.rows and e.message.startswith(LIFECYCLE)]


def requests(entries: list[Entry]) -> list[tuple[str, str]]:
    return [(e.letter, e.message) for e in entries if REQUESTS.match(e.message)]


def table(entries: list[Entry], header: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The rows of the table with ``header`` (a cell's continuation rows left out: module docstring)."""
    found = [e.rows for e in entries if e.rows and e.rows[0] == header]
    assert len(found) == 1, f"expected one {header} table, found {len(found)}"
    return [row for row in found[0][1:] if row[0]]


# --- a server from the command line --------------------------------------------------------------------------------
class Server:
    """Ferry (``python -m serving_pod``) or Triton on ``repository``, its log in a file read step by step."""

    def __init__(self, kind: str, repository: Path, log_path: Path, *flags: str) -> None:
        self.kind = kind
        self.http, self.grpc, self.metrics = free_ports(3)
        common = [f"--http-port={self.http}", f"--grpc-port={self.grpc}", f"--metrics-port={self.metrics}",
                  "--allow-gpu-metrics=false", "--exit-timeout-secs=2", *flags]
        if kind == "triton":
            triton = triton_or_skip()
            command, env = triton.command(f"--model-repository={repository}", *common), triton.env
        else:
            command = [sys.executable, "-m", "serving_pod", f"--model-repository={repository}", *common]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 - the server writes it until stop() closes it
        self._offset = 0
        self.process = subprocess.Popen(command, env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT,
                                        start_new_session=True)  # stop() ends Triton's python stubs too

    def read(self) -> str:
        return self.log_path.read_text(errors="replace")

    def step(self, expected: int, action: Callable[[], object] | None = None, *, quiet: float = 0.4,
             timeout: float = 60.0, select: Callable[[list[Entry]], list] = lifecycle) -> list[Entry]:
        """Run ``action``, then wait until the log holds ``expected`` selected entries more and nothing more comes
        for ``quiet`` seconds; the new entries (a server that exits ends the wait)."""
        if action is not None:
            action()
        deadline = time.monotonic() + timeout
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            text = self.read()
            entries = parse_entries(text[self._offset:])
            if len(text) != last:
                last, since = len(text), time.monotonic()
            enough = len(select(entries)) >= expected
            if (enough and time.monotonic() - since >= quiet) or self.process.poll() is not None:
                break
            time.sleep(0.05)
        text = self.read()
        complete = text.rfind("\n", self._offset) + 1  # a partly written last line waits for the next step
        entries = parse_entries(text[self._offset:complete])
        self._offset = complete
        return entries

    def post(self, path: str, body: dict | None = None) -> httpx.Response:
        return httpx.post(f"http://127.0.0.1:{self.http}{path}", json=body, timeout=60)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=20)
        kill_process_group(self.process)  # the process group: whatever the server left behind
        self._log.close()


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    write_model(repo, "add_sub", ADD_SUB_CONFIG, {"1/model.py": ADD_SUB_MODEL})
    write_model(repo, "ens", ENSEMBLE)
    write_model(repo, "broken", ADD_SUB_CONFIG.replace('"add_sub"', '"broken"'), {"1/model.py": BROKEN_MODEL})
    write_model(repo, "badcfg", BAD_CONFIG, {"1/model.py": ADD_SUB_MODEL})
    return repo


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(kind: str, repository: Path, *flags: str) -> Server:
        if kind == "triton":
            repository = triton_repositories([repository])[0]
            compileall.compile_dir(repository, quiet=1)  # module docstring: no __pycache__ written while it serves
            time.sleep(1.1)  # files older than the start by a second: Triton's first poll sees nothing new
        server = Server(kind, repository, tmp_path / f"{kind}-{len(started)}.log", *flags)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def touch_model(repository: Path, name: str) -> None:
    """A newer ``model.py`` (and its byte code, module docstring): the next load (or poll) loads the model again."""
    time.sleep(1.1)  # Triton compares modification times
    model_py = repository / name / "1" / "model.py"
    model_py.write_text(model_py.read_text() + "\n# changed\n")
    py_compile.compile(str(model_py))


def add_model(repository: Path, name: str) -> None:
    """An ``add_sub`` named ``name`` (with its byte code) appears in ``repository`` at once."""
    staging = repository.parent / f"{name}.staging"
    write_model(staging, name, ADD_SUB_CONFIG.replace('"add_sub"', f'"{name}"'), {"1/model.py": ADD_SUB_MODEL})
    compileall.compile_dir(staging, quiet=1)
    os.rename(staging / name, repository / name)


def served_repository(server: Server) -> Path:
    """The repository the server reads (Triton's is a copy: ``support.triton.triton_repositories``)."""
    return Path(next(a for a in server.process.args if a.startswith("--model-repository=")).split("=", 1)[1])


def options_expected(repository: Path, mode: str) -> list[tuple[str, str]]:
    return [("server_id", "triton"), ("server_version", "2.51.0"), ("server_extensions", EXTENSIONS),
            ("model_repository_path[0]", str(repository)), ("model_control_mode", mode),
            ("strict_model_config", "0"), ("model_config_name", ""), ("rate_limit", "OFF"),
            ("min_supported_compute_capability", "6.0"), ("strict_readiness", "1"), ("exit_timeout", "2"),
            ("cache_enabled", "0")]


def options_table(entries: list[Entry], kind: str) -> list[tuple[str, ...]]:
    rows = table(entries, OPTION_TABLE)
    if kind == "triton":  # module docstring: Ferry has no pinned memory pool
        assert ("pinned_memory_pool_byte_size", "268435456") in rows
        rows.remove(("pinned_memory_pool_byte_size", "268435456"))
    return rows


# --- the tables' layout ------------------------------------------------------------------------------------------
_TRACEBACK_PATH = "/work/main/.tools/triton-repositories/tmp_lg_repo_triton_none/broken/1/model.py(6): initialize"
#: tritonserver 2.51's model table (server.cc:674) for a model whose initialize raised: its reason's lines on rows
#: of their own; recorded
TRITON_MODEL_TABLE = """\
+---------+---------+--------------------------------------------------------------------------------------------------+
| Model   | Version | Status                                                                                           |
+---------+---------+--------------------------------------------------------------------------------------------------+
| add_sub | 1       | READY                                                                                            |
| broken  | 1       | UNAVAILABLE: Internal: RuntimeError: boom in initialize                                          |
|         |         |                                                                                                  |
|         |         | At:                                                                                              |
|         |         |   /work/main/.tools/triton-repositories/tmp_lg_repo_triton_none/broken/1/model.py(6): initialize |
| ens     | 1       | READY                                                                                            |
+---------+---------+--------------------------------------------------------------------------------------------------+
"""
#: and with no model (explicit mode, nothing loaded at start)
TRITON_EMPTY_TABLE = """\
+-------+---------+--------+
| Model | Version | Status |
+-------+---------+--------+
+-------+---------+--------+
"""


def test_table_layout_is_tritons() -> None:
    reason = f"UNAVAILABLE: Internal: RuntimeError: boom in initialize\n\nAt:\n  {_TRACEBACK_PATH}\n"
    rows = [("add_sub", "1", "READY"), ("broken", "1", reason), ("ens", "1", "READY")]
    assert ferry_server.table(MODEL_TABLE, rows) == TRITON_MODEL_TABLE
    assert ferry_server.table(MODEL_TABLE, []) == TRITON_EMPTY_TABLE


def test_table_entry_is_raw_after_an_empty_heading(tmp_path: Path) -> None:
    """As tritonserver writes a table: ``file:line] `` then the table's own lines, unescaped, then a blank line; a
    name or reason cannot begin a line of its own outside the table."""
    import logging

    root, ferry = logging.getLogger(), logging.getLogger("ferry")
    kept = list(root.handlers), root.level, ferry.level  # install() takes the root logger over: given back after
    settings = LogSettings(file=str(tmp_path / "log"))
    settings.install()
    try:
        text = ferry_server.table(MODEL_TABLE, [("m\nE1126 00:00:00.000000 1 x.py:1] \"forged\"", "1", "READY")])
        logging.getLogger("ferry.server").info("\n%s", text, extra={"table": True})
    finally:
        root.removeHandler(settings.handler)
        settings.handler.close()
        for handler in kept[0]:
            root.addHandler(handler)
        root.setLevel(kept[1])
        ferry.setLevel(kept[2])
    written = (tmp_path / "log").read_text()
    assert written.split("] ", 1)[1] == "\n" + text + "\n"
    assert all(line[:1] in ("+", "|") for line in text.splitlines())
    assert [e.letter for e in parse_entries(written)] == ["I"]


# --- the steps ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", SERVERS)
def test_explicit_model_control(kind: str, repository: Path, start: Callable[..., Server]) -> None:
    """Explicit mode: nothing loaded at start (empty model table), then loads and unloads over the API."""
    server = start(kind, repository, "--model-control-mode=explicit")
    entries = server.step(3)
    assert lifecycle(entries) == STARTED
    assert table(entries, MODEL_TABLE) == []
    starts = [i for i, e in enumerate(entries) if e.message.startswith("Started ")]
    tables = [i for i, e in enumerate(entries) if e.rows]
    assert max(tables) < min(starts), "the tables come before the Started lines"
    repo = served_repository(server)
    assert options_table(entries, kind) == options_expected(repo, "MODE_EXPLICIT")

    def load(name: str) -> Callable[[], object]:
        return lambda: server.post(f"/v2/repository/models/{name}/load")

    def unload(name: str) -> Callable[[], object]:
        return lambda: server.post(f"/v2/repository/models/{name}/unload")

    assert lifecycle(server.step(2, load("add_sub"))) == LOADS_ENSEMBLE[:2]
    assert lifecycle(server.step(1, unload("add_sub"))) == [("I", "successfully unloaded 'add_sub' version 1")]
    assert lifecycle(server.step(1, load("missing"))) == [
        ("E", "failed to poll model 'missing': model not found in any model repository.")]
    assert lifecycle(server.step(3, load("broken"))) == BROKEN
    assert lifecycle(server.step(1, load("badcfg"))) == [("E", "Poll failed for model directory 'badcfg'")]
    write_model(repo, "ens_missing", ENSEMBLE.replace('"ens"', '"ens_missing"').replace('"add_sub"', '"nothere"'))
    assert lifecycle(server.step(2, load("ens_missing"))) == [
        ("E", "failed to poll model 'nothere': model not found in any model repository."),
        ("E", "Invalid argument: ensemble ens_missing contains models that are not available or ambiguous: nothere")]
    write_model(repo, "ens_broken", ENSEMBLE.replace('"ens"', '"ens_broken"').replace('"add_sub"', '"broken"'))
    assert lifecycle(server.step(4, load("ens_broken"))) == BROKEN + [
        ("E", "Invalid argument: ensemble 'ens_broken' depends on 'broken' which has no loaded version. Model 'broken' "
              "loading failed with error: version 1 is at UNAVAILABLE state: Internal: RuntimeError: boom in "
              "initialize;")]
    assert lifecycle(server.step(4, load("ens"))) == LOADS_ENSEMBLE  # the composing model first, in this order
    touch_model(repo, "add_sub")
    reload = lifecycle(server.step(6, load("add_sub")))
    assert sorted(reload) == sorted(RELOADS_ENSEMBLE)
    assert reload[:2] == LOADS_ENSEMBLE[:2]  # the new version serves before the old one unloads
    assert reload.index(("I", "loading: ens:1")) < reload.index(("I", "successfully loaded 'ens'"))
    unloaded = lifecycle(server.step(3 if kind == "triton" else 2, unload("add_sub")))
    if kind == "triton":  # module docstring: its attempt to load the ensemble again, not copied
        unloaded.remove(("E", "Invalid argument: ensemble ens contains models that are not available or ambiguous: "
                              "add_sub"))
    assert unloaded == UNLOADS_ENSEMBLE
    assert lifecycle(server.step(0, server.stop)) == []  # nothing loaded is left to unload


@pytest.mark.parametrize("kind", SERVERS)
def test_startup_loads_and_failures(kind: str, repository: Path, start: Callable[..., Server]) -> None:
    """Mode none (every model at start, one failing, one refused): the lines, the model table with each version's
    state or failure, ``Internal: failed to load all models``, all before ``Started``; the unloads at stop."""
    server = start(kind, repository, "--exit-on-error=false")
    entries = server.step(len(BROKEN) + len(LOADS_ENSEMBLE) + 2 + len(STARTED))
    lines = lifecycle(entries)
    assert lines[-4:] == [("E", "Internal: failed to load all models"), *STARTED]
    assert sorted(lines[:-4]) == sorted(BROKEN + LOADS_ENSEMBLE + [("E", "Poll failed for model directory 'badcfg'")])
    assert lines.index(("I", "successfully loaded 'add_sub'")) < lines.index(("I", "loading: ens:1"))
    assert table(entries, MODEL_TABLE) == [
        ("add_sub", "1", "READY"), ("broken", "1", "UNAVAILABLE: Internal: RuntimeError: boom in initialize"),
        ("ens", "1", "READY")]
    repo = served_repository(server)
    assert options_table(entries, kind) == options_expected(repo, "MODE_NONE")
    failed = next(i for i, e in enumerate(entries) if e.message == "Internal: failed to load all models")
    assert max(i for i, e in enumerate(entries) if e.rows) < failed
    assert lifecycle(server.step(2, server.stop)) == UNLOADS_ENSEMBLE


@pytest.mark.parametrize("kind", SERVERS)
def test_explicit_load_model_at_start(kind: str, repository: Path, start: Callable[..., Server]) -> None:
    """``--load-model`` of an ensemble and its composing model: loaded in Triton's order, then the table."""
    server = start(kind, repository, "--model-control-mode=explicit", "--load-model=add_sub", "--load-model=ens")
    entries = server.step(len(LOADS_ENSEMBLE) + len(STARTED))
    assert lifecycle(entries) == LOADS_ENSEMBLE + STARTED
    assert table(entries, MODEL_TABLE) == [("add_sub", "1", "READY"), ("ens", "1", "READY")]


@pytest.mark.parametrize("kind", SERVERS)
def test_poll_mode_changes(kind: str, repository: Path, start: Callable[..., Server]) -> None:
    """Poll mode: a model added, a model changed (its ensemble follows), a model removed."""
    shutil.rmtree(repository / "broken")
    shutil.rmtree(repository / "badcfg")
    server = start(kind, repository, "--model-control-mode=poll", "--repository-poll-secs=1")
    repo = served_repository(server)
    entries = server.step(len(LOADS_ENSEMBLE) + len(STARTED), quiet=1.5)
    assert lifecycle(entries) == LOADS_ENSEMBLE + STARTED
    assert options_table(entries, kind) == options_expected(repo, "MODE_POLL")

    assert lifecycle(server.step(2, lambda: add_model(repo, "add_sub2"), quiet=1.5)) == [("I", "loading: add_sub2:1"),
                                                         ("I", "successfully loaded 'add_sub2'")]
    reload = lifecycle(server.step(6, lambda: touch_model(repo, "add_sub"), quiet=1.5))
    assert sorted(reload) == sorted(RELOADS_ENSEMBLE)
    assert reload[:2] == LOADS_ENSEMBLE[:2]
    assert lifecycle(server.step(1, lambda: shutil.rmtree(repo / "add_sub2"), quiet=1.5)) == [
        ("I", "successfully unloaded 'add_sub2' version 1")]


# --- verbose request lines ------------------------------------------------------------------------------------------
def _inputs() -> list[grpcclient.InferInput]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 4], "INT32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.int32))
        inputs.append(tensor)
    return inputs


HTTP_LINES = [("I", f"HTTP request: {number} /v2/health/live") for number in (0, 1, 2, 3, 4, 8, 15, 13)] + [
    ("I", "HTTP request: 0 /v2/models/add_sub"),  # the query left out
    ("I", "HTTP request: 0 /v2/models/add%5Fsub/config"),  # as sent
    ("I", "HTTP request: 0 /v2/models/add_sub/versions/1/stats"),
    ("I", "HTTP request: 0 /nothing/here"),
    ("I", "HTTP request: 2 /v2/models/add_sub/infer"),
    ("I", "HTTP request: 2 /v2/models/add_sub/versions/1/infer"),
    ("I", "HTTP request: 0 /metrics"),  # the metrics endpoint's line is the same
]
GRPC_LINES = [
    ("I", "Process for ModelInferHandler, rpc_ok=1, 0 step START"),
    ("I", "Process for ModelInferHandler, rpc_ok=1, 0 step START"),
    ("I", "Process for ModelInferHandler, rpc_ok=1, 0 step START"),
    ("I", "[request id: <id_unknown>] Infer failed: Request for unknown model: 'nothere' is not found"),
    ("I", "Process for ServerLive, rpc_ok=1, 0 step START"),
    ("I", "Process for ServerLive, rpc_ok=1, 1 step START"),
    ("I", "Process for Logging, rpc_ok=1, 0 step START"),
    ("I", "Process for ModelStreamInferHandler, rpc_ok=1, context 0, 0 step START"),
]


@pytest.mark.parametrize("kind", SERVERS)
def test_verbose_request_lines(kind: str, tmp_path: Path, start: Callable[..., Server]) -> None:
    """At ``--log-verbose=1`` each HTTP request (metrics too) and gRPC call is logged as Triton logs it; once the
    level is 0 again, none is."""
    repo = tmp_path / "verbose"
    write_model(repo, "add_sub", ADD_SUB_CONFIG, {"1/model.py": ADD_SUB_MODEL})
    server = start(kind, repo, "--model-control-mode=explicit", "--load-model=add_sub", "--log-verbose=1")
    server.step(len(LOADS_ENSEMBLE[:2]) + len(STARTED))
    url = f"http://127.0.0.1:{server.http}"
    body = {"inputs": [{"name": n, "shape": [1, 4], "datatype": "INT32", "data": [1, 2, 3, 4]}
                       for n in ("INPUT0", "INPUT1")]}

    def over_http() -> None:
        for method in ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE"):
            # a connection each: Triton answers HEAD with a body, which would break the next answer's framing
            httpx.request(method, url + "/v2/health/live", timeout=30)
        with httpx.Client(timeout=30) as client:
            client.get(url + "/v2/models/add_sub?x=1&y=2")
            client.get(url + "/v2/models/add%5Fsub/config")
            client.get(url + "/v2/models/add_sub/versions/1/stats")
            client.get(url + "/nothing/here")
            assert client.post(url + "/v2/models/add_sub/infer", json=body).status_code == 200
            assert client.post(url + "/v2/models/add_sub/versions/1/infer", json=body).status_code == 200
            client.get(f"http://127.0.0.1:{server.metrics}/metrics")

    assert requests(server.step(len(HTTP_LINES), over_http, select=requests)) == HTTP_LINES

    def over_grpc() -> None:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
        for _ in range(2):
            client.infer("add_sub", _inputs())
        with pytest.raises(Exception, match="unknown model"):
            client.infer("nothere", _inputs())
        client.is_server_live()
        client.is_server_live()
        client.get_log_settings()
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer("add_sub", _inputs())
        assert answers.get(timeout=30)[1] is None
        client.stop_stream()
        client.close()

    assert requests(server.step(len(GRPC_LINES), over_grpc, select=requests)) == GRPC_LINES

    def quiet() -> None:
        assert server.post("/v2/logging", {"log_verbose_level": 0}).status_code == 200
        with httpx.Client(timeout=30) as client:
            client.get(url + "/v2/health/live")
            assert client.post(url + "/v2/models/add_sub/infer", json=body).status_code == 200
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
        client.infer("add_sub", _inputs())
        client.is_server_live()
        client.close()

    assert requests(server.step(1, quiet, select=requests, quiet=0.5)) == [("I", "HTTP request: 2 /v2/logging")]


# --- verbose lines of refused requests, on every front end ----------------------------------------------------------
_SHAPE = ("unexpected shape for input 'INPUT1' for model 'add_sub'. Expected [-1,4], got [1,3]. NOTE: Setting a "
          "non-zero max_batch_size in the model config requires a batch dimension to be prepended to each input "
          "shape. If you want to specify the full shape including the batch dim in your input dims config, try "
          "setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size.")
_INFER = ("I", "HTTP request: 2 /v2/models/add_sub/infer")
#: recorded from tritonserver 2.51 at --log-verbose=1 (``over_http`` below, one request a connection): the request
#: line comes first whatever the answer; ``Infer failed`` follows only where its ``HandleInfer`` error callback
#: answers (a body that does not parse, a refusal by its core), not a refusal before the body is read
REFUSED_HTTP_LINES = [
    _INFER,  # answered
    ("I", "HTTP request: 2 /v2/models/nothere/infer"),  # unknown model: found before the body is read
    ("I", "HTTP request: 2 /v2/models/add_sub/versions/7/infer"),
    _INFER,  # an empty body: a raw binary request that cannot be one
    ("I", "[request id: <id_unknown>] Infer failed: [request id: <id_unknown>] Raw request must only have 1 input "
          "(found 1) to be deduced but got 2 inputs in 'add_sub' model configuration"),
    _INFER,  # Inference-Header-Content-Length past the body
    _INFER,  # Content-Encoding: br
    ("I", "HTTP request: 0 /v2/models/add_sub/infer"),  # GET: 405
    _INFER, ("I", f"[request id: r1] Infer failed: [request id: r1] {_SHAPE}"),
    _INFER, ("I", "[request id: <id_unknown>] Infer failed: [request id: <id_unknown>] expected 2 inputs but got 1 "
                  "inputs for model 'add_sub'. Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. "
                  "Please provide all required input(s)."),
    ("I", "HTTP request: 0 /v2/models/add_sub/config"),  # a restricted API without its header: 403
    ("I", "HTTP request: 2 /v2/models/fails/infer"),  # the model's execute raised: no Infer failed line
]
#: Ferry's own refusal of a body over --http-max-input-size (tritonserver 2.51 has no such limit): its request line
#: only, whichever path read it (a plain content-length, a chunked body, the ASGI path a query takes)
TOO_LARGE_LINES = [_INFER, _INFER, _INFER]
#: recorded from tritonserver 2.51 at --log-verbose=1 (``over_grpc`` below): every stream is ``context 0``
REFUSED_GRPC_LINES = [
    ("I", "Process for ModelInferHandler, rpc_ok=1, 0 step START"),
    ("I", "Process for ModelInferHandler, rpc_ok=1, 0 step START"),
    ("I", "[request id: <id_unknown>] Infer failed: Request for unknown model: 'nothere' is not found"),
    ("I", "Process for ModelInferHandler, rpc_ok=1, 0 step START"),
    ("I", f"[request id: g1] Infer failed: [request id: g1] {_SHAPE}"),
    ("I", "Process for ModelInferHandler, rpc_ok=1, 0 step START"),  # the model's execute raised
    ("I", "Process for ServerLive, rpc_ok=1, 0 step START"),
    ("I", "Process for ServerLive, rpc_ok=1, 1 step START"),
    ("I", "Process for Logging, rpc_ok=1, 0 step START"),
    ("I", "Process for ModelConfig, rpc_ok=1, 0 step START"),  # a restricted protocol without its header
    ("I", "Process for ModelStreamInferHandler, rpc_ok=1, context 0, 0 step START"),
    ("I", "Process for ModelStreamInferHandler, rpc_ok=1, context 0, 0 step START"),
    ("I", "[request id: <id_unknown>] Infer failed: Request for unknown model: 'nothere' is not found"),
    ("I", f"[request id: s1] Infer failed: [request id: s1] {_SHAPE}"),  # not for the stream's 'fails' request
]
#: the front ends: Ferry's default ones, Ferry's protocol workers with its grpc.aio front end, Triton
FRONT_ENDS = [pytest.param("ferry", (), id="ferry"),
              pytest.param("ferry", ("--http-workers=3", "--grpc-server=grpcio"), id="ferry-workers-grpcio"),
              pytest.param("triton", (), id="triton", marks=SLOW)]


def _request_pids(text: str) -> set[str]:
    """The pids that wrote ``HTTP request:`` lines (the protocol workers' and the server's)."""
    return set(re.findall(r"^I\d{4} [\d:.]+ +(\d+) [^\]]+\] \"HTTP request: ", text, re.M))


def _bad_shape(request_id: str) -> dict:
    return {"id": request_id, "inputs": [{"name": n, "shape": [1, 3], "datatype": "INT32", "data": [1, 2, 3]}
                                         for n in ("INPUT0", "INPUT1")]}


@pytest.mark.parametrize(("kind", "flags"), FRONT_ENDS)
def test_verbose_lines_of_refused_requests(kind: str, flags: tuple[str, ...], tmp_path: Path,
                                           start: Callable[..., Server]) -> None:
    """Every inference request gets its ``HTTP request:`` line first, refused or not (an unknown model, a bad
    header, a body over the size limit on any read path, a restricted API); ``Infer failed`` follows for a body
    that does not make a request (<id_unknown>) or a request the engine refuses (its id), not for one refused
    before its body is read.
    Over gRPC each call's ``Process for`` line, then ``Infer failed`` for a refused unary or stream request. The same
    from protocol worker processes and the grpc.aio front end, which follow a verbose level changed at run time."""
    repo = tmp_path / "refused"
    write_model(repo, "add_sub", ADD_SUB_CONFIG, {"1/model.py": ADD_SUB_MODEL})
    write_model(repo, "fails", ADD_SUB_CONFIG.replace('"add_sub"', '"fails"'), {"1/model.py": FAILING_MODEL})
    limit = ("--http-max-input-size=4096",) if kind == "ferry" else ()
    server = start(kind, repo, "--model-control-mode=explicit", "--load-model=add_sub", "--load-model=fails",
                   "--log-verbose=1", *limit,
                   "--http-restricted-api=model-config:k=v", "--grpc-restricted-protocol=model-config:k=v", *flags)
    server.step(2 * len(LOADS_ENSEMBLE[:2]) + len(STARTED))
    url = f"http://127.0.0.1:{server.http}"
    infer = url + "/v2/models/add_sub/infer"
    body = {"inputs": [{"name": n, "shape": [1, 4], "datatype": "INT32", "data": [1, 2, 3, 4]}
                       for n in ("INPUT0", "INPUT1")]}

    def send(method: str, target: str, **kwargs: object) -> int:
        return httpx.request(method, target, timeout=30, **kwargs).status_code  # a connection each (spread)

    def over_http() -> None:
        assert send("POST", infer, json=body) == 200
        assert send("POST", url + "/v2/models/nothere/infer", json=body) == 404
        assert send("POST", url + "/v2/models/add_sub/versions/7/infer", json=body) == 404
        assert send("POST", infer, content=b"") == 400
        assert send("POST", infer, content=b"{}", headers={"Inference-Header-Content-Length": "99"}) == 400
        assert send("POST", infer, content=b"xx", headers={"Content-Encoding": "br"}) == 501
        assert send("GET", infer) == 405
        assert send("POST", infer, json=_bad_shape("r1")) == 400
        assert send("POST", infer, json={"inputs": body["inputs"][:1]}) == 400
        assert send("GET", url + "/v2/models/add_sub/config") == 403
        assert send("POST", url + "/v2/models/fails/infer", json=body) == 500
        if kind == "ferry":  # TOO_LARGE_LINES
            big = b"{" + b" " * 5000 + b"}"
            assert send("POST", infer, content=big) == 400
            assert send("POST", infer, content=iter([big[:2000], big[2000:]])) == 400  # chunked
            assert send("POST", infer + "?via=asgi", content=big) == 400

    expected = REFUSED_HTTP_LINES + (TOO_LARGE_LINES if kind == "ferry" else [])
    assert requests(server.step(len(expected), over_http, select=requests)) == expected
    if "--http-workers=3" in flags:
        assert len(_request_pids(server.read())) > 1, "the workers wrote request lines too"

    def over_grpc() -> None:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc}")
        client.infer("add_sub", _inputs())
        with pytest.raises(Exception, match="unknown model"):
            client.infer("nothere", _inputs())
        bad = [grpcclient.InferInput(n, [1, 3], "INT32").set_data_from_numpy(np.ones((1, 3), np.int32))
               for n in ("INPUT0", "INPUT1")]
        with pytest.raises(Exception, match="unexpected shape"):
            client.infer("add_sub", bad, request_id="g1")
        with pytest.raises(Exception, match="boom in execute"):
            client.infer("fails", _inputs(), request_id="g2")
        client.is_server_live()
        client.is_server_live()
        client.get_log_settings()
        with pytest.raises(Exception, match="This protocol is restricted"):
            client.get_model_config("add_sub")
        answers: queue.Queue = queue.Queue()
        streams = ([("add_sub", _inputs(), "")],
                   [("nothere", _inputs(), ""), ("add_sub", bad, "s1"), ("fails", _inputs(), "s2")])
        for requests_sent in streams:
            client.start_stream(callback=lambda result, error: answers.put((result, error)))
            for model, inputs, request_id in requests_sent:
                client.async_stream_infer(model, inputs, request_id=request_id)
            errors = [answers.get(timeout=30)[1] for _ in requests_sent]
            assert [error is None for error in errors] == [model == "add_sub" and not request_id
                                                           for model, _, request_id in requests_sent]
            client.stop_stream()
        client.close()

    assert requests(server.step(len(REFUSED_GRPC_LINES), over_grpc, select=requests)) == REFUSED_GRPC_LINES

    def level(value: int) -> Callable[[], None]:
        def set_and_send() -> None:
            assert send("POST", url + "/v2/logging", json={"log_verbose_level": value}) == 200
            for _ in range(6):  # a connection each: the workers too
                assert send("POST", infer, json=body) == 200
            assert send("POST", infer, content=b"") == 400
        return set_and_send

    assert requests(server.step(1, level(0), select=requests, quiet=0.5)) == [("I", "HTTP request: 2 /v2/logging")]
    assert requests(server.step(8, level(1), select=requests)) == [_INFER] * 6 + REFUSED_HTTP_LINES[3:5]
