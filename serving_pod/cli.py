"""``ferry-server``: tritonserver's command line, with the same flag names and defaults.

``ferry-server download <uri> <dest>`` is the storage initializer (used as the init container of
serving pods). Unknown or malformed flags print a clear error and exit with code 2 (tritonserver: 1, after
its whole usage text). Values are read as tritonserver reads them: booleans true/false, on/off, 1/0 in any
case; ``--model-control-mode`` and ``--rate-limit`` in any case; a repository path given twice is one
repository. Where tritonserver takes junk (``--http-port=8000x`` read as 8000, negative ports, sizes and
timeouts), Ferry refuses it. Without ``--model-repository`` Ferry serves its embedded example repository
(tritonserver refuses to start).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from importlib import resources
from pathlib import Path
from typing import Callable

from serving_pod import cli_compat, cli_extensions
from serving_pod.cli_extensions import number, parse_bool as _bool
from serving_pod.core.engine import REPOSITORY_FAILURE, EngineOptions
from serving_pod.logging_settings import MAX_VERBOSE_LEVEL
from serving_pod.options import DEFAULT_MAX_INPUT_SIZE, ServerOptions


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"Invalid option value. Got {value}") from None  # tritonserver's words
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is outside 0..65535")
    return port


def _log_verbose(value: str) -> int:
    """A verbose level: tritonserver's is an int32 (its words above that; it reads -1 as 0, Ferry refuses it), or
    true / false in any case (1 / 0), as tritonserver reads them."""
    level = {"true": 1, "false": 0}.get(value.lower())
    if level is not None:
        return level
    level = number(int)(value)
    if level > MAX_VERBOSE_LEVEL:
        raise argparse.ArgumentTypeError(f"Provided option value is out of bound. Got {value}")
    return level


def _backend_config(value: str) -> tuple[str, str, str]:
    """``<backend>,<setting>=<value>`` or a global ``<setting>=<value>``, refused in tritonserver's words when the
    backend (before a comma), the setting or the value is empty."""
    backend, _, setting = value.partition(",") if "," in value else ("", "", value)
    if "," in value and not backend:
        raise argparse.ArgumentTypeError(
            "No backend specified. --backend-config option format is <backend name>,<setting>=<value> or "
            f"<setting>=<value>. Got {value}")
    key, sep, val = setting.partition("=")
    if not sep or not key or not val:
        raise argparse.ArgumentTypeError(
            f"--backend-config option format is '<backend name>,<setting>=<value>'. Got {value}")
    return backend, key, val


def _word(flag: str, words: tuple[str, ...], *, any_case: bool = True) -> Callable[[str], str]:
    """An argparse type: one of ``words`` (in any case where tritonserver lowercases the value first), refused in
    tritonserver's words."""

    def parse(value: str) -> str:
        word = value.lower() if any_case else value
        if word not in words:
            raise argparse.ArgumentTypeError(f"invalid argument for {flag}")
        return word

    return parse


def _cache_config(value: str) -> tuple[str, str, str]:
    """``<cache>,<key>=<value>`` (tritonserver's form; Ferry has the ``local`` cache)."""
    from serving_pod.cache import cache_capacity

    cache, comma, setting = value.partition(",")
    if not comma or not cache:  # tritonserver's words, as for each format error here
        raise argparse.ArgumentTypeError(
            f"No cache specified. --cache-config option format is <cache name>,<setting>=<value>. Got {value}")
    key, sep, val = setting.partition("=")
    if not sep or not key or not val:
        raise argparse.ArgumentTypeError(
            f"--cache-config option format is '<cache name>,<setting>=<value>'. Got {value}")
    try:
        cache_capacity({cache: {key: val}})
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid --cache-config '{value}': {exc}") from None
    return cache, key, val


