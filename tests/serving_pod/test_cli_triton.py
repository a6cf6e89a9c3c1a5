"""``ferry-server``'s command line side by side with NVIDIA Triton 2.51's ``tritonserver``: the same flags, read
the same way, and the same outcome when a repository or a model fails at start.

Each case runs against Ferry always and against tritonserver where it can be had (skipped with the installer's
reason otherwise). tritonserver's parse checks are seen without serving: given ``--model-repository=/nonexistent``
it gets past its flags to "failed to stat file /nonexistent", or stops at a bad flag first.

Differences kept on purpose (asserted for Ferry only, or not compared):

* a bad flag exits with code 2 and one line (argparse); tritonserver exits 1 after its whole usage text;
* Ferry refuses junk tritonserver takes: ``--http-port=8000x`` (read as 8000), negative ports, timeouts, sizes
  and thread counts, unknown ``--trace-config`` settings, a ``--http-header-forward-pattern`` that does not
  compile (tritonserver logs an RE2 error and serves) -- ``test_cli.py`` and ``test_cli_compat.py`` cover those;
* port 0 is "any free port" in Ferry, so endpoints on port 0 never clash (tritonserver: "cannot listen ... at the
  same address and port 0.0.0.0:0");
* without ``--model-repository`` Ferry serves its embedded examples (tritonserver refuses to start);
* with ``--exit-on-error=false`` and a repository that cannot be read, tritonserver stays up without a server
  (not live, not ready, every model 503); Ferry serves the other repositories, live, and not ready under strict
  readiness (ready without it);
* Ferry's log lines carry the logger's name where tritonserver puts its process id and source file;
* an unopenable ``--log-file``: both log to the console, Ferry also says why.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient
from support.cli import cli_options, refusal
from support.python_models import IDENTITY_MODEL, INITIALIZE_RAISES
from support.server import free_ports
from support.triton import triton_or_skip, triton_repositories

from serving_pod.core.engine import EXTENSIONS, SERVER_VERSION

# the live tritonserver half runs with -m slow (minutes of the default suite; Triton's own timing made it flaky)
SERVERS = ["ferry", pytest.param("triton", marks=pytest.mark.slow)]
MISSING = "/nonexistent-ferry-cli-repository"

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
GOOD = IDENTITY_MODEL
BAD = INITIALIZE_RAISES.format(error='RuntimeError("bad model refuses to start")')


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    """``good`` (serves) and ``bad`` (its initialize raises), both python models."""
    repo = tmp_path_factory.mktemp("cli_triton")
    for name, source in (("good", GOOD), ("bad", BAD)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name))
        (repo / name / "1" / "model.py").write_text(source)
    return repo


def _repo(server: str, path: Path) -> str:
    return str(triton_repositories([path])[0]) if server == "triton" else str(path)


@contextlib.contextmanager
def _launched(server: str, tmp_path: Path, *flags: str) -> Iterator[tuple[subprocess.Popen, int, int, Path]]:
    """The server on free ports (``flags`` after them, so theirs win) in its own process group, output to a file
    (a python backend stub outliving tritonserver would hold a pipe open); the whole group is killed after."""
    http, grpc, metrics = free_ports(3)
    ports = [f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}"]
    if server == "triton":
        triton = triton_or_skip()
        command, env = triton.command(*ports, "--exit-timeout-secs=2", *flags), triton.env
    else:
        addresses = ["--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1"]
        command, env = [sys.executable, "-m", "serving_pod", *addresses, *ports, *flags], dict(os.environ)
    log = tmp_path / f"{server}-{time.monotonic_ns()}.log"
    with log.open("w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield process, http, grpc, log
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _exit(server: str, tmp_path: Path, *flags: str) -> tuple[int, str]:
    """Exit code and output of a server expected to stop by itself."""
    with _launched(server, tmp_path, *flags) as (process, _, _, log):
        try:
            code = process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{server} kept running: {log.read_text()[-2000:]}")
        return code, log.read_text()


@contextlib.contextmanager
def _serving(server: str, tmp_path: Path, *flags: str) -> Iterator[tuple[int, int, Path]]:
    """A server that answers on HTTP (live or not), after its initial loads (Ferry answers during them: its
    ``Started HTTPService`` line, which tritonserver writes too, comes after them); started again on other ports
    when another process took one of its free ports first. Fails if it is gone after the test's probes (they
    would have reached some other server)."""
    for attempt in range(3):
        with _launched(server, tmp_path, *flags) as (process, http, grpc, log):
            deadline = time.monotonic() + 90
            while process.poll() is None:
                assert time.monotonic() < deadline, f"{server} did not answer: {log.read_text()[-2000:]}"
                with contextlib.suppress(httpx.HTTPError):
                    httpx.get(f"http://127.0.0.1:{http}/v2/health/live", timeout=1)
                    if "Started HTTPService" in log.read_text():
                        break
                time.sleep(0.2)
            if process.poll() is None:
                yield http, grpc, log
                assert process.poll() is None, f"{server} exited ({process.returncode}): {log.read_text()[-2000:]}"
                return
            output = log.read_text()
            if "in use" not in output or attempt == 2:
                pytest.fail(f"{server} exited ({process.returncode}): {output[-2000:]}")


def _health(http: int, grpc: int) -> dict[str, object]:
    """Liveness, readiness and the good model's readiness over HTTP (status codes) and gRPC (booleans)."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
    url = f"http://127.0.0.1:{http}/v2"
    return {
        "http": [httpx.get(f"{url}/{path}", timeout=5).status_code
                 for path in ("health/live", "health/ready", "models/good/ready")],
        "grpc": [client.is_server_live(), client.is_server_ready(), client.is_model_ready("good")],
    }


