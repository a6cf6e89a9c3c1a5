"""Dynamic batching on vs off with perf_analyzer: throughput and p99 over concurrency 1..64, plus a PNG.

One server loads two copies of the same model from a generated repository: ``<model>_batched`` (the shipped
config, ``dynamic_batching`` on) and ``<model>_unbatched`` (``dynamic_batching`` removed; the server runs with
``--disable-auto-complete-config`` so nothing turns it back on). At each concurrency both copies are measured
back to back (order alternating between ``--rounds``; figures are medians). Prints a table, the
batched/unbatched throughput ratio at c=16 (target >= 2x for the ONNX MLP), each copy's average executed
batch size and time per stage (queue, compute input / infer / output: Triton's statistics, so per execution
for the compute stages), and writes JSON, CSV and a throughput-vs-p99 plot to benchmarks/results/::

    python -m benchmarks.batching                                   # Ferry, mlp_onnx, HTTP, c = 1..64
    python -m benchmarks.batching --server triton --model double_py # the harness against NVIDIA Triton
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

from benchmarks import hostprobe, loadgen, perfcsv, report, servers
from tests.support.triton import ensure_triton

RESULTS = Path(__file__).resolve().parent / "results"
BATCHED, UNBATCHED = "batched", "unbatched"
TARGET_CONCURRENCY = 16
TARGET_RATIO = 2.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.batching", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", choices=["ferry", "triton"], default="ferry")
    p.add_argument("--model", default="mlp_onnx", help="a model under --model-repository")
    p.add_argument("--model-repository", type=Path, default=servers.BENCH_MODELS)
    p.add_argument("--protocol", choices=perfcsv.PROTOCOLS, default="http")
    p.add_argument("--concurrency", default="1..64", help="e.g. 1..64 (powers of two) or 1,16")
    p.add_argument("--measurement-interval", type=int, default=2000, help="perf_analyzer window, ms")
    p.add_argument("--max-trials", type=int, default=6)
    p.add_argument("--rounds", type=int, default=1, help="sweeps over all levels; figures are medians")
    p.add_argument("--server-arg", action="append", default=[], help="extra server flag (repeatable)")
    p.add_argument("--warmup", type=float, default=5.0,
                   help="seconds of unmeasured load on each copy (highest concurrency) before the first round")
    loadgen.add_client_cpus(p)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    try:
        args.levels = perfcsv.concurrency_list(args.concurrency)
    except ValueError as exc:
        p.error(str(exc))
    if not (args.model_repository / args.model / "config.pbtxt").exists():
        p.error(f"model {args.model!r} not found in {args.model_repository}")
    if args.measurement_interval < 100 or args.rounds < 1 or args.warmup < 0:
        p.error("--measurement-interval must be >= 100 ms, --rounds >= 1 and --warmup >= 0")
    return args


def make_repository(source: Path, dest: Path) -> dict[str, str]:
    """Write the batched and unbatched copies of ``source`` into ``dest``; returns label -> model name."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse((source / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    if config.max_batch_size < 2:
        raise SystemExit(f"error: {source.name} has max_batch_size {config.max_batch_size}; batching needs >= 2")
    names = {}
    for label in (BATCHED, UNBATCHED):
        name = f"{source.name}_{label}"
        variant = model_config_pb2.ModelConfig()
        variant.CopyFrom(config)
        variant.name = name
        if label == UNBATCHED:
            variant.ClearField("dynamic_batching")
        elif not variant.HasField("dynamic_batching"):
            variant.dynamic_batching.SetInParent()
        target = dest / name
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("config.pbtxt", "__pycache__"))
        (target / "config.pbtxt").write_text(text_format.MessageToString(variant))
        names[label] = name
    return names


#: the per-request durations of Triton's statistics that ``execution_profile`` averages
STAGES = ("queue", "compute_input", "compute_infer", "compute_output")


