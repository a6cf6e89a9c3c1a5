"""Ferry vs NVIDIA Triton 2.51, side by side with perf_analyzer 2.50 (the performance issue's comparison).

Servers run in turn (A B A B ...) on the same ports with the same model and the same perf_analyzer flags
(HTTP and gRPC, each concurrency level); medians over rounds go into a table with Ferry/Triton ratios.
Each server start also yields startup time (spawn to ``/v2/health/ready`` and the model ready) and idle
RSS; ``--soak-minutes`` adds a long c=16 run sampling Ferry's RSS (growth between minute 1 and the end).
Tools are installed on demand into ``.tools/``. JSON and CSV go to ``benchmarks/results/`` (gitignored)::

    python -m benchmarks.compare_triton                     # both servers, 2 rounds, ~4 minutes
    python -m benchmarks.compare_triton --servers triton    # the harness against Triton alone
    python -m benchmarks.compare_triton --soak-minutes 5 --ferry-variant "tuned=--log-verbose=0"

Other shapes of work, with the models in ``benchmarks/models`` (benchmarks/README.md has the figures)::

    python -m benchmarks.compare_triton --model double_ensemble           # an ensemble of two python steps
    python -m benchmarks.compare_triton --model bls_double_py --also-load double_py   # BLS calls
    python -m benchmarks.compare_triton --model stream_py --protocols grpc --perf-arg=--streaming  # decoupled
    python -m benchmarks.compare_triton --model large_py                   # 1 MiB tensors in and out
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks import hostprobe, loadgen, perfcsv, report, servers
from benchmarks.soak import SoakResult, soak
from tests.support.perf_analyzer import PERF_ANALYZER_VERSION, Located
from tests.support.triton import TRITON_VERSION, ensure_triton

RESULTS = Path(__file__).resolve().parent / "results"
MIB = 1024 * 1024


@dataclass(frozen=True)
class ServerRun:
    """One start of one server in one round."""

    server: str
    round: int
    startup_s: float
    idle_rss_mib: float
    loaded_rss_mib: float
    exit_code: int | None
    reported: str
    #: digest of the model's answer to one seeded request (``servers.sample_answer``): the same for every server
    answer: str = ""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compare_triton", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="triton,ferry", help="comma list of triton, ferry (default both)")
    p.add_argument("--model", default="double_py")
    p.add_argument("--model-repository", type=Path, default=servers.BENCH_MODELS)
    p.add_argument("--also-load", action="append", default=[], metavar="MODEL",
                   help="another model both servers load (a model the measured one calls, e.g. by BLS; repeatable)")
    p.add_argument("--perf-arg", action="append", default=[], metavar="ARG",
                   help="extra perf_analyzer flag for every point, e.g. --perf-arg=--streaming (repeatable)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--protocols", default="http,grpc")
    p.add_argument("--concurrency", default="1,16", help="e.g. 1,16 or 1..64 (powers of two)")
    p.add_argument("--measurement-interval", type=int, default=2000, help="perf_analyzer window, ms")
    p.add_argument("--stability-percentage", type=float, default=10.0)
    p.add_argument("--max-trials", type=int, default=6, help="windows before a point counts as unstable")
    p.add_argument("--retries", type=int, default=0, help="re-runs of a point that never stabilized")
    p.add_argument("--ferry-arg", action="append", default=[], help="extra ferry-server flag (repeatable)")
    p.add_argument("--ferry-variant", action="append", default=[], metavar="NAME=ARGS",
                   help="another Ferry configuration in the rotation, e.g. 'w2=--http-workers=2'")
    p.add_argument("--triton-arg", action="append", default=[], help="extra tritonserver flag (repeatable)")
    loadgen.add_client_cpus(p)
    p.add_argument("--soak-minutes", type=float, default=0.0, help="c=16 load on Ferry sampling RSS")
    p.add_argument("--soak-protocols", default="http", help="comma list of http, grpc: one soak each")
    p.add_argument("--no-default-startup", action="store_true",
                   help="skip timing ferry-server on its embedded default models")
    p.add_argument("--settle", type=float, default=2.0, help="seconds after ready before idle RSS")
    p.add_argument("--warmup", type=float, default=5.0,
                   help="seconds of unmeasured load (first protocol, highest concurrency) after each start")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    try:
        args.concurrency_levels = perfcsv.concurrency_list(args.concurrency)
    except ValueError as exc:
        p.error(str(exc))
    args.protocol_list = [x.strip() for x in args.protocols.split(",") if x.strip()]
    bad = [x for x in args.protocol_list if x not in perfcsv.PROTOCOLS]
    if bad or not args.protocol_list:
        p.error(f"--protocols must be a comma list of {perfcsv.PROTOCOLS}, got {args.protocols!r}")
    args.server_list = [x.strip() for x in args.servers.split(",") if x.strip()]
    if not args.server_list or any(x not in ("triton", "ferry") for x in args.server_list):
        p.error(f"--servers must be a comma list of triton, ferry; got {args.servers!r}")
    for variant in args.ferry_variant:
        if "=" not in variant or not variant.partition("=")[0]:
            p.error(f"--ferry-variant must be NAME=ARGS, got {variant!r}")
    if not set(args.soak_protocols.split(",")) <= {"http", "grpc"}:
        p.error(f"--soak-protocols takes http and/or grpc, got {args.soak_protocols!r}")
    if args.rounds < 1 or args.measurement_interval < 100 or args.soak_minutes < 0 or args.warmup < 0:
        p.error("--rounds >= 1, --measurement-interval >= 100 ms, --soak-minutes >= 0 and --warmup >= 0 "
                "are required")
    for model in (args.model, *args.also_load):
        if not (args.model_repository / model / "config.pbtxt").exists():
            p.error(f"model {model!r} not found in {args.model_repository}")
    return args


def ferry_available() -> str:
    """Empty string when ``ferry-server --help`` works, else why not."""
    env = servers.ferry_spec("probe", [], [], servers.Ports(0, 0, 0)).env
    try:
        proc = subprocess.run([*servers.ferry_base_command(), "--help"], capture_output=True, text=True,
                              timeout=60, env=dict(env))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return "" if proc.returncode == 0 else " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-2:])


def build_specs(args: argparse.Namespace, ports: servers.Ports) -> list[servers.ServerSpec]:
    repos, models = [args.model_repository], [args.model, *args.also_load]
    specs = []
    for name in args.server_list:
        if name == "triton":
            triton = ensure_triton()
            if not triton.ok:
                raise SystemExit(f"error: {triton.reason}")
            specs.append(servers.triton_spec("triton", triton.command(), triton.env, repos, models, ports,
                                             args.triton_arg))
        else:
            why = ferry_available()
            if why:
                raise SystemExit(f"error: ferry-server is not usable yet ({why}); try --servers triton")
            specs.append(servers.ferry_spec("ferry", repos, models, ports, args.ferry_arg))
            for variant in args.ferry_variant:
                label, _, extra = variant.partition("=")
                specs.append(servers.ferry_spec(f"ferry-{label}", repos, models, ports,
                                                [*args.ferry_arg, *shlex.split(extra)]))
    return specs


def server_identity(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2", timeout=5) as resp:
            meta = json.load(resp)
        return f"{meta.get('name')} {meta.get('version')}"
    except (OSError, ValueError):
        return "?"


def measure_round(args: argparse.Namespace, spec: servers.ServerSpec, ports: servers.Ports, pa: Located,
                  round_no: int, log_dir: Path) -> tuple[list[report.Measurement], ServerRun]:
    measurements = []
    with servers.Server(spec, ports, log_dir / f"{spec.name}-r{round_no}.server.log") as srv:
        startup = srv.start(models=[args.model])
        time.sleep(args.settle)
        idle = srv.rss_bytes() / MIB
        identity = server_identity(ports.http)
        answer = servers.sample_answer(ports.http, args.model, grpc_port=ports.grpc)
        print(f"[round {round_no}] {spec.name} ({identity}) ready in {startup:.2f} s, idle RSS {idle:.1f} MiB",
              flush=True)
        first = args.protocol_list[0]
        warm = perfcsv.PerfSpec(args.model, ports.url(first), first, max(args.concurrency_levels),
                                extra=tuple(args.perf_arg), cpus=args.client_cpus)
        loadgen.warm_up(pa.command(), pa.env, warm, log_dir, f"{spec.name}-r{round_no}-warmup", args.warmup)
        for protocol in args.protocol_list:
            url = ports.url(protocol)
            for conc in args.concurrency_levels:
                point = perfcsv.PerfSpec(args.model, url, protocol, conc, args.measurement_interval, 99,
                                         args.stability_percentage, args.max_trials, tuple(args.perf_arg),
                                         cpus=args.client_cpus)
                res, measurement, used = loadgen.measure_point(
                    pa.command(), pa.env, point, log_dir, f"{spec.name}-r{round_no}-{protocol}-c{conc}",
                    server=spec.name, round_no=round_no, server_pid=srv.pid, http_port=ports.http,
                    retries=args.retries)
                measurements.append(measurement)
                status = (f"{res.throughput:9.1f} infer/s  p99 {res.p99_us / 1000:6.2f} ms"
                          + ("" if res.stable else "  (unstable: medians of windows)")
                          + f"  {used.describe()}"
                          if res.ok else f"FAILED: {res.error}")
                print(f"    {protocol:<4} c={conc:<3} {status}", flush=True)
                if not srv.alive():
                    raise servers.ServerError(f"{spec.name} died during the run: {srv.log_tail()}")
        loaded = srv.rss_bytes() / MIB
        code = srv.stop()
    return measurements, ServerRun(spec.name, round_no, startup, idle, loaded, code, identity, answer)


def repository_ready(port: int) -> tuple[bool, list[str]]:
    """Whether every model in the repository index is READY, and the index's model names."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/repository/index", data=b"{}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            index = json.load(resp)
    except (OSError, ValueError):
        return False, []
    return bool(index) and all(m.get("state") == "READY" for m in index), [m.get("name", "?") for m in index]


