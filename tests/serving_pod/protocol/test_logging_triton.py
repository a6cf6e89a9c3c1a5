"""Logging extension next to NVIDIA Triton 2.51: ``/v2/logging``, the ``LogSettings`` RPC and what is logged.

The same updates go to Triton (CPU, python backend; ``support.triton``) and to Ferry, in one sequence per
protocol; each answer is compared with the settings read back after it. The expected answers were recorded from
Triton (``TRITON_HTTP``, ``TRITON_GRPC``); the slow tests check that Triton still gives them. Log files are
compared by structure (Triton's own L0_logging regular expressions), never by time, pid or line number: the
python model's ``pb_utils.Logger`` entries, their levels, formats and escaped messages, after updates of the
format, the level switches and the verbose level.

Ferry differs on purpose (``FERRY_DIFFERS``):

* a value of the wrong JSON type is 400 with Ferry's words; tritonserver answers 500 "attempt to access JSON
  non-boolean as boolean" (a server error for a client's mistake);
* an unknown key (``{"log_verbose": 1}``, a typo) is 400 "unknown log setting"; tritonserver ignores it and
  answers 200, changing nothing, silently; a body that is not a JSON object is 400, where tritonserver takes
  ``[]``, ``1`` or ``"x"`` as "no change";
* a verbose level above 2147483647 is refused (400 / INVALID_ARGUMENT); tritonserver's level is an int32 and
  it answers 200 with the level read back as 0 (its ``--log-verbose`` refuses such levels);
* a malformed body is 400 (tritonserver: 500 with rapidjson's words); an empty body reads the settings, where
  tritonserver refuses it (500 "The document is empty"), as every Ferry route takes an empty body as ``{}``;
* ``--log-verbose=-1`` is refused at start; tritonserver starts with level 0;
* a log file that cannot be opened: both log to the console and read back ``log_file`` as "", Ferry also says why.

Not compared here: the server's own entries around a model load (tritonserver's ``loading: logger:1``,
``successfully loaded 'logger'``, ``successfully unloaded 'logger' version 1``, ``failed to poll model ...``)
are the registry's words, not the logging extension's; only the model's ``pb_utils.Logger`` entries are.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from support.cli import refusal
from support.server import ServerThread, free_ports, make_options, wait_ready, write_model
from support.triton import triton_or_skip, triton_repositories

from serving_pod import cli
from serving_pod.logging_settings import LogSettings

ESCAPE_VARIABLE = "TRITON_SERVER_ESCAPE_LOG_MESSAGES"  # "0": messages written as they are
#: tritonserver's L0_logging regular expressions for one entry (its test of the formats)
DEFAULT_RECORD = re.compile(r"(?P<level>\w)(?P<month>\d{2})(?P<day>\d{2}) (?P<timestamp>\d{2}:\d{2}:\d{2}\.\d{6}) "
                            r"(?P<pid>\d+) (?P<file>[\w\.]+):(?P<line>\d+)] (?P<message>.*)", re.DOTALL)
ISO8601_RECORD = re.compile(r"(?P<ISO8601_timestamp>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z) (?P<level>\w+) "
                            r"(?P<pid>\d+) (?P<file>.+):(?P<line>\d+)] (?P<message>.*)", re.DOTALL)

#: a python model that logs at every level in initialize, with a quote, a newline, UTF-8 and an escape
LOGGER_CONFIG = """
name: "logger"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
LOGGER_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info('info "quoted" one\\ntwo \\u00e9 \\x1b[31m')
        pb_utils.Logger.log_warn("a warning")
        pb_utils.Logger.log_error("an error")
        pb_utils.Logger.log_verbose("a verbose message")

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(
            r, "IN").as_numpy())]) for r in requests]