def _triton_parse(tmp_path: Path, *argv: str) -> tuple[int, str]:
    """tritonserver's verdict on ``argv`` without serving (module docstring)."""
    return _exit("triton", tmp_path, f"--model-repository={MISSING}", *argv)


# --- flag values ------------------------------------------------------------------------------------------------

ACCEPTED = [
    (("--model-control-mode=EXPLICIT", "--load-model=m"), lambda o: o.engine.model_control_mode == "explicit"),
    (("--model-control-mode=Poll",), lambda o: o.engine.model_control_mode == "poll"),
    (("--rate-limit=EXECUTION_COUNT",), lambda o: o.engine.rate_limit == "execution_count"),
    (("--grpc-infer-response-compression-level=HIGH",), lambda o: o.grpc_response_compression == "high"),
    (("--trace-level=timestamps",), lambda o: o.engine.trace.level == ("TIMESTAMPS",)),
    (("--trace-config=mode=OPENTELEMETRY",), lambda o: o.engine.trace.mode == "opentelemetry"),
    (("--metrics-interval-ms=1500.5",), lambda o: any("--metrics-interval-ms (no effect" in n for n in o.ignored_flags)),
    (("--model-load-thread-count=0",), lambda o: any("--model-load-thread-count (no effect" in n for n in o.ignored_flags)),
    (("--model-repository=/a", "--model-store=/b", "--model-repository=/a"),
     lambda o: o.engine.model_repositories == ("/a", "/b")),
    (("--log-verbose=TRUE",), lambda o: o.log_verbose == 1),
    (("--log-verbose=false",), lambda o: o.log_verbose == 0),
    (("--trace-level=on",), lambda o: o.engine.trace.level == ("TIMESTAMPS",)),
    (("--trace-level=OFF", "--trace-level=TIMESTAMPS"), lambda o: o.engine.trace.level == ("OFF",)),
    (("--trace-config=level=OFF", "--trace-config=level=TIMESTAMPS"), lambda o: o.engine.trace.level == ("TIMESTAMPS",)),
    (("--trace-rate=0",), lambda o: o.engine.trace.rate == 0),
    (("--trace-config=TRITON,file=/tmp/t.json", "--trace-config=OPENTELEMETRY,url=http://collector:4318"),
     lambda o: (o.engine.trace.file, o.engine.trace.otel_url) == ("/tmp/t.json", "http://collector:4318")),
    (("--trace-config=opentelemetry,bsp_max_queue_size=abc",), lambda o: o.engine.trace.mode == "triton"),
    (("--http-restricted-api=model-repository:auth=tok:en",),
     lambda o: o.http_restrictions["model-repository"].value == "tok:en"),
]


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize(("argv", "check"), ACCEPTED, ids=[" ".join(a) for a, _ in ACCEPTED])
def test_values_read_as_tritonserver_reads_them(server, argv, check, tmp_path):
    """Words in any case where tritonserver lowercases them, a float interval, 0 load threads, a path twice;
    ``--log-verbose`` true/false; tritonserver's --trace-level words, where one OFF turns tracing off (a
    ``--trace-config level=OFF`` does not); a trace rate of 0; an opentelemetry setting read only in that mode; a
    restriction's value holding ':'."""
    if server == "ferry":
        assert check(cli_options(*argv))
    else:
        code, output = _triton_parse(tmp_path, *argv)
        assert code == 1 and "error: creating server: Internal - failed to stat file /" in output, output[-2000:]