def default_startup(ports: servers.Ports, log_dir: Path, settle: float) -> dict[str, Any]:
    """``ferry-server`` with only the port flags (its embedded default model repository).

    ``startup_s``: spawn to ``/v2/health/ready`` = 200; ``models_ready_s``: until the repository index
    shows every model READY (they should coincide under strict readiness).
    """
    base = servers.ferry_spec("ferry-default", [], [], ports)
    argv = (*servers.ferry_base_command(), f"--http-port={ports.http}", f"--grpc-port={ports.grpc}",
            f"--metrics-port={ports.metrics}")
    spec = servers.ServerSpec("ferry-default", argv, base.env)
    try:
        with servers.Server(spec, ports, log_dir / "ferry-default.server.log") as srv:
            startup = srv.start(timeout=60)
            while not (ready := repository_ready(ports.http))[0]:
                if time.monotonic() - srv.began > 60:
                    raise servers.ServerError(f"default models not all READY after 60 s: {ready[1]}")
                time.sleep(0.01)
            models_ready = time.monotonic() - srv.began
            time.sleep(settle)
            return {"startup_s": startup, "models_ready_s": models_ready, "models": ready[1],
                    "idle_rss_mib": srv.rss_bytes() / MIB, "argv": list(argv)}
    except servers.ServerError as exc:
        return {"error": str(exc), "argv": list(argv)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pa, stamp = loadgen.start_run()
    if pa is None:
        return 2
    ports = servers.free_ports()
    specs = build_specs(args, ports)
    log_dir = args.out / f"compare_triton-{stamp}"
    load = os.getloadavg()
    print(f"servers {[s.name for s in specs]}, model {args.model}, ports {asdict(ports)}, logs in {log_dir}")
    if load[0] > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {load[0]:.1f} on {os.cpu_count()} CPUs before starting: other work on this "
              "machine skews absolute figures (A B A B rounds keep the ratios comparable)")
    loopback = hostprobe.probe()
    print(f"host: {loopback.describe()}")
    measurements: list[report.Measurement] = []
    runs: list[ServerRun] = []
    for round_no in range(1, args.rounds + 1):
        for spec in specs:
            got, run = measure_round(args, spec, ports, pa, round_no, log_dir)
            measurements += got
            runs.append(run)
    soaks: list[SoakResult] = []
    if args.soak_minutes > 0:
        for spec in specs:
            if not spec.name.startswith("ferry"):
                continue
            for protocol in args.soak_protocols.split(","):
                print(f"soak: {spec.name} {protocol} c=16 for {args.soak_minutes:g} min", flush=True)
                soaks.append(soak(spec, ports, pa, args.model, args.soak_minutes, log_dir, protocol=protocol))
    default = ({} if args.no_default_startup or "ferry" not in args.server_list
               else default_startup(ports, log_dir, args.settle))
    summaries = report.summarize(measurements)
    ratio_rows = report.ratios(summaries, "triton", measurements) if "triton" in args.server_list else []
    print("\n" + report.format_table(summaries, ratio_rows))
    print("\n" + format_runs(runs, soaks, default))
    answers = {run.answer for run in runs}
    print(f"answers: {'the same from every server' if len(answers) == 1 else 'DIFFER between servers'} "
          f"({', '.join(sorted({f'{run.server} {run.answer}' for run in runs}))})")
    payload = {
        "kind": "compare_triton", "started_utc": stamp, "model": args.model, "also_loaded": args.also_load,
        "host": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                 "loadavg_start": load, "loadavg_end": os.getloadavg(), "loopback": loopback.as_dict()},
        "tools": {"perf_analyzer": PERF_ANALYZER_VERSION, "triton": TRITON_VERSION},
        "flags": {"measurement_interval_ms": args.measurement_interval, "percentile": 99, "rounds": args.rounds,
                  "stability_percentage": args.stability_percentage, "max_trials": args.max_trials,
                  "client_cpus": list(args.client_cpus), "perf_analyzer_extra": args.perf_arg},
        "servers": [{"name": s.name, "argv": list(s.argv)} for s in specs],
        "measurements": [asdict(m) for m in measurements], "summary": [asdict(s) for s in summaries],
        "ratios": [asdict(r) | {"throughput_ok": r.throughput_ok, "p99_ok": r.p99_ok} for r in ratio_rows],
        "server_runs": [asdict(r) for r in runs], "soak": [asdict(s) for s in soaks], "default_startup": default,
    }
    json_path = args.out / f"compare_triton-{stamp}.json"
    report.write_json(json_path, payload)
    report.write_csv(args.out / f"compare_triton-{stamp}.csv", summaries)
    print(f"\nwrote {json_path} and {json_path.with_suffix('.csv')}")
    return 0


