"""``ferry-server`` flags for shared memory, tracing, log file, restricted APIs, TLS and limits.

Kept apart from :mod:`serving_pod.cli` (which calls ``add_arguments`` and ``apply``) so the core
flag list stays short. Names follow tritonserver where it has the flag (``--allow-client-shm``,
``--http-restricted-api``, ``--grpc-restricted-protocol``, ``--trace-config``, ``--trace-file``,
``--trace-level``, ``--trace-rate``, ``--trace-count``, ``--trace-log-frequency``, ``--log-file``,
``--grpc-use-ssl``, ``--grpc-server-cert``, ``--grpc-server-key``, ``--grpc-root-cert``,
``--grpc-use-ssl-mutual``); the HTTP TLS and limit flags are Ferry's own. Bad combinations exit
with code 2 and a message naming the flag.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import Any

from serving_pod.options import GRPC_MAX_MESSAGE_SIZE, GrpcKeepalive, TlsOptions
from serving_pod.security import GRPC_HEADER_PREFIX, parse_restrictions
from serving_pod.trace_config import cli_level, parse_trace_config


def parse_bool(value: str) -> bool:
    """tritonserver's boolean flag values: true/false, on/off or 1/0, in any case (it refuses yes/no too)."""
    word = value.lower()
    if word in ("true", "on", "1"):
        return True
    if word in ("false", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"invalid value for bool option: {value} (use true/false, on/off or 1/0)")


def lowered(value: str) -> str:
    """The value in lower case: tritonserver lowercases the words of ``--grpc-infer-response-compression-level``
    before it checks them (``cli._word`` and ``trace`` do so for the others)."""
    return value.lower()


def number(kind: type, *, minimum: float = 0, strict: bool = False):
    """An argparse type: ``kind`` (int or float) at least ``minimum`` (above it when ``strict``)."""
    relation = ">" if strict else ">="

    def parse(value: str):
        try:
            parsed = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"Invalid option value. Got {value}") from None  # tritonserver's words
        if parsed < minimum or (strict and parsed == minimum):
            raise argparse.ArgumentTypeError(f"value must be {relation} {minimum}, got {value}")
        return parsed

    return parse


