"""``ferry-analyzer``: the ``profile`` and ``report`` commands (flag names follow Triton's Model Analyzer).

Every problem ends as one ``ferry-analyzer: error: ...`` line on stderr and an exit code, never a
traceback: 0 done, 1 the analysis failed (server would not start, model would not load), 2 bad input,
3 no configuration meets the constraints, 130 interrupted (the checkpoint keeps what was measured; rerun
the same command to resume).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from serving_pod.analyzer import errors
from serving_pod.analyzer.errors import AnalyzerError, InputError


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number '{value}'") from None
    if not (math.isfinite(number) and number > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got '{value}'")
    return number


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer '{value}'") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {number}")
    return number


def _non_negative_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer '{value}'") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {number}")
    return number


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ferry-analyzer", allow_abbrev=False,
        description="Find the model configuration that serves best under your constraints.")
    commands = parser.add_subparsers(dest="command", metavar="{profile,report}")
    p = commands.add_parser("profile", allow_abbrev=False, help="sweep configurations and recommend one per model")
    add = p.add_argument
    add("--model-repository", required=True, type=Path)
    add("--profile-models", required=True, help="comma-separated model names")
    add("--output-model-repository", type=Path, default=Path("output_model_repository"))
    add("--override-output-model-repository", action="store_true")
    add("--checkpoint-directory", type=Path, default=Path("checkpoints"))
    add("--run-config-search-mode", choices=["quick", "brute"], default="quick")
    add("--objective", choices=["throughput", "latency", "weighted"], default="throughput")
    add("--weights", default="throughput=1,latency=1", help="weighted objective: throughput=W,latency=W")
    add("--latency-budget-ms", type=_positive_float, help="constraint: p99 latency at most this")
    add("--min-throughput", type=_positive_float, help="constraint: inferences/s at least this")
    add("--max-memory-mb", type=_positive_float, help="constraint: server RSS at most this (MiB)")
    add("--concurrency", default="1..32", help="client concurrency: '1,2,4' or 'LOW..HIGH' (doubling)")
    add("--max-instance-count", type=_positive_int, default=3)
    add("--max-batch-sizes", default="4,16,64")
    add("--delays-us", default="0,100,1000", help="max_queue_delay_microseconds values")
    add("--dynamic-batching", default="on,off", help="'on', 'off' or 'on,off'")
    add("--preferred-batch-sizes", default="none,max", help="choices among none, max, half")
    add("--max-passes", type=_positive_int, default=2, help="quick mode: coordinate descent passes")
    add("--verify-runs", type=_non_negative_int, default=2,
        help="repeat the best points and the default's this many times; rank the medians (0: off)")
    add("--verify-top", type=_positive_int, default=3, help="how many of the best configurations to verify")
    add("--measurement-interval-ms", type=_positive_int, default=600)
    add("--stability-percentage", type=_positive_float, default=50.0)
    add("--max-trials", type=_positive_int, default=6)
    add("--protocol", choices=["http", "grpc"], default="http")
    add("--load-generator", choices=["auto", "perf_analyzer", "builtin"], default="auto")
    add("--perf-analyzer", help="path of the perf_analyzer binary")
    add("--client-cpus", default="", metavar="LIST",
        help="run perf_analyzer on these CPUs only, e.g. 1 or 2-3 (the server keeps every CPU; default: any)")
    add("--server-url", help="profile a running server (HTTP host:port) instead of starting one")
    add("--server-grpc-url", help="its gRPC host:port (with --protocol grpc)")
    add("--server-command", help="how to start ferry-server (default: this python -m serving_pod)")
    add("--server-arg", action="append", default=[], help="extra ferry-server flag (repeatable)")
    add("--server-http-port", type=int, default=0, help="HTTP port of the started server (default: any free)")
    add("--server-startup-timeout-s", type=_positive_float, default=60.0)
    add("--no-progress", action="store_true")
    r = commands.add_parser("report", allow_abbrev=False, help="render the checkpoint as a self-contained HTML report")
    r.add_argument("--checkpoint-directory", type=Path, default=Path("checkpoints"))
    r.add_argument("--output", type=Path, default=Path("ferry-analyzer-report.html"))
    r.add_argument("--csv", type=Path, help="CSV export of every measurement (default: the report's name .csv)")
    r.add_argument("--top", type=_positive_int, default=10, help="configurations per model in the tables")
    return parser


def _weights(text: str) -> tuple[float, float]:
    weights = {"throughput": 1.0, "latency": 1.0}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in weights:
            raise InputError(f"invalid --weights {text!r}: use throughput=W,latency=W")
        try:
            weights[key.strip()] = float(value)
        except ValueError:
            raise InputError(f"invalid --weights {text!r}: {value!r} is not a number") from None
    return weights["throughput"], weights["latency"]


def _client_cpus(text: str) -> tuple[int, ...]:
    from serving_pod.analyzer import placement

    try:
        return placement.parse_cpus(text, placement.usable_cpus())
    except ValueError as exc:
        raise InputError(f"invalid --client-cpus: {exc}") from None


def profile_settings(args: argparse.Namespace):
    from serving_pod.analyzer import space as sp
    from serving_pod.analyzer.loadgen import WindowSettings
    from serving_pod.analyzer.objectives import Constraints, Objective
    from serving_pod.analyzer.profile import ProfileSettings
    from serving_pod.analyzer.search import SearchSettings
    from serving_pod.analyzer.target import LaunchSettings, server_extra_args

    models = tuple(dict.fromkeys(m.strip() for m in args.profile_models.split(",") if m.strip()))
    if not models:
        raise InputError("--profile-models is empty")
    if not 0 <= args.server_http_port <= 65535:
        raise InputError(f"invalid --server-http-port {args.server_http_port}: outside 0..65535")
    switches = {"on": True, "off": False}
    space = sp.SearchSpace(
        instance_counts=tuple(range(1, args.max_instance_count + 1)),
        max_batch_sizes=sp.parse_int_list(args.max_batch_sizes, "--max-batch-sizes", minimum=1),
        dynamic_batching=tuple(switches[c] for c in sp.parse_choices(args.dynamic_batching, "--dynamic-batching",
                                                                      tuple(switches))),
        delays_us=sp.parse_int_list(args.delays_us, "--delays-us", minimum=0),
        preferred=sp.parse_choices(args.preferred_batch_sizes, "--preferred-batch-sizes", sp.PREFERRED_CHOICES),
        concurrencies=sp.parse_int_list(args.concurrency, "--concurrency", minimum=1),
    )
    tw, lw = _weights(args.weights)
    launch = LaunchSettings(
        repository=args.model_repository,
        extra_args=server_extra_args(args.server_arg),
        http_port=args.server_http_port,
        startup_timeout_s=args.server_startup_timeout_s,
        log_path=args.checkpoint_directory / "ferry-server.log",
        **({"command": LaunchSettings.parse_command(args.server_command)} if args.server_command else {}),
    )
    return ProfileSettings(
        repository=args.model_repository, models=models, output_repository=args.output_model_repository,
        checkpoint_dir=args.checkpoint_directory, space=space,
        objective=Objective(args.objective, tw, lw),
        constraints=Constraints(args.latency_budget_ms, args.min_throughput, args.max_memory_mb),
        window=WindowSettings(args.measurement_interval_ms, args.stability_percentage, args.max_trials, args.protocol,
                              _client_cpus(args.client_cpus)),
        search=SearchSettings(mode=args.run_config_search_mode, max_passes=args.max_passes,
                              verify_top=args.verify_top, verify_runs=args.verify_runs),
        override_output=args.override_output_model_repository, load_generator=args.load_generator,
        perf_analyzer=args.perf_analyzer, server_url=args.server_url, server_grpc_url=args.server_grpc_url,
        launch=launch, progress=not args.no_progress,
    )


def run_profile_command(args: argparse.Namespace) -> int:
    from serving_pod.analyzer.profile import run_profile

    settings = profile_settings(args)
    results = run_profile(settings)
    code = errors.EXIT_OK
    for result in results:
        print(f"{result.model}: {result.message}")
        print(f"{result.model}: {result.measured} measurement(s) taken, {result.reused} reused from the checkpoint")
        if result.output_dir is not None:
            print(f"{result.model}: wrote {result.output_dir / 'config.pbtxt'}")
        if not result.feasible:
            code = errors.EXIT_INFEASIBLE
    if code == errors.EXIT_INFEASIBLE:
        print("ferry-analyzer: error: no configuration meets the constraints for "
              + ", ".join(r.model for r in results if not r.feasible)
              + " (relax --latency-budget-ms / --min-throughput / --max-memory-mb)", file=sys.stderr)
    return code


def run_report_command(args: argparse.Namespace) -> int:
    from serving_pod.analyzer.report import write_report

    csv_path = args.csv or args.output.with_suffix(".csv")
    write_report(args.checkpoint_directory, args.output, csv_path, top=args.top)
    print(f"wrote {args.output} and {csv_path}")
    return errors.EXIT_OK


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so a started server is stopped and the checkpoint stays consistent."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed usage and the error
        return int(exc.code or 0)
    if args.command is None:
        parser.print_help(sys.stderr)
        return errors.EXIT_USAGE
    try:
        with _terminate_as_interrupt():
            if args.command == "profile":
                return run_profile_command(args)
            return run_report_command(args)
    except AnalyzerError as exc:
        print(f"ferry-analyzer: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("\nferry-analyzer: interrupted; measurements so far are in the checkpoint — rerun the same command "
              "to resume", file=sys.stderr)
        return errors.EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
