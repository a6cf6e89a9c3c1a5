"""ferry-server flags of the security/protocol extensions: parsed into options, bad combinations exit 2."""

from __future__ import annotations

import pytest

from serving_pod.security import Restriction
from support.cli import cli_options, refusal


def test_defaults_are_safe():
    options = cli_options()
    assert options.engine.allow_client_shm is False
    assert options.engine.trace.level == ("OFF",)
    assert options.http_restrictions == {} and options.grpc_tls is None and options.http_tls is None
    assert options.log_file == ""


def test_flags_map_tocli_options(tmp_path):
    cert, key, ca = (tmp_path / n for n in ("c.pem", "k.pem", "ca.pem"))
    for path in (cert, key, ca):
        path.write_text("x")
    options = cli_options(
        "--allow-client-shm=true", "--http-restricted-api=shared-memory:k=v",
        "--grpc-restricted-protocol=health,inference:h=1", "--trace-file=/tmp/t.json", "--trace-level=TIMESTAMPS",
        "--trace-rate=10", "--trace-config=count=5", "--log-file=/tmp/ferry.log",
        "--grpc-use-ssl=true", f"--grpc-server-cert={cert}", f"--grpc-server-key={key}", f"--grpc-root-cert={ca}",
        "--grpc-use-ssl-mutual=true", f"--http-ssl-cert={cert}", f"--http-ssl-key={key}",
        "--http-max-header-size=4096", "--http-read-timeout-secs=2.5", "--grpc-max-message-size=1024",
    )
    assert options.engine.allow_client_shm is True
    assert options.http_restrictions == {"shared-memory": Restriction("k", "v")}
    # tritonserver puts "triton-grpc-protocol-" before a --grpc-restricted-protocol key (grpc_server.h): the
    # metadata key a client sends; --http-restricted-api keys are the header as given
    assert options.grpc_restrictions == {g: Restriction("triton-grpc-protocol-h", "1") for g in ("health", "inference")}
    trace = options.engine.trace
    assert (trace.level, trace.rate, trace.count, trace.file) == (("TIMESTAMPS",), 10, 5, "/tmp/t.json")
    assert options.log_file == "/tmp/ferry.log"
    assert options.grpc_tls.mutual and options.grpc_tls.ca == str(ca)
    assert options.http_tls.cert == str(cert) and not options.http_tls.mutual
    assert (options.http_max_header_size, options.http_read_timeout_secs, options.grpc_max_message_size) == (
        4096, 2.5, 1024)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--http-restricted-api=admin:k=v"], "unknown restricted api 'admin'"),
        (["--grpc-restricted-protocol=health"], "--grpc-restricted-protocol option format is '<config name>:<setting>=<value>'. Got health"),
        (["--grpc-use-ssl=true"], "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"),
        (["--http-ssl-cert=/nonexistent.pem"], "--http-ssl-cert and --http-ssl-key must be given together"),
        (["--http-ssl-cert=/nonexistent.pem", "--http-ssl-key=/nonexistent.key"], "no such file"),
        (["--http-ssl-mutual=true"], "--http-ssl-mutual=true needs"),
        (["--trace-config=zipkin,url=x"], "invalid value for trace mode option: zipkin"),
        (["--trace-config=rate=abc"], "Invalid option value. Got abc"),
        (["--allow-client-shm=maybe"], "invalid value for bool option"),
        (["--http-read-timeout-secs=0"], "value must be > 0"),
    ],
)
def test_bad_flags_exit_2_with_a_clear_message(argv, message, capsys):
    assert message in refusal(capsys, *argv)