REFUSED = [
    (("--allow-http=yes",), "invalid value for bool option: yes"),
    (("--exit-on-error=NO",), "invalid value for bool option: NO"),
    (("--load-model=m",), "Use of '--load-model' requires setting '--model-control-mode=explicit' as well."),
    (("--model-control-mode=poll", "--load-model=m"),
     "Use of '--load-model' requires setting '--model-control-mode=explicit' as well."),
    (("--backend-config=,a=b",), ("No backend specified. --backend-config option format is "
                                  "<backend name>,<setting>=<value> or <setting>=<value>. Got ,a=b")),
    (("--backend-config=python,a=",), ("--backend-config option format is '<backend name>,<setting>=<value>'. "
                                       "Got python,a=")),
    (("--http-port=9000", "--grpc-port=9000"),
     "The server cannot listen to HTTP requests and GRPC requests at the same address and port 0.0.0.0:9000"),
    (("--http-port=9000", "--metrics-port=9000"),
     "The server cannot listen to HTTP requests and metrics requests at the same address and port 0.0.0.0:9000"),
    (("--grpc-port=9000", "--metrics-port=9000"),
     "The server cannot listen to GRPC requests and metrics requests at the same address and port 0.0.0.0:9000"),
    (("--response-cache-byte-size=1048576", "--cache-config=local,size=1048576"),
     "Error: Incompatible flags --response-cache-byte-size and --cache-config both provided. Please provide one or "
     "the other."),
    (("--cache-config=,size=1",), ("No cache specified. --cache-config option format is <cache name>,<setting>=<value>. "
                                   "Got ,size=1")),
    (("--cache-config=local,=1",), "--cache-config option format is '<cache name>,<setting>=<value>'. Got local,=1"),
    (("--http-restricted-api=model-repository:a=",),
     "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got model-repository:a="),
    (("--http-restricted-api=foo:a=b",), "unknown restricted api 'foo'"),
    (("--grpc-restricted-protocol=foo:a=b",), "unknown restricted protocol 'foo'"),
    (("--http-restricted-api=health:a=b", "--http-restricted-api=health:c=d"),
     "restricted api 'health' can not be specified in multiple config groups"),
    (("--trace-config=,rate=1",), ("No trace mode specified. --trace-config option format is <trace mode>,<setting>="
                                   "<value> or <setting>=<value>. Got ,rate=1")),
    (("--trace-config=rate=",), "--trace-config option format is '<trace mode>,<setting>=<value>'. Got rate="),
    (("--trace-config=level=FOO",), "invalid value for trace level option: foo"),
    (("--trace-level=FOO",), "invalid value for trace level option: foo"),
    (("--trace-config=mode=bogus",),
     'invalid value for trace mode option: bogus. Available options are "triton" and "opentelemetry"'),
    (("--trace-config=rate=abc",), "Invalid option value. Got abc"),
    (("--repository-poll-secs=abc",), "Invalid option value. Got abc"),
    (("--http-port=abc",), "Invalid option value. Got abc"),
    (("--log-format=iso8601",), "invalid argument for --log-format"),
    (("--model-control-mode=sometimes",), "invalid argument for --model-control-mode"),
    (("--rate-limit=bogus",), "invalid argument for --rate-limit"),
]


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize(("argv", "words"), REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_refused_in_tritonserver_words(server, argv, words, tmp_path, capsys):
    """yes/no are no booleans to tritonserver; --load-model needs explicit mode; empty backend-config parts; two
    enabled endpoints on one address and port; both cache flags; malformed cache, restriction and trace settings; words
    and numbers it cannot read. Ferry exits 2 (tritonserver 1, module docstring)."""
    if server == "ferry":
        assert words in refusal(capsys, *argv)
    else:
        code, output = _triton_parse(tmp_path, *argv)
        assert code == 1 and words in output, output[-2000:]


def test_endpoints_clash_only_when_both_enabled_on_one_nonzero_port(capsys):
    """Ferry only: port 0 is "any free port" (tritonserver refuses 0 twice: module docstring)."""
    assert "same address and port 127.0.0.1:9000" in refusal(
        capsys, "--http-address=127.0.0.1", "--metrics-address=127.0.0.1", "--http-port=9000", "--metrics-port=9000")
    options = cli_options("--http-port=0", "--grpc-port=0", "--metrics-port=0")
    assert (options.http_port, options.grpc_port, options.metrics_port) == (0, 0, 0)
    assert cli_options("--http-port=9000", "--grpc-port=9000", "--allow-grpc=false").http_port == 9000
    assert cli_options("--http-port=9000", "--grpc-port=9000", "--grpc-address=127.0.0.1").grpc_port == 9000


DEPRECATED = [
    ("--strict-model-config=false", ("'--strict-model-config' has been deprecated! Please use "
                                     "'--disable-auto-complete-config' instead.")),
    ("--response-cache-byte-size=1048576", ("The equivalent --cache-config CLI args would be: "
                                            "'--cache-config=local,size=1048576'")),
    ("--trace-level=TIMESTAMPS", ("'--trace-level' has been deprecated and will be removed in future releases. "
                                  "Please use '--trace-config level=<OFF|TIMESTAMPS|TENSORS> instead.")),
    ("--trace-rate=10", "'--trace-rate' has been deprecated"),
    ("--trace-count=5", "'--trace-count' has been deprecated"),
    ("--trace-log-frequency=2", "'--trace-log-frequency' has been deprecated"),
    ("--trace-file=/tmp/trace.json", "Please use '--trace-config triton,file=<filepath> instead."),
]


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize(("flag", "words"), DEPRECATED, ids=[f for f, _ in DEPRECATED])
def test_deprecated_flags_work_with_tritonservers_warning(server, flag, words, tmp_path):
    if server == "ferry":
        assert any(words in warning for warning in cli_options(flag).startup_warnings)
    else:
        code, output = _triton_parse(tmp_path, flag)
        assert code == 1 and "Warning: " in output and words in output, output[-2000:]


async def test_repository_poll_secs_0_does_not_poll(tmp_path, monkeypatch):
    """As tritonserver (which then never polls): poll mode with ``--repository-poll-secs=0`` scans the repository
    once, at start, instead of scanning without pause."""
    import asyncio

    from serving_pod.core.engine import Engine

    engine = Engine(cli_options("--model-control-mode=poll", "--repository-poll-secs=0",
                                f"--model-repository={tmp_path}").engine)
    polls = []

    async def poll() -> dict[str, str]:
        polls.append(1)
        return {}

    monkeypatch.setattr(engine.registry, "poll", poll)
    await engine.start()
    try:
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(polls) == 1
    finally:
        await engine.shutdown()


# --- start-up outcomes --------------------------------------------------------------------------------------------

HEADS = {"default": r"^[IWE]\d{4} \d\d:\d\d:\d\d\.\d{6} ", "ISO8601": r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IWE] "}


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("log_format", sorted(HEADS))
@pytest.mark.parametrize("kind", ["missing", "file"])
def test_unreadable_repository_exits_1(server, log_format, kind, tmp_path):
    """A repository that is missing or a file stops the server at start, in tritonserver's words and log heads."""
    path, words = MISSING, f"failed to stat file {MISSING}"
    if kind == "file":
        path, words = str(tmp_path / "not-a-directory"), "repository path is not a valid directory"
        Path(path).write_text("")
    code, output = _exit(server, tmp_path, f"--model-repository={path}", f"--log-format={log_format}")
    assert code == 1 and words in output, output[-2000:]
    assert re.search(HEADS[log_format], output, re.MULTILINE), output[-2000:]


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("model", ["bad", "missing"])
def test_explicit_model_failing_to_load_exits_1(server, model, repository, tmp_path):
    """``--load-model`` of a model whose initialize raises, or of no model at all, stops the server; with
    ``--exit-on-error=false`` it serves the others, live; not ready under strict readiness when the model's version
    failed, ready when the model named is in no repository (both servers count only the models they hold)."""
    repo = _repo(server, repository)
    code, output = _exit(server, tmp_path, f"--model-repository={repo}", "--model-control-mode=explicit",
                         f"--load-model={model}", "--load-model=good")
    assert code == 1, output[-2000:]
    with _serving(server, tmp_path, f"--model-repository={repo}", "--model-control-mode=explicit",
                  f"--load-model={model}", "--load-model=good", "--exit-on-error=false") as (http, grpc, _):
        ready = model == "missing"
        assert _health(http, grpc) == {"http": [200, 200 if ready else 400, 200], "grpc": [True, ready, True]}


@pytest.mark.parametrize("server", SERVERS)
def test_repository_given_twice_is_one_repository(server, repository, tmp_path):
    """The same path twice serves each model once (no duplicates); metadata says ``--id``."""
    good = tmp_path / "good_only"
    shutil.copytree(repository / "good", good / "good")
    repo = _repo(server, good)
    with _serving(server, tmp_path, f"--model-repository={repo}", f"--model-store={repo}", "--id=cli-parity") as (
            http, grpc, _):
        assert _health(http, grpc) == {"http": [200, 200, 200], "grpc": [True, True, True]}
        expected = {"name": "cli-parity", "version": SERVER_VERSION, "extensions": EXTENSIONS}
        assert httpx.get(f"http://127.0.0.1:{http}/v2", timeout=5).json() == expected
        metadata = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}").get_server_metadata(as_json=True)
        assert metadata == expected