def execution_profile(stats: dict) -> dict[str, float]:
    """Average executed batch size and microseconds per request of each stage, from one ``model_stats`` entry.

    Triton charges every request of a batch the whole execution's compute times, so the compute stages are
    per execution as well. NaN for what the statistics cannot give (no executions, a missing field).
    """
    profile = {"batch_size": math.nan, **{stage: math.nan for stage in STAGES}}
    try:
        if stats["execution_count"]:
            profile["batch_size"] = stats["inference_count"] / stats["execution_count"]
        served = stats["inference_stats"]["success"]["count"]
        if served:
            for stage in STAGES:
                profile[stage] = stats["inference_stats"][stage]["ns"] / served / 1000
    except (KeyError, TypeError):
        pass
    return profile


def server_profile(port: int, model: str) -> dict[str, float]:
    """``execution_profile`` of ``model`` as the server at ``port`` reports it (all NaN when unreadable)."""
    try:
        (stats,) = servers.model_stats(port, model)
    except (OSError, ValueError):
        stats = {}
    return execution_profile(stats)


def format_profile(label: str, profile: dict[str, float]) -> str:
    stages = ", ".join(f"{stage.replace('_', ' ')} {profile[stage]:.0f}" for stage in STAGES)
    return f"{label}: average batch {profile['batch_size']:.2f}; us per request: {stages}"