def _rate_limit_resource(value: str) -> str:
    from serving_pod.schedulers.rate_limiter import parse_resource

    try:
        parse_resource(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ferry-server",
        description="Triton-compatible inference server (KServe V2 over HTTP and gRPC).",
        allow_abbrev=False,
    )
    add = parser.add_argument
    add("--model-repository", "--model-store", action="append", default=[], dest="model_repository",
        help="model repository path or URI (repeatable); default: the embedded example repository")
    add("--model-control-mode", type=_word("--model-control-mode", ("none", "poll", "explicit")), default="none",
        metavar="{none,poll,explicit}")
    add("--load-model", action="append", default=[], help="model to load at start in explicit mode ('*' = all)")
    add("--repository-poll-secs", type=number(float), default=15.0)
    add("--strict-readiness", type=_bool, default=True)
    add("--exit-timeout-secs", type=number(float), default=30.0)
    add("--exit-on-error", type=_bool, default=True,
        help="exit when a model fails to load at start (as tritonserver)")
    add("--id", default="triton", help="server identifier reported in server metadata")
    add("--allow-http", type=_bool, default=True)
    add("--allow-grpc", type=_bool, default=True)
    add("--allow-metrics", type=_bool, default=True)
    add("--allow-gpu-metrics", type=_bool, default=True)
    add("--allow-cpu-metrics", type=_bool, default=True)
    add("--http-address", default="0.0.0.0")
    add("--grpc-address", default="0.0.0.0")
    add("--metrics-address", default="0.0.0.0")
    add("--http-port", type=_port, default=8000)
    add("--grpc-port", type=_port, default=8001)
    add("--metrics-port", type=_port, default=8002)
    add("--http-max-input-size", type=number(int), default=DEFAULT_MAX_INPUT_SIZE)
    add("--http-workers", type=number(int, minimum=1), default=1,
        help="HTTP protocol processes sharing this server's engine (1 = this process only)")
    add("--grpc-server", choices=["native", "grpcio"], default="native",
        help="gRPC front end: native (HTTP/2 on the event loop, the fast path) or grpcio (grpc.aio)")
    add("--disable-auto-complete-config", action="store_true")
    add("--strict-model-config", type=_bool, default=None,
        help="deprecated tritonserver flag: true is --disable-auto-complete-config")
    add("--backend-config", action="append", default=[], type=_backend_config)
    add("--default-instance-kind", choices=["KIND_AUTO", "KIND_CPU", "KIND_GPU"],
        default=os.environ.get("FERRY_INSTANCE_KIND", "KIND_AUTO"),
        help="kind of instance groups that say KIND_AUTO or are absent (the operator sets "
             "FERRY_INSTANCE_KIND=KIND_GPU on GPU pods)")
    add("--cache-config", action="append", default=[], type=_cache_config,
        help="response cache: local,size=<bytes> (models opt in with response_cache { enable: true })")
    add("--response-cache-byte-size", type=number(int), default=None,
        help="deprecated tritonserver flag: same as --cache-config local,size=<bytes>")
    add("--rate-limit", type=_word("--rate-limit", ("off", "execution_count")), default="off",
        metavar="{off,execution_count}")
    add("--rate-limit-resource", action="append", default=[], type=_rate_limit_resource,
        help="<name>:<count>[:<device>] copies of a rate limiter resource (repeatable)")
    add("--log-verbose", type=_log_verbose, default=0)
    add("--log-info", type=_bool, default=True)
    add("--log-warning", type=_bool, default=True)
    add("--log-error", type=_bool, default=True)
    add("--log-format", type=_word("--log-format", ("default", "ISO8601"), any_case=False), default="default",
        metavar="{default,ISO8601}")
    cli_extensions.add_arguments(parser)
    cli_compat.add_arguments(parser)
    return parser


def default_repository() -> str:
    """The embedded example model repository shipped inside the package."""
    return str(Path(str(resources.files("serving_pod") / "default_models")))