def _trace_level(value: str) -> str:
    try:
        return cli_level(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(kind: type):
    return number(kind, strict=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--allow-client-shm", type=parse_bool, default=False,
        help="allow clients to register system/CUDA shared memory regions (default false)")
    add("--http-restricted-api", action="append", default=[],
        help="<group>[,<group>...]:<header>=<value>: require that header on those HTTP APIs")
    add("--grpc-restricted-protocol", action="append", default=[],
        help="<group>[,<group>...]:<header>=<value>: require that metadata on those RPCs")
    add("--trace-config", action="append", default=[],
        help="[<mode>,]<setting>=<value>: level, rate, count, log-frequency, file, mode")
    add("--trace-file", default=None)
    add("--trace-level", action="append", default=[], type=_trace_level,
        help="OFF, TIMESTAMPS, TENSORS (or tritonserver's MIN, MAX, ON, TRUE, FALSE); OFF once turns tracing off")
    add("--trace-rate", type=number(int, minimum=-2**63), default=None)  # range checked as --trace-config rate=
    add("--trace-count", type=number(int, minimum=-2**63), default=None)
    add("--trace-log-frequency", type=number(int, minimum=-2**63), default=None)
    add("--log-file", default="", help="write the log to this file (read-only through the logging API)")
    add("--grpc-use-ssl", type=parse_bool, default=False)
    add("--grpc-use-ssl-mutual", type=parse_bool, default=False)
    add("--grpc-server-cert", default="")
    add("--grpc-server-key", default="")
    add("--grpc-root-cert", default="")
    add("--http-ssl-cert", default="", help="serve HTTPS with this certificate (PEM)")
    add("--http-ssl-key", default="", help="private key of --http-ssl-cert (PEM)")
    add("--http-ssl-ca", default="", help="CA certificates that client certificates must chain to")
    add("--http-ssl-mutual", type=parse_bool, default=False, help="require a client certificate")
    add("--http-max-header-size", type=_positive(int), default=64 * 1024,
        help="bytes of request line + headers one HTTP request may send (HTTP and metrics ports)")
    add("--http-read-timeout-secs", type=_positive(float), default=60.0,
        help="seconds a client may take to send one whole HTTP request (HTTP and metrics ports)")
    add("--grpc-max-message-size", type=_positive(int), default=GRPC_MAX_MESSAGE_SIZE)
    add("--grpc-max-metadata-size", type=_positive(int), default=64 * 1024)
    defaults = GrpcKeepalive()
    add("--grpc-keepalive-time", type=_positive(int), default=defaults.time_ms,
        help="ms between the server's keepalive pings on a connection")
    add("--grpc-keepalive-timeout", type=_positive(int), default=defaults.timeout_ms,
        help="ms to wait for a keepalive ping's acknowledgement before closing the connection")
    add("--grpc-keepalive-permit-without-calls", type=parse_bool, default=defaults.permit_without_calls,
        help="keepalive pings (both ways) also on connections without calls")
    add("--grpc-http2-max-pings-without-data", type=number(int), default=defaults.max_pings_without_data,
        help="pings the server sends without data in between (0: no limit)")
    add("--grpc-http2-min-recv-ping-interval-without-data", type=number(int),
        default=defaults.min_recv_ping_interval_without_data_ms,
        help="ms a client must leave between pings when no data is sent, else it earns a strike")
    add("--grpc-http2-max-ping-strikes", type=number(int), default=defaults.max_ping_strikes,
        help="strikes before the connection is closed with GOAWAY ENHANCE_YOUR_CALM (0: no limit)")
    add("--grpc-max-connection-age", type=number(int), default=defaults.max_connection_age_ms,
        help="ms after which a connection gets GOAWAY (+-10%%), so clients reconnect (0: never)")
    add("--grpc-max-connection-age-grace", type=number(int), default=defaults.max_connection_age_grace_ms,
        help="ms after that GOAWAY before the connection is closed with calls still open (0: waits for them)")
    add("--grpc-infer-allocation-pool-size", type=number(int), default=8,
        help="accepted for tritonserver compatibility (Ferry keeps no response-object pool)")
    add("--grpc-infer-response-compression-level", type=lowered, choices=["none", "low", "med", "high"], default="none",
        help="compress gRPC responses (gzip or deflate, as the client accepts)")


def _existing(parser: argparse.ArgumentParser, flag: str, path: str) -> str:
    if not os.path.isfile(path):
        parser.error(f"{flag} '{path}': no such file")
    return path


def _tls(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[TlsOptions | None, TlsOptions | None]:
    http = None
    if args.http_ssl_cert or args.http_ssl_key:
        if not (args.http_ssl_cert and args.http_ssl_key):
            parser.error("--http-ssl-cert and --http-ssl-key must be given together")
        if args.http_ssl_mutual and not args.http_ssl_ca:
            parser.error("--http-ssl-mutual=true needs --http-ssl-ca")
        http = TlsOptions(
            _existing(parser, "--http-ssl-cert", args.http_ssl_cert),
            _existing(parser, "--http-ssl-key", args.http_ssl_key),
            _existing(parser, "--http-ssl-ca", args.http_ssl_ca) if args.http_ssl_ca else "",
            args.http_ssl_mutual,
        )
    elif args.http_ssl_mutual:
        parser.error("--http-ssl-mutual=true needs --http-ssl-cert and --http-ssl-key")
    grpc = None
    if args.grpc_use_ssl or args.grpc_use_ssl_mutual:
        if not (args.grpc_server_cert and args.grpc_server_key):
            parser.error("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
        if args.grpc_use_ssl_mutual and not args.grpc_root_cert:
            parser.error("--grpc-use-ssl-mutual=true needs --grpc-root-cert")
        grpc = TlsOptions(
            _existing(parser, "--grpc-server-cert", args.grpc_server_cert),
            _existing(parser, "--grpc-server-key", args.grpc_server_key),
            _existing(parser, "--grpc-root-cert", args.grpc_root_cert) if args.grpc_root_cert else "",
            args.grpc_use_ssl_mutual,
        )
    return http, grpc


def apply(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(engine_fields, server_fields)`` for EngineOptions / ServerOptions from the parsed flags."""
    legacy = [f"level={level}" for level in args.trace_level]
    for key, value in (("file", args.trace_file), ("rate", args.trace_rate), ("count", args.trace_count),
                       ("log-frequency", args.trace_log_frequency)):
        if value not in (None, ""):
            legacy.append(f"{key}={value}")
    try:
        trace = parse_trace_config(legacy + args.trace_config)
        if "OFF" in args.trace_level:  # tritonserver: a --trace-level OFF (unlike level=OFF) turns tracing off
            trace = replace(trace, level=("OFF",))
        http_restrictions = parse_restrictions(args.http_restricted_api, "--http-restricted-api")
        grpc_restrictions = parse_restrictions(args.grpc_restricted_protocol, "--grpc-restricted-protocol",
                                               GRPC_HEADER_PREFIX)
    except ValueError as exc:
        parser.error(str(exc))
    except Exception as exc:  # ServerError from the shared trace-setting validation
        parser.error(f"invalid trace setting: {exc}")
    http_tls, grpc_tls = _tls(parser, args)
    if http_tls is not None and getattr(args, "http_workers", 1) > 1:
        parser.error("--http-workers > 1 cannot be combined with HTTP TLS (workers serve plain HTTP)")
    engine = {"allow_client_shm": args.allow_client_shm, "trace": trace}
    server = {
        "log_file": args.log_file,
        "http_restrictions": http_restrictions,
        "grpc_restrictions": grpc_restrictions,
        "http_tls": http_tls,
        "grpc_tls": grpc_tls,
        "http_max_header_size": args.http_max_header_size,
        "http_read_timeout_secs": args.http_read_timeout_secs,
        "grpc_max_message_size": args.grpc_max_message_size,
        "grpc_max_metadata_size": args.grpc_max_metadata_size,
        "grpc_keepalive": GrpcKeepalive(
            args.grpc_keepalive_time, args.grpc_keepalive_timeout, args.grpc_keepalive_permit_without_calls,
            args.grpc_http2_max_pings_without_data, args.grpc_http2_min_recv_ping_interval_without_data,
            args.grpc_http2_max_ping_strikes, args.grpc_max_connection_age, args.grpc_max_connection_age_grace,
        ),
        "grpc_response_compression": args.grpc_infer_response_compression_level,
    }
    return engine, server