@pytest.mark.parametrize(("strict", "ready"), [("true", (400, False)), ("false", (200, True))])
def test_unreadable_repository_with_exit_on_error_false(strict, ready, repository, tmp_path):
    """Ferry only (tritonserver stays up without a server: module docstring): the readable repository is served
    and the unreadable one counts as a start-up failure for strict readiness."""
    good = tmp_path / "good_only"
    shutil.copytree(repository / "good", good / "good")
    with _serving("ferry", tmp_path, f"--model-repository={good}", f"--model-repository={MISSING}",
                  "--exit-on-error=false", f"--strict-readiness={strict}") as (http, grpc, log):
        health = _health(http, grpc)
        assert health == {"http": [200, ready[0], 200], "grpc": [True, ready[1], True]}
        assert f"model repository {MISSING}: failed to stat file {MISSING}" in log.read_text()


@pytest.mark.parametrize("server", SERVERS)
def test_unopenable_log_file_logs_to_the_console(server, tmp_path):
    """Neither server refuses to start over its log file; Ferry says why it logs to the console."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with _serving(server, tmp_path, f"--model-repository={empty}", f"--log-file={tmp_path}/no/such/dir.log") as (
            http, _, log):
        assert httpx.get(f"http://127.0.0.1:{http}/v2/health/ready", timeout=5).status_code == 200
        output = log.read_text()
        assert re.search(HEADS["default"], output, re.MULTILINE), output[-2000:]
        if server == "ferry":
            assert (f"cannot open log file {tmp_path}/no/such/dir.log: No such file or directory; "
                    "logging to stderr instead") in output
