"""Does the server use more than one core? Throughput at 1 vs 2 (or ``--workers``) workers, with perf_analyzer.

Two kinds of worker, each at 1 and at 2 (``--workers 1,2,4`` on bigger machines), measured in turn (the
order flips every round; figures are medians over ``--rounds``); every variant runs in its own server start
on the same ports:

* ``instances``: ``burn_py`` (benchmarks/models: about a millisecond of pure-Python work per request that
  holds the GIL, standing for pre/post-processing written in Python) with ``instance_group { count: 1 }``
  and ``{ count: 2 }``, over gRPC. Ferry runs each instance of it in its own process (the model sets
  ``FERRY_ISOLATED``), as Triton's python backend runs one stub process per instance. ``--with-triton``
  measures NVIDIA Triton on the same two models beside it.
* ``http-workers``: ``double_py`` (the Triton comparison's tiny model: nearly all protocol work) over HTTP
  with ``--http-workers=1``, ``=2``, .... Ferry only: Triton's HTTP front end is its own C++ thread pool.

Prints each point with its CPU split, a table with the cores the server used (throughput x server CPU per
inference) and each worker count's throughput over the smallest count's, per kind; writes JSON and CSV to
benchmarks/results/::

    python -m benchmarks.scaling                    # Ferry, both kinds, 2 rounds, ~2 minutes
    python -m benchmarks.scaling --with-triton      # and Triton's 1 vs 2 instances beside it
    python -m benchmarks.scaling --kinds instances  # one kind only
    python -m benchmarks.scaling --workers 1,2,4,8  # on a machine with more cores
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks import loadgen, perfcsv, report, servers
from tests.support.perf_analyzer import Located
from tests.support.triton import ensure_triton

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("instances", "http-workers")
WORKERS = (1, 2)
INSTANCE_MODEL, PROTOCOL_MODEL = "burn_py", "double_py"


@dataclass(frozen=True)
class Variant:
    """One server configuration: ``server`` (ferry or triton) running ``kind`` with ``workers`` of it."""

    server: str
    kind: str
    workers: int
    model: str
    protocol: str
    spec: servers.ServerSpec

    @property
    def label(self) -> str:
        return f"{self.server} {self.kind}={self.workers}"


@dataclass(frozen=True)
class Scaling:
    """``server``'s ``kind`` at ``workers`` over ``base`` workers: throughput ratio and the cores used at each."""

    server: str
    kind: str
    base: int
    workers: int
    throughput_ratio: float
    cores_base: float
    cores: float


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma list of {', '.join(KINDS)}")
    p.add_argument("--with-triton", action="store_true", help="also NVIDIA Triton at 1 and 2 instances")
    p.add_argument("--workers", default=",".join(map(str, WORKERS)),
                   help="comma list of worker counts (instances / HTTP processes), default 1,2")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--measurement-interval", type=int, default=3000, help="perf_analyzer window, ms")
    p.add_argument("--max-trials", type=int, default=6)
    p.add_argument("--model-repository", type=Path, default=servers.BENCH_MODELS)
    p.add_argument("--out", type=Path, default=RESULTS)
    loadgen.add_client_cpus(p)
    args = p.parse_args(argv)
    args.kind_list = [k.strip() for k in args.kinds.split(",") if k.strip()]
    try:
        args.worker_counts = tuple(sorted({int(w) for w in args.workers.split(",") if w.strip()}))
    except ValueError:
        p.error(f"--workers must be a comma list of integers; got {args.workers!r}")
    if len(args.worker_counts) < 2 or args.worker_counts[0] < 1:
        p.error(f"--workers needs at least two counts >= 1; got {args.workers!r}")
    if not args.kind_list or any(k not in KINDS for k in args.kind_list):
        p.error(f"--kinds must be a comma list of {', '.join(KINDS)}; got {args.kinds!r}")
    if args.rounds < 1 or args.concurrency < 1 or args.measurement_interval < 100:
        p.error("--rounds >= 1, --concurrency >= 1 and --measurement-interval >= 100 ms are required")
    for model in (INSTANCE_MODEL, PROTOCOL_MODEL):
        if not (args.model_repository / model / "config.pbtxt").exists():
            p.error(f"model {model!r} not found in {args.model_repository}")
    return args