def plot(summaries: list[report.Summary], path: Path, title: str) -> str:
    """Throughput vs p99 latency, one curve per configuration, points labelled with concurrency."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'ferry[bench]' or matplotlib): no plot"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, style in ((BATCHED, "o-"), (UNBATCHED, "s--")):
        points = sorted((s for s in summaries if s.server == label and s.rounds), key=lambda s: s.concurrency)
        ax.plot([s.p99_us / 1000 for s in points], [s.throughput for s in points], style, label=label)
        for s in points:
            ax.annotate(f"c={s.concurrency}", (s.p99_us / 1000, s.throughput), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
    ax.set_xlabel("p99 latency (ms)")
    ax.set_ylabel("throughput (infer/s)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def format_table(summaries: list[report.Summary]) -> str:
    by = {(s.server, s.concurrency): s for s in summaries}
    lines = [f"{'conc':>4} {'batched infer/s':>16} {'p99 ms':>7} {'unbatched infer/s':>18} {'p99 ms':>7} {'ratio':>6} "
             f"{'server CPU us/inf b/u':>22}"]
    for level in sorted({s.concurrency for s in summaries}):
        b, u = by.get((BATCHED, level)), by.get((UNBATCHED, level))
        if b is None or u is None:
            continue
        ratio = b.throughput / u.throughput if u.throughput else float("nan")
        lines.append(f"{level:>4} {b.throughput:>16.1f} {b.p99_us / 1000:>7.2f} {u.throughput:>18.1f} "
                     f"{u.p99_us / 1000:>7.2f} {ratio:>6.2f} {b.server_cpu_us:>10.0f} / {u.server_cpu_us:<9.0f}")
    return "\n".join(lines)


def cpu_ceiling(batched: report.Summary, unbatched: report.Summary, cpus: int) -> str:
    """What the CPU per inference allows when perf_analyzer shares the server's ``cpus``.

    Batched throughput cannot pass ``cpus / (server + client CPU per inference)``: every inference costs the
    machine both. Divided by the unbatched throughput measured, that is the most batching could have given
    at this point; where it is under the target, the target is out of reach on this machine whatever the
    batcher does (benchmarks/README.md, "Dynamic batching on/off"). Empty when a figure is missing.
    """
    b, c, u = batched.server_cpu_us, batched.client_cpu_us, unbatched.throughput
    if not all(math.isfinite(x) and x > 0 for x in (b, c, u)):
        return ""
    most = cpus / ((b + c) / 1e6)
    return (f"CPU per inference at c={batched.concurrency}: batched {b:.0f} us server + {c:.0f} us client, "
            f"unbatched {unbatched.server_cpu_us:.0f} + {unbatched.client_cpu_us:.0f} us; on {cpus} shared CPUs "
            f"batched throughput is at most {most:.0f} infer/s, {most / u:.2f}x the unbatched {u:.0f}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pa, stamp = loadgen.start_run()
    if pa is None:
        return 2
    work = args.out / f"batching-{stamp}"
    names = make_repository(args.model_repository / args.model, work / "repo")
    ports = servers.free_ports()
    extra = ["--disable-auto-complete-config", *args.server_arg]
    if args.server == "triton":
        triton = ensure_triton()
        if not triton.ok:
            print(f"error: {triton.reason}", file=sys.stderr)
            return 2
        spec = servers.triton_spec("triton", triton.command(), triton.env, [work / "repo"], list(names.values()),
                                   ports, extra)
    else:
        spec = servers.ferry_spec("ferry", [work / "repo"], list(names.values()), ports, extra)
    loopback = hostprobe.probe()
    print(f"host: {loopback.describe()}")
    measurements: list[report.Measurement] = []
    with servers.Server(spec, ports, work / "server.log") as srv:
        startup = srv.start(models=list(names.values()))
        print(f"{args.server} ready in {startup:.2f} s; {args.model} batched vs unbatched over {args.protocol}",
              flush=True)
        url = ports.url(args.protocol)
        for label, name in names.items():
            loadgen.warm_up(pa.command(), pa.env, perfcsv.PerfSpec(name, url, args.protocol, max(args.levels),
                                                                   cpus=args.client_cpus),
                            work, f"{label}-warmup", args.warmup)
        for round_no in range(1, args.rounds + 1):
            order = (BATCHED, UNBATCHED) if round_no % 2 else (UNBATCHED, BATCHED)
            for level in args.levels:
                for label in order:
                    point = perfcsv.PerfSpec(names[label], url, args.protocol, level, args.measurement_interval,
                                             99, max_trials=args.max_trials, cpus=args.client_cpus)
                    res, measurement, used = loadgen.measure_point(
                        pa.command(), pa.env, point, work, f"{label}-c{level}-r{round_no}", server=label,
                        round_no=round_no, server_pid=srv.pid, http_port=ports.http)
                    measurements.append(measurement)
                    head = f"  [{round_no}] c={level:<3} {label:<9}"
                    note = "" if res.stable else " (unstable)"
                    print(f"{head} {res.throughput:9.1f} infer/s  p99 {res.p99_us / 1000:7.2f} ms{note}  "
                          f"{used.describe()}" if res.ok else f"{head} FAILED: {res.error}", flush=True)
        profiles = {label: server_profile(ports.http, name) for label, name in names.items()}
    summaries = report.summarize(measurements)
    ratio = next((r for r in report.ratios(summaries, UNBATCHED, measurements)
                  if r.concurrency == TARGET_CONCURRENCY), None)
    print("\n" + format_table(summaries))
    print("\nserver statistics (all rounds):")
    for label in (BATCHED, UNBATCHED):
        print("  " + format_profile(label, profiles[label]))
    by = {(s.server, s.concurrency): s for s in summaries}
    target = by.get((BATCHED, TARGET_CONCURRENCY)), by.get((UNBATCHED, TARGET_CONCURRENCY))
    if None not in target and not args.client_cpus:
        print(cpu_ceiling(*target, os.cpu_count() or 1))
    if ratio is not None:
        verdict = "OK" if ratio.throughput_ratio >= TARGET_RATIO else "MISS"
        by_round = " ".join(f"{r:.2f}" for r in ratio.throughput_rounds)
        print(f"dynamic batching at c={TARGET_CONCURRENCY}: {ratio.throughput_ratio:.2f}x throughput "
              f"(target >= {TARGET_RATIO:g}x: {verdict}; round by round {by_round}), p99 {ratio.p99_ratio:.2f}x")
    print(plot(summaries, args.out / f"batching-{stamp}.png",
               f"{args.server}: {args.model} dynamic batching on/off ({args.protocol}, perf_analyzer)"))
    payload = {"kind": "batching", "started_utc": stamp, "server": args.server, "model": args.model,
               "protocol": args.protocol, "server_argv": list(spec.argv), "client_cpus": list(args.client_cpus),
               "loopback": loopback.as_dict(),
               "server_profile": profiles,
               "measurements": [asdict(m) for m in measurements], "summary": [asdict(s) for s in summaries],
               "ratio_c16": asdict(ratio) if ratio else None}
    report.write_json(args.out / f"batching-{stamp}.json", payload)
    report.write_csv(args.out / f"batching-{stamp}.csv", summaries)
    print(f"wrote {args.out / f'batching-{stamp}.json'} and .csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