def format_runs(runs: list[ServerRun], soaks: list[SoakResult], default: dict[str, Any]) -> str:
    lines = [f"{'server':<16} {'startup s (median)':>18} {'idle RSS MiB':>13} {'RSS after load MiB':>19}"]
    for name in dict.fromkeys(r.server for r in runs):
        mine = [r for r in runs if r.server == name]
        med = report.median
        lines.append(f"{name:<16} {med([r.startup_s for r in mine]):>18.2f} "
                     f"{med([r.idle_rss_mib for r in mine]):>13.1f} {med([r.loaded_rss_mib for r in mine]):>19.1f}")
    for s in soaks:
        lines.append(f"soak {s.server}: {s.minutes:g} min c=16 {s.protocol}: RSS at 1 min {s.rss_1min_mib:.1f} MiB, "
                     f"at end {s.rss_end_mib:.1f} MiB, growth {100 * s.growth:+.1f}% (target within 10%), "
                     f"{s.requests} requests served"
                     + (f" [error: {s.error}]" if s.error else ""))
    if default:
        lines.append(f"ferry on embedded default models {default['models']}: ready in {default['startup_s']:.2f} s, "
                     f"all models READY in {default['models_ready_s']:.2f} s (target < 3 s), "
                     f"idle RSS {default['idle_rss_mib']:.1f} MiB" if "startup_s" in default
                     else f"ferry on embedded default models: FAILED {default.get('error')}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