def _check_combinations(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """tritonserver's checks across flags, in its words (exit 2): both cache flags, ``--load-model`` outside explicit
    mode, and two enabled endpoints on one address and port (port 0, "any free port" in Ferry, never clashes)."""
    if args.response_cache_byte_size is not None and args.cache_config:
        parser.error("Error: Incompatible flags --response-cache-byte-size and --cache-config both provided. "
                     "Please provide one or the other.")
    if args.load_model and args.model_control_mode != "explicit":
        parser.error("Use of '--load-model' requires setting '--model-control-mode=explicit' as well.")
    endpoints = [("HTTP", args.allow_http, args.http_address, args.http_port),
                 ("GRPC", args.allow_grpc, args.grpc_address, args.grpc_port),
                 ("metrics", args.allow_metrics, args.metrics_address, args.metrics_port)]
    for i, (first, on, address, port) in enumerate(endpoints):
        for second, other_on, other_address, other_port in endpoints[i + 1:]:
            if on and other_on and port and (address, port) == (other_address, other_port):
                parser.error(f"The server cannot listen to {first} requests and {second} requests at the same "
                             f"address and port {address}:{port}")


def options_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> ServerOptions:
    parser = parser or build_parser()
    _check_combinations(parser, args)
    engine_extra, server_extra = cli_extensions.apply(parser, args)
    compat_engine, compat_server, ignored, warnings = cli_compat.apply(parser, args)
    backend_config: dict[str, dict[str, str]] = {}
    for backend, key, value in args.backend_config:
        backend_config.setdefault(backend, {})[key] = value
    autocomplete = not args.disable_auto_complete_config and not args.strict_model_config
    cache_config: dict[str, dict[str, str]] = {}
    if args.response_cache_byte_size is not None:
        cache_config.setdefault("local", {})["size"] = str(args.response_cache_byte_size)
    for cache, key, value in args.cache_config:
        cache_config.setdefault(cache, {})[key] = value
    if args.response_cache_byte_size is not None:  # checked as --cache-config is: too small, tritonserver exits
        from serving_pod.cache import cache_capacity

        try:
            cache_capacity(cache_config)
        except ValueError as exc:
            parser.error(f"--response-cache-byte-size: {exc}")
    engine = EngineOptions(
        # a path given twice is one repository (tritonserver keeps them in a set), not duplicate models
        model_repositories=tuple(dict.fromkeys(args.model_repository)) or (default_repository(),),
        model_control_mode=args.model_control_mode,
        load_models=tuple(args.load_model),
        repository_poll_secs=args.repository_poll_secs,
        strict_readiness=args.strict_readiness,
        exit_timeout_secs=args.exit_timeout_secs,
        autocomplete=autocomplete,
        backend_config=backend_config,
        server_id=args.id,
        default_instance_kind=args.default_instance_kind,
        cache_config=cache_config,
        rate_limit=args.rate_limit,
        rate_limit_resources=tuple(args.rate_limit_resource),
        **engine_extra,
        **compat_engine,
    )
    return ServerOptions(
        engine=engine,
        gc_freeze=True,
        allow_http=args.allow_http,
        allow_grpc=args.allow_grpc,
        allow_metrics=args.allow_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics,
        allow_cpu_metrics=args.allow_cpu_metrics,
        http_address=args.http_address,
        grpc_address=args.grpc_address,
        metrics_address=args.metrics_address,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        http_max_input_size=args.http_max_input_size,
        http_workers=args.http_workers,
        grpc_server=args.grpc_server,
        log_verbose=args.log_verbose,
        log_format=args.log_format,
        log_info=args.log_info,
        log_warning=args.log_warning,
        log_error=args.log_error,
        ignored_flags=tuple(ignored),
        startup_warnings=tuple(warnings),
        **server_extra,
        **compat_server,
    )


def configure_logging(options: ServerOptions) -> None:
    """Install the root log handler (stderr or --log-file) whose settings /v2/logging changes."""
    from serving_pod.logging_settings import LogSettings

    LogSettings(
        file=options.log_file, info=options.log_info, warning=options.log_warning,
        error=options.log_error, verbose=options.log_verbose, format=options.log_format,
    ).install()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "download":
        from serving_pod.storage.cli import main as download_main

        return download_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    options = options_from_args(args, parser)
    configure_logging(options)
    if options.ignored_flags:
        logging.getLogger("ferry").info("tritonserver flags accepted with no effect: %s", "; ".join(options.ignored_flags))
    for warning in options.startup_warnings:
        logging.getLogger("ferry").warning("%s", warning)
    return run(options, exit_on_error=args.exit_on_error)


def unusable_repositories(locations: tuple[str, ...]) -> dict[str, str]:
    """Local ``--model-repository`` paths that are missing or not directories, each with tritonserver's error
    (object-storage URIs are checked when listed)."""
    errors: dict[str, str] = {}
    for location in locations:
        if "://" in location and not location.startswith("file://"):
            continue
        path = Path(location.removeprefix("file://")).expanduser()
        if not path.exists():
            errors[location] = f"failed to stat file {location}"
        elif not path.is_dir():
            errors[location] = "repository path is not a valid directory"
    return errors


def run(options: ServerOptions, *, exit_on_error: bool = True) -> int:
    """Serve until a signal. Like tritonserver, exit 1 at start when a repository cannot be read or a model
    (in every control mode) fails to load, unless ``exit_on_error`` is false: then serve what loaded, not ready
    under strict readiness."""
    from serving_pod.allocator import MMAP_THRESHOLD, keep_freed_memory
    from serving_pod.server import FerryServer

    log = logging.getLogger("ferry")
    kept = keep_freed_memory()
    done = f"freed blocks up to {MMAP_THRESHOLD >> 20} MiB kept for reuse"
    log.debug("malloc: %s", f"left as it is: {kept}" if kept else done)
    unusable = unusable_repositories(options.engine.model_repositories)
    for location, error in unusable.items():
        log.error("model repository %s: %s", location, error)
    if unusable and exit_on_error:
        log.error("exiting: the model repository cannot be read (use --exit-on-error=false to serve without it)")
        return 1

    async def serve() -> int:
        server = FerryServer(options)
        server.install_signal_handlers()
        try:
            await server.start()
        except OSError as exc:
            log.error("failed to start: %s", exc)
            return 1
        if server.engine.startup_failures and exit_on_error:
            log.error(
                "exiting: %d model(s) failed to load (use --exit-on-error=false to keep serving the others)",
                len(server.engine.startup_failures),
            )
            await server.stop()
            return 1
        for location, error in unusable.items():  # a startup failure: strict readiness stays false
            server.engine.startup_failures[REPOSITORY_FAILURE + location] = error
        await server.wait_for_signal()
        await server.stop()
        return 0

    try:
        import uvloop

        return uvloop.run(serve())
    except ImportError:
        return asyncio.run(serve())


if __name__ == "__main__":
    sys.exit(main())