def make_repository(source: Path, dest: Path, counts: tuple[int, ...] = WORKERS) -> dict[int, str]:
    """Copies of ``source`` named ``<model>_x<count>`` whose first instance group has that count."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse((source / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    names = {}
    for count in counts:
        variant = model_config_pb2.ModelConfig()
        variant.CopyFrom(config)
        variant.name = f"{source.name}_x{count}"
        if not variant.instance_group:
            variant.instance_group.add(kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
        variant.instance_group[0].count = count
        target = dest / variant.name
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("config.pbtxt", "__pycache__"))
        (target / "config.pbtxt").write_text(text_format.MessageToString(variant))
        names[count] = variant.name
    return names


def build_variants(args: argparse.Namespace, repo: Path, ports: servers.Ports) -> list[Variant]:
    variants = []
    if "instances" in args.kind_list:
        names = make_repository(args.model_repository / INSTANCE_MODEL, repo, args.worker_counts)
        for count, name in names.items():
            variants.append(Variant("ferry", "instances", count, name, "grpc",
                                    servers.ferry_spec("ferry", [repo], [name], ports)))
        if args.with_triton:
            triton = ensure_triton()
            if not triton.ok:
                raise SystemExit(f"error: {triton.reason}")
            for count, name in names.items():
                variants.append(Variant("triton", "instances", count, name, "grpc",
                                        servers.triton_spec("triton", triton.command(), triton.env, [repo],
                                                            [name], ports)))
    if "http-workers" in args.kind_list:
        for workers in args.worker_counts:
            variants.append(Variant("ferry", "http-workers", workers, PROTOCOL_MODEL, "http",
                                    servers.ferry_spec("ferry", [args.model_repository], [PROTOCOL_MODEL], ports,
                                                       [f"--http-workers={workers}"])))
    return variants


def round_order(variants: list[Variant], round_no: int) -> list[Variant]:
    """Fewest to most workers in odd rounds, most to fewest in even ones (kinds and servers keep their order)."""
    return sorted(variants, key=lambda v: (v.server, v.kind, v.workers if round_no % 2 else -v.workers))


def measure(variant: Variant, args: argparse.Namespace, ports: servers.Ports, pa: Located, round_no: int,
            log_dir: Path) -> report.Measurement:
    name = f"{variant.server}-{variant.kind}{variant.workers}-r{round_no}"
    with servers.Server(variant.spec, ports, log_dir / f"{name}.server.log") as srv:
        startup = srv.start(models=[variant.model])
        url = ports.url(variant.protocol)
        point = perfcsv.PerfSpec(variant.model, url, variant.protocol, args.concurrency, args.measurement_interval,
                                 99, max_trials=args.max_trials, cpus=args.client_cpus)
        res, measurement, used = loadgen.measure_point(
            pa.command(), pa.env, point, log_dir, name, server=variant.label, round_no=round_no,
            server_pid=srv.pid, http_port=ports.http)
        head = f"  [{round_no}] {variant.label:<22} (ready in {startup:.2f} s)"
        note = "" if res.stable else " (unstable)"
        print(f"{head} {res.throughput:9.1f} infer/s  p99 {res.p99_us / 1000:6.2f} ms{note}  {used.describe()}"
              if res.ok else f"{head} FAILED: {res.error}", flush=True)
    return measurement


def cores(summary: report.Summary) -> float:
    """CPU cores the server kept busy: inferences per second x CPU seconds per inference."""
    return summary.throughput * summary.server_cpu_us / 1e6


def scaling(variants: list[Variant], summaries: list[report.Summary]) -> list[Scaling]:
    """Each kind's worker counts against its smallest one."""
    by_label = {s.server: s for s in summaries}
    out = []
    for server, kind in dict.fromkeys((v.server, v.kind) for v in variants):
        counts = sorted(v.workers for v in variants if (v.server, v.kind) == (server, kind))
        base = by_label.get(f"{server} {kind}={counts[0]}")
        if base is None:
            continue
        for count in counts[1:]:
            other = by_label.get(f"{server} {kind}={count}")
            if other is not None:
                ratio = other.throughput / base.throughput if base.throughput else math.nan
                out.append(Scaling(server, kind, counts[0], count, ratio, cores(base), cores(other)))
    return out


def format_table(summaries: list[report.Summary], rows: list[Scaling]) -> str:
    lines = [f"{'variant':<24} {'proto':<5} {'conc':>4} {'infer/s':>9} {'p99 ms':>7} {'server CPU us/inf':>17} "
             f"{'server cores':>12}"]
    for s in summaries:
        lines.append(f"{s.server:<24} {s.protocol:<5} {s.concurrency:>4} {s.throughput:>9.1f} "
                     f"{s.p99_us / 1000:>7.2f} {s.server_cpu_us:>17.0f} {cores(s):>12.2f}")
    lines += ["", f"{'workers / fewest':<24} {'n / m':>6} {'thr x':>6} {'cores m -> n':>14}"]
    for r in rows:
        lines.append(f"{r.server + ' ' + r.kind:<24} {f'{r.workers}/{r.base}':>6} {r.throughput_ratio:>6.2f} "
                     f"{r.cores_base:>6.2f} -> {r.cores:<5.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pa, stamp = loadgen.start_run()
    if pa is None:
        return 2
    work = args.out / f"scaling-{stamp}"
    ports = servers.free_ports()
    variants = build_variants(args, work / "repo", ports)
    print(f"{' vs '.join(map(str, args.worker_counts))} workers at c={args.concurrency}: {', '.join(dict.fromkeys(v.kind for v in variants))}", flush=True)
    measurements = [measure(v, args, ports, pa, round_no, work)
                    for round_no in range(1, args.rounds + 1) for v in round_order(variants, round_no)]
    summaries = report.summarize(measurements)
    summaries.sort(key=lambda s: next(i for i, v in enumerate(variants) if v.label == s.server))
    rows = scaling(variants, summaries)
    print("\n" + format_table(summaries, rows))
    payload = {"kind": "scaling", "started_utc": stamp, "concurrency": args.concurrency,
               "client_cpus": list(args.client_cpus),
               "variants": [{"label": v.label, "model": v.model, "protocol": v.protocol, "argv": list(v.spec.argv)}
                            for v in variants],
               "measurements": [asdict(m) for m in measurements], "summary": [asdict(s) for s in summaries],
               "scaling": [asdict(r) for r in rows]}
    report.write_json(args.out / f"scaling-{stamp}.json", payload)
    report.write_csv(args.out / f"scaling-{stamp}.csv", summaries)
    print(f"wrote {args.out / f'scaling-{stamp}.json'} and .csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