'''

RESET = {"log_info": True, "log_warning": True, "log_error": True, "log_verbose_level": 0, "log_format": "default"}

#: HTTP: a JSON body (bytes: sent as they are); None: a GET
HTTP_CASES: list[Any] = [
    None,
    {"log_verbose_level": 5},
    {"log_verbose_level": -1},
    {"log_verbose_level": 1.5},
    {"log_verbose_level": "1"},
    {"log_verbose_level": True},
    {"log_verbose_level": None},
    {"log_verbose_level": 2147483647},
    {"log_verbose_level": 0},
    {"log_verbose_level": 2147483648},  # tritonserver: 200, read back as 0 (module docstring)
    {"log_verbose_level": 4294967296},
    {"log_info": "true"},
    {"log_info": 1},
    {"log_info": None},
    {"log_info": False, "log_warning": False},
    {"log_error": False},
    {"log_format": "ISO8601"},
    {"log_format": "iso8601"},
    {"log_format": ""},
    {"log_format": 1},
    {"log_file": ""},
    {"log_file": "/tmp/elsewhere.log"},
    {"log_file": 1},
    {"log_file": None},
    {"log_file": "", "log_info": True},
    {"log_verbose": 1},
    {"log_info": False, "bogus": 2},
    {},
    b"",
    b"[]",
    b'"x"',
    b"not json",
    RESET,
]

#: gRPC: (key, parameter, value) settings of one request; parameter None: the setting has no value
GRPC_CASES: list[list[tuple[str, str | None, Any]]] = [
    [],
    [("log_verbose_level", "uint32_param", 5)],
    [("log_verbose_level", "uint32_param", 2147483647)],
    [("log_verbose_level", "uint32_param", 0)],
    [("log_verbose_level", "uint32_param", 2147483648)],
    [("log_verbose_level", "uint32_param", 4294967295)],
    [("log_verbose_level", "bool_param", True)],
    [("log_verbose_level", None, None)],
    [("log_info", None, None)],
    [("log_info", "string_param", "true")],
    [("log_info", "bool_param", False), ("log_warning", "bool_param", False)],
    [("log_format", "string_param", "ISO8601")],
    [("log_format", "string_param", "xml")],
    [("log_format", None, None)],
    [("log_format", "bool_param", True)],
    [("log_file", "string_param", "")],
    [("log_file", "string_param", "/tmp/elsewhere.log")],
    [("log_file", None, None)],
    [("log_file", "bool_param", True)],
    [("bogus", "bool_param", True)],
    [("bogus", None, None)],
    [("log_error", "bool_param", False)],
    [(key, "uint32_param" if key == "log_verbose_level" else "string_param" if key == "log_format" else "bool_param",
      value) for key, value in RESET.items()],
]


def _compact(settings: dict[str, Any]) -> str:
    """``info warning error`` as 0/1, the verbose level, the format and the file: ``"110 v5 ISO8601 ''"``."""
    flags = "".join(str(int(settings[key])) for key in ("log_info", "log_warning", "log_error"))
    return f"{flags} v{settings['log_verbose_level']} {settings['log_format']} {settings['log_file']!r}"


def _error(text: str) -> str:
    """An error message; a JSON parser's detail after tritonserver's words cut off (parsers word it their way)."""
    prefix = "failed to parse the request JSON buffer:"
    return prefix if text.startswith(prefix) else text


def _http_answers(port: int) -> list[tuple[Any, str, str]]:
    """Per case: the status, the error or the settings answered, the settings read back after it."""
    url = f"http://127.0.0.1:{port}/v2/logging"
    answers = []
    with httpx.Client(timeout=30) as client:
        for case in HTTP_CASES:
            if case is None:
                response = client.get(url)
            elif isinstance(case, bytes):
                response = client.post(url, content=case)
            else:
                response = client.post(url, json=case)
            body = response.json()
            after = _compact(client.get(url).json())
            answers.append((response.status_code, _error(body["error"]) if "error" in body else _compact(body),
                            after))
    return answers


def _grpc_answers(http_port: int, grpc_port: int) -> list[tuple[str, str, str]]:
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc

    answers = []
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel, httpx.Client(timeout=30) as client:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for case in GRPC_CASES:
            request = pb.LogSettingsRequest()
            for key, parameter, value in case:
                if parameter is None:
                    request.settings[key].SetInParent()
                else:
                    setattr(request.settings[key], parameter, value)
            try:
                response = stub.LogSettings(request, timeout=30)
                answer = ("OK", _compact({k: getattr(v, v.WhichOneof("parameter_choice"))
                                          for k, v in response.settings.items()}))
            except grpc.RpcError as error:
                answer = (error.code().name, error.details())
            after = _compact(client.get(f"http://127.0.0.1:{http_port}/v2/logging").json())
            answers.append((*answer, after))
    return answers


#: tritonserver 2.51's answers to HTTP_CASES: status, error or settings answered, settings read back after
TRITON_HTTP = [
    (200, "111 v0 default ''", "111 v0 default ''"),
    (200, "111 v5 default ''", "111 v5 default ''"),
    (500, "attempt to access JSON non-unsigned-integer as unsigned-integer", "111 v5 default ''"),
    (500, "attempt to access JSON non-unsigned-integer as unsigned-integer", "111 v5 default ''"),
    (500, "attempt to access JSON non-unsigned-integer as unsigned-integer", "111 v5 default ''"),
    (500, "attempt to access JSON non-unsigned-integer as unsigned-integer", "111 v5 default ''"),
    (200, "111 v5 default ''", "111 v5 default ''"),  # null: no change
    (200, "111 v2147483647 default ''", "111 v2147483647 default ''"),
    (200, "111 v0 default ''", "111 v0 default ''"),
    (200, "111 v0 default ''", "111 v0 default ''"),  # 2147483648: read back as 0
    (200, "111 v0 default ''", "111 v0 default ''"),
    (500, "attempt to access JSON non-boolean as boolean", "111 v0 default ''"),
    (500, "attempt to access JSON non-boolean as boolean", "111 v0 default ''"),
    (200, "111 v0 default ''", "111 v0 default ''"),
    (200, "001 v0 default ''", "001 v0 default ''"),
    (200, "000 v0 default ''", "000 v0 default ''"),
    (200, "000 v0 ISO8601 ''", "000 v0 ISO8601 ''"),
    (503, "invalid argument for --log_format, got: iso8601", "000 v0 ISO8601 ''"),
    (503, "invalid argument for --log_format, got: ", "000 v0 ISO8601 ''"),
    (500, "attempt to access JSON non-string as string", "000 v0 ISO8601 ''"),
    (501, "log file location can not be updated through network protocol", "000 v0 ISO8601 ''"),  # even ""
    (501, "log file location can not be updated through network protocol", "000 v0 ISO8601 ''"),
    (501, "log file location can not be updated through network protocol", "000 v0 ISO8601 ''"),
    (200, "000 v0 ISO8601 ''", "000 v0 ISO8601 ''"),  # null: no change
    (501, "log file location can not be updated through network protocol", "000 v0 ISO8601 ''"),
    (200, "000 v0 ISO8601 ''", "000 v0 ISO8601 ''"),  # an unknown key, ignored
    (200, "000 v0 ISO8601 ''", "000 v0 ISO8601 ''"),
    (200, "000 v0 ISO8601 ''", "000 v0 ISO8601 ''"),
    (500, "failed to parse the request JSON buffer:", "000 v0 ISO8601 ''"),  # an empty body
    (200, "000 v0 ISO8601 ''", "000 v0 ISO8601 ''"),  # [] taken as no change
    (200, "000 v0 ISO8601 ''", "000 v0 ISO8601 ''"),
    (500, "failed to parse the request JSON buffer:", "000 v0 ISO8601 ''"),
    (200, "111 v0 default ''", "111 v0 default ''"),
]

#: tritonserver 2.51's answers to GRPC_CASES: code, details or settings answered, settings read back after
TRITON_GRPC = [
    ("OK", "111 v0 default ''", "111 v0 default ''"),
    ("OK", "111 v5 default ''", "111 v5 default ''"),
    ("OK", "111 v2147483647 default ''", "111 v2147483647 default ''"),
    ("OK", "111 v0 default ''", "111 v0 default ''"),
    ("OK", "111 v0 default ''", "111 v0 default ''"),  # 2147483648: read back as 0
    ("OK", "111 v0 default ''", "111 v0 default ''"),
    ("INVALID_ARGUMENT", "expect int32 for 'log_verbose_level'", "111 v0 default ''"),
    ("INVALID_ARGUMENT", "expect int32 for 'log_verbose_level'", "111 v0 default ''"),
    ("INVALID_ARGUMENT", "expect boolean for 'log_info'", "111 v0 default ''"),
    ("INVALID_ARGUMENT", "expect boolean for 'log_info'", "111 v0 default ''"),
    ("OK", "001 v0 default ''", "001 v0 default ''"),
    ("OK", "001 v0 ISO8601 ''", "001 v0 ISO8601 ''"),
    ("INVALID_ARGUMENT", "invalid argument for log_format, got: xml", "001 v0 ISO8601 ''"),
    ("INVALID_ARGUMENT", "expect string for 'log_format'", "001 v0 ISO8601 ''"),
    ("INVALID_ARGUMENT", "expect string for 'log_format'", "001 v0 ISO8601 ''"),
    ("UNIMPLEMENTED", "log file location can not be updated through network protocol", "001 v0 ISO8601 ''"),
    ("UNIMPLEMENTED", "log file location can not be updated through network protocol", "001 v0 ISO8601 ''"),
    ("UNIMPLEMENTED", "log file location can not be updated through network protocol", "001 v0 ISO8601 ''"),
    ("UNIMPLEMENTED", "log file location can not be updated through network protocol", "001 v0 ISO8601 ''"),
    ("OK", "001 v0 ISO8601 ''", "001 v0 ISO8601 ''"),  # an unknown key, ignored
    ("OK", "001 v0 ISO8601 ''", "001 v0 ISO8601 ''"),
    ("OK", "000 v0 ISO8601 ''", "000 v0 ISO8601 ''"),
    ("OK", "111 v0 default ''", "111 v0 default ''"),
]

_LEVEL = "'log_verbose_level' must be an integer from 0 to 2147483647, got "
_PARSE = "failed to parse the request JSON buffer:"
#: (protocol, case) -> Ferry's answer where it differs on purpose (module docstring); what is read back after
#: it is tritonserver's
FERRY_DIFFERS: dict[tuple[str, int], tuple[Any, str]] = {
    ("http", 2): (400, _LEVEL + "-1"),
    ("http", 3): (400, _LEVEL + "1.5"),
    ("http", 4): (400, _LEVEL + "'1'"),
    ("http", 5): (400, _LEVEL + "True"),
    ("http", 9): (400, _LEVEL + "2147483648"),
    ("http", 10): (400, _LEVEL + "4294967296"),
    ("http", 11): (400, "'log_info' must be a boolean, got 'true'"),
    ("http", 12): (400, "'log_info' must be a boolean, got 1"),
    ("http", 19): (400, "expect string for 'log_format'"),
    ("http", 25): (400, "unknown log setting 'log_verbose'"),
    ("http", 26): (400, "unknown log setting 'bogus'"),
    ("http", 28): (200, "000 v0 ISO8601 ''"),
    ("http", 29): (400, "request body must be a JSON object"),
    ("http", 30): (400, "request body must be a JSON object"),
    ("http", 31): (400, _PARSE),
    ("grpc", 4): ("INVALID_ARGUMENT", _LEVEL + "2147483648"),
    ("grpc", 5): ("INVALID_ARGUMENT", _LEVEL + "4294967295"),
    ("grpc", 19): ("INVALID_ARGUMENT", "unknown log setting 'bogus'"),
    ("grpc", 20): ("INVALID_ARGUMENT", "unknown log setting 'bogus'"),
}


def _ferry_expected(protocol: str, triton: list[tuple[Any, str, str]]) -> list[tuple[Any, str, str]]:
    return [(*FERRY_DIFFERS.get((protocol, i), answer[:2]), answer[2]) for i, answer in enumerate(triton)]


@pytest.fixture(scope="module")
def ferry_ports(tmp_path_factory) -> Iterator[tuple[int, int]]:
    """One in-process Ferry (no models) for the settings sequences; its settings are put back after each."""
    thread = ServerThread(make_options([tmp_path_factory.mktemp("logging_empty")]))
    handle = thread.start()
    try:
        yield int(handle.http_url.rsplit(":", 1)[1]), int(handle.grpc_url.rsplit(":", 1)[1])
    finally:
        thread.stop()
        logging.getLogger("ferry").setLevel(logging.NOTSET)


def test_http_log_settings_answers(ferry_ports):
    """Each update's status and words, and what is read back after it (nothing of a refused update applied)."""
    assert _http_answers(ferry_ports[0]) == _ferry_expected("http", TRITON_HTTP)


def test_grpc_log_settings_answers(ferry_ports):
    assert _grpc_answers(*ferry_ports) == _ferry_expected("grpc", TRITON_GRPC)


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_log_settings_answers_match_triton(tmp_path):
    triton_or_skip()
    with _launched("triton", tmp_path) as (_, http, grpc):
        assert _http_answers(http) == TRITON_HTTP
        assert _grpc_answers(http, grpc) == TRITON_GRPC


# --- what is written ----------------------------------------------------------------------------------------
@contextlib.contextmanager
def _launched(server: str, repository: Path, *flags: str) -> Iterator[tuple[subprocess.Popen, int, int]]:
    """``server`` ("triton" or "ferry", as a process) in explicit model control on free ports with ``flags``
    after them (theirs win), ready; its whole process group (python backend stubs) is killed after."""
    http, grpc, metrics = free_ports(3)
    ports = [f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}"]
    if server == "triton":
        triton = triton_or_skip()
        repo = triton_repositories([repository])[0] if any(repository.iterdir()) else repository
        command = triton.command(f"--model-repository={repo}", "--model-control-mode=explicit", *ports,
                                 "--allow-gpu-metrics=false", "--exit-timeout-secs=2", *flags)
        env = triton.env
    else:
        command = [sys.executable, "-m", "serving_pod", f"--model-repository={repository}",
                   "--model-control-mode=explicit", "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                   "--metrics-address=127.0.0.1", *ports, *flags]
        env = dict(os.environ)
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        wait_ready(http, process, timeout=90)
        yield process, http, grpc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("logging_repo")
    write_model(repo, "logger", LOGGER_CONFIG, {"1/model.py": LOGGER_MODEL})
    return repo


def _records(text: str) -> list[dict[str, str]]:
    """A log's entries (tritonserver's L0_logging reading): a line that starts no entry continues the last."""
    records: list[dict[str, str]] = []
    for line in text.splitlines():
        match = DEFAULT_RECORD.match(line) or ISO8601_RECORD.match(line)
        if match:
            records.append({**match.groupdict(), "format": "default" if "month" in match.groupdict() else "ISO8601"})
        elif records:
            records[-1]["message"] += "\n" + line
        else:
            records.append({"format": "none", "message": line})
    return records


def _heading_is_json(record: dict[str, str]) -> bool:
    """tritonserver's check of an escaped entry: its first line is empty (a table follows) or a JSON string."""
    heading = record["message"].split("\n")[0]
    try:
        return not heading.strip() or isinstance(json.loads(heading), str)
    except ValueError:
        return False


#: the logger model loaded four times, with updates between; what it logged each time, as tritonserver wrote it
STEPS: list[dict[str, Any]] = [
    {},
    {"log_format": "ISO8601", "log_verbose_level": 0},
    {"log_info": False, "log_warning": False},
    {"log_error": False, "log_info": True, "log_verbose_level": 1},
]
INFO = r'"info \"quoted\" one\ntwo é \u001B[31m"'
TRITON_ENTRIES = [
    ("default", "I", INFO), ("default", "W", '"a warning"'), ("default", "E", '"an error"'),
    ("default", "I", '"a verbose message"'),  # verbose messages are I
    ("ISO8601", "I", INFO), ("ISO8601", "W", '"a warning"'), ("ISO8601", "E", '"an error"'),
    ("ISO8601", "E", '"an error"'),
    ("ISO8601", "I", INFO), ("ISO8601", "I", '"a verbose message"'),
]


def _log_run(server: str, repository: Path, tmp_path: Path) -> dict[str, Any]:
    """Start with ``--log-file --log-verbose=1``, load the logger model after each of ``STEPS``; the settings
    read at start, the model's entries (format, level, message), and whether every entry is well formed."""
    log_file = tmp_path / f"{server}.log"
    with _launched(server, repository, f"--log-file={log_file}", "--log-verbose=1") as (process, http, _):
        url = f"http://127.0.0.1:{http}/v2"
        started = _compact(httpx.get(f"{url}/logging", timeout=30).json()).replace(repr(str(log_file)), "<file>")
        for step in STEPS:
            if step:
                httpx.post(f"{url}/repository/models/logger/unload", timeout=60).raise_for_status()
                httpx.post(f"{url}/logging", json=step, timeout=30).raise_for_status()
            httpx.post(f"{url}/repository/models/logger/load", timeout=120).raise_for_status()
        deadline = time.monotonic() + 10  # the python backend's entries may reach the log a moment later
        while True:
            records = _records(log_file.read_text(encoding="utf-8"))
            ours = [r for r in records if r.get("file") == "model.py"]
            if len(ours) >= len(TRITON_ENTRIES) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    return {
        "started": started,
        "entries": [(r["format"], r["level"], r["message"]) for r in ours],
        "model pid is the server's": {r["pid"] for r in ours} == {str(process.pid)},
        "every entry well formed": all(r["format"] != "none" and _heading_is_json(r) for r in records),
    }


TRITON_LOG_RUN = {"started": "111 v1 default <file>", "entries": TRITON_ENTRIES,
                  "model pid is the server's": True, "every entry well formed": True}


def test_log_file_entries_after_updates(repository, tmp_path):
    """``ferry-server`` logs the python model's Logger calls as tritonserver: heads, levels, JSON-escaped
    messages, the format and level switches of each update (it wrote ``D`` and raw messages, its logger's name
    where tritonserver writes its pid and file:line, and dropped verbose messages of models turned on at run
    time)."""
    assert _log_run("ferry", repository, tmp_path) == TRITON_LOG_RUN


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_log_file_entries_after_updates_match_triton(repository, tmp_path):
    triton_or_skip()
    assert _log_run("triton", repository, tmp_path) == TRITON_LOG_RUN


#: every switch off at start, and a log file that cannot be opened: tritonserver logs to the console and reads
#: back an empty log_file
START_FLAGS = ("--log-info=false", "--log-warning=0", "--log-error=off", "--log-verbose=3", "--log-format=ISO8601",
               "--log-file=/nonexistent/ferry-logging/x.log")
TRITON_STARTED = "000 v3 ISO8601 ''"


def _started(server: str, tmp_path: Path) -> str:
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    with _launched(server, empty, *START_FLAGS) as (_, http, _):
        return _compact(httpx.get(f"http://127.0.0.1:{http}/v2/logging", timeout=30).json())


def test_start_flags_read_back(tmp_path):
    """The settings the flags give (the unopenable log file was read back as if it were written)."""
    assert _started("ferry", tmp_path) == TRITON_STARTED


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_start_flags_read_back_match_triton(tmp_path):
    triton_or_skip()
    assert _started("triton", tmp_path) == TRITON_STARTED


def test_log_verbose_above_int32_refused_at_start(capsys):
    """tritonserver's words (it exits 1 after its usage text; argparse exits 2)."""
    assert "Provided option value is out of bound. Got 2147483648" in refusal(capsys, "--log-verbose=2147483648")
    assert cli.build_parser().parse_args(["--log-verbose=2147483647"]).log_verbose == 2147483647


@pytest.mark.slow  # live NVIDIA Triton: Ferry's half runs by default against the same expected answers
def test_log_verbose_above_int32_refused_by_triton(tmp_path):
    triton = triton_or_skip()
    done = subprocess.run(triton.command("--model-repository=/nonexistent", "--log-verbose=2147483648"),
                          env=triton.env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "Provided option value is out of bound. Got 2147483648" in done.stdout + done.stderr


# --- the installed handler, in this process -------------------------------------------------------------------
@pytest.fixture
def installed(tmp_path, monkeypatch) -> Iterator[Any]:
    """``install(settings)``: settings installed as by the CLI; the root logger's handlers and levels put back."""
    root, ferry = logging.getLogger(), logging.getLogger("ferry")
    saved = (list(root.handlers), root.level, ferry.level)
    monkeypatch.delenv(ESCAPE_VARIABLE, raising=False)

    def install(settings: LogSettings) -> LogSettings:
        settings.install()
        return settings

    try:
        yield install
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        ferry.setLevel(saved[2])


def test_entries_in_this_process(installed, tmp_path):
    """Heads, pid, this file and line, escaped messages, a traceback after its entry; verbose messages of any
    logger once the verbose level is raised at run time."""
    log_file = tmp_path / "ferry.log"
    settings = installed(LogSettings(file=str(log_file)))
    ours, other = logging.getLogger("ferry.test_logging"), logging.getLogger("elsewhere.test_logging")
    first = sys._getframe().f_lineno + 1
    ours.info('say "hi"\nI0101 00:00:00.000000 1 forged.cc:1] "forged"')
    other.debug("hidden: verbose level 0")
    settings.update({"log_verbose_level": 1, "log_format": "ISO8601"})
    other.debug("verbose \\ message")
    try:
        raise ValueError("boom")
    except ValueError:
        ours.exception("failed")
    settings.update({"log_info": False})
    ours.info("hidden: info off")
    ours.critical("critical")
    settings.handler.flush()
    records = _records(log_file.read_text(encoding="utf-8"))
    assert [(r["format"], r["level"], r["message"].split("\n")[0]) for r in records] == [
        ("default", "I", r'"say \"hi\"\nI0101 00:00:00.000000 1 forged.cc:1] \"forged\""'),
        ("ISO8601", "I", r'"verbose \\ message"'),
        ("ISO8601", "E", '"failed"'),
        ("ISO8601", "E", '"critical"'),
    ]
    assert {(r["pid"], r["file"]) for r in records} == {(str(os.getpid()), Path(__file__).name)}
    assert records[0]["line"] == str(first)
    assert records[2]["message"].splitlines()[-1] == "ValueError: boom"


def test_unescaped_when_tritonserver_is_told_so(installed, tmp_path, monkeypatch):
    monkeypatch.setenv(ESCAPE_VARIABLE, "0")
    log_file = tmp_path / "ferry.log"
    settings = installed(LogSettings(file=str(log_file)))
    logging.getLogger("ferry.test_logging").warning('raw "text"')
    settings.handler.flush()
    assert [r["message"] for r in _records(log_file.read_text())] == ['raw "text"']


def test_an_unopenable_log_file_reads_back_empty(installed, tmp_path, capsys):
    settings = installed(LogSettings(file=str(tmp_path / "no" / "such" / "x.log")))
    assert settings.as_dict()["log_file"] == ""
    [record] = _records(capsys.readouterr().err)
    assert (record["level"], record["file"]) == ("E", "logging_settings.py")
    assert record["message"] == (f'"cannot open log file {tmp_path}/no/such/x.log: No such file or directory; '
                                 'logging to stderr instead"')
