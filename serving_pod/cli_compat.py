"""The rest of tritonserver 2.51's flags, so that an existing ``tritonserver`` command line starts ``ferry-server``.

Three kinds, each flag in exactly one table:

* **Applied**: ``--model-config-name`` (``configs/<name>.pbtxt``), ``--reuse-http-port`` and
  ``--reuse-grpc-port`` (SO_REUSEPORT on the listening socket), ``--http-header-forward-pattern`` and
  ``--grpc-header-forward-pattern`` (matching headers become request parameters, ``core.parameters``),
  ``--metrics-config`` (latency counters, summaries and histogram, ``core.latency_metrics``),
  ``--model-load-retry-count`` (a version whose instances fail to load is tried again, ``core.registry``).
* **No effect in Ferry** (``NO_EFFECT``): tuning knobs for parts Ferry does not have, such as CUDA and pinned
  memory pools, backend shared libraries, repository agents and HTTP threads. Each value is still checked
  in tritonserver's format, and the server logs at start which of them it was given and why they do
  nothing.
* **Features Ferry lacks** (``UNSUPPORTED``): accepted at the value that leaves the feature off (or with the
  default of tritonserver); a value that turns it on exits with code 2 and says what is missing, rather
  than serving without it.

Deprecated flags (``DEPRECATED``) still work, with tritonserver's warning at start.

Neighbours: ``cli`` (the core flags) and ``cli_extensions`` (shared memory, tracing, TLS, limits).
"""

from __future__ import annotations

import argparse
import re
from typing import Any, Callable

from serving_pod.cli_extensions import number, parse_bool
from serving_pod.core.latency_metrics import parse_metrics_config
from serving_pod.repository.instance_groups import MIN_COMPUTE_CAPABILITY


def _device_value(kind: type) -> Callable[[str], str]:
    """``<device>:<value>`` (``--cuda-memory-pool-byte-size 0:268435456``, ``--model-load-gpu-limit 0:0.5``)."""

    def parse(text: str) -> str:
        device, sep, value = text.partition(":")
        try:
            if not sep or int(device) < 0 or kind(value) < 0:
                raise ValueError
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value '{text}': expected <device>:<value>") from None
        return text

    return parse


def _host_policy(text: str) -> str:
    name, _, setting = text.partition(",")
    if not name or "=" not in setting:
        raise argparse.ArgumentTypeError(f"invalid --host-policy '{text}': expected <name>,<setting>=<value>")
    return text


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"invalid setting '{text}': expected <setting>=<value>")
    return key, value


def _regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"invalid regular expression '{text}': {exc}") from None
    return text


def _config_name(text: str) -> str:
    if not text or any(c.isspace() for c in text) or "/" in text or text in (".", ".."):
        raise argparse.ArgumentTypeError(
            f"invalid --model-config-name '{text}': a file name without spaces or '/' (e.g. h100)"
        )
    return text


def _port_range(text: str) -> str:
    low, sep, high = text.partition("-")
    if not sep or not low.isdigit() or not high.isdigit() or int(low) > int(high) or int(high) > 65535:
        raise argparse.ArgumentTypeError(f"invalid port range '{text}': expected <low>-<high>")
    return text


#: flag -> (value parser, repeatable, why it does nothing in Ferry)
NO_EFFECT: dict[str, tuple[Callable[[str], Any], bool, str]] = {
    "--backend-directory": (str, False, "the backends are built into Ferry"),
    "--repoagent-directory": (str, False, "Ferry has no repository agents"),
    "--cache-directory": (str, False, "the response cache ('local') is built into Ferry"),
    "--http-thread-count": (number(int, minimum=1), False,
                            "HTTP requests run on the event loop; --http-workers adds processes"),
    "--buffer-manager-thread-count": (number(int), False, "Ferry has no buffer manager threads"),
    "--model-load-thread-count": (number(int), False, "each model loads on its own loader thread"),
    "--metrics-interval-ms": (number(float), False, "GPU and CPU metrics are read at each scrape"),
    "--pinned-memory-pool-byte-size": (number(int), False, "Ferry keeps no pinned host memory pool"),
    "--cuda-memory-pool-byte-size": (_device_value(int), True,
                                     "onnxruntime and TensorRT allocate GPU memory themselves"),
    "--cuda-virtual-address-size": (_device_value(int), True, "Ferry reserves no CUDA virtual address space"),
    "--enable-peer-access": (parse_bool, False, "Ferry copies no tensors between GPUs"),
    "--model-load-gpu-limit": (_device_value(float), True, "Ferry does not meter GPU memory while loading"),
    "--host-policy": (_host_policy, True, "Ferry does not bind models to NUMA nodes"),
    "--sagemaker-port": (number(int), False, "Ferry has no SageMaker endpoint"),
    "--sagemaker-safe-port-range": (_port_range, False, "Ferry has no SageMaker endpoint"),
    "--sagemaker-thread-count": (number(int), False, "Ferry has no SageMaker endpoint"),
    "--vertex-ai-port": (number(int), False, "Ferry has no Vertex AI endpoint"),
    "--vertex-ai-thread-count": (number(int), False, "Ferry has no Vertex AI endpoint"),
    "--vertex-ai-default-model": (str, False, "Ferry has no Vertex AI endpoint"),
}

#: flag -> (value parser, the values that leave the feature off, what Ferry lacks)
UNSUPPORTED: dict[str, tuple[Callable[[str], Any], Callable[[Any], bool], str]] = {
    "--allow-sagemaker": (parse_bool, lambda v: v is False, "Ferry has no SageMaker endpoint"),
    "--allow-vertex-ai": (parse_bool, lambda v: v is False, "Ferry has no Vertex AI endpoint"),
    "--model-namespacing": (parse_bool, lambda v: v is False,
                            "Ferry does not namespace models by repository: names must be unique"),
}

def _replaced_by_trace_config(flag: str, setting: str) -> Callable[[Any], str]:
    """tritonserver's warning for a deprecated ``--trace-*`` flag, naming the ``--trace-config`` setting to use."""
    return lambda _: (f"'{flag}' has been deprecated and will be removed in future releases. "
                      f"Please use '--trace-config {setting} instead.")


#: deprecated tritonserver flags (still applied) -> what tritonserver warns of when given
DEPRECATED: dict[str, Callable[[Any], str]] = {
    "--strict-model-config": lambda _: "'--strict-model-config' has been deprecated! Please use "
                                       "'--disable-auto-complete-config' instead.",
    "--response-cache-byte-size": lambda size: (
        "'--response-cache-byte-size' has been deprecated! This will default to the 'local' cache implementation "
        "with the provided byte size for its config. Please use '--cache-config' instead. The equivalent "
        f"--cache-config CLI args would be: '--cache-config=local,size={size}'"),
    "--trace-file": _replaced_by_trace_config("--trace-file", "triton,file=<filepath>"),
    "--trace-level": _replaced_by_trace_config("--trace-level", "level=<OFF|TIMESTAMPS|TENSORS>"),
    "--trace-rate": _replaced_by_trace_config("--trace-rate", "rate=<rate value>"),
    "--trace-count": _replaced_by_trace_config("--trace-count", "count=<count value>"),
    "--trace-log-frequency": _replaced_by_trace_config("--trace-log-frequency",
                                                       "triton,log-frequency=<log frequency value>"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--model-config-name", type=_config_name, default=None,
        help="read configs/<name>.pbtxt instead of config.pbtxt in each model directory that has one")
    add("--reuse-http-port", type=parse_bool, default=False, help="SO_REUSEPORT on the HTTP listening socket")
    add("--reuse-grpc-port", type=parse_bool, default=False, help="SO_REUSEPORT on the gRPC listening socket")
    add("--http-header-forward-pattern", type=_regex, default="",
        help="HTTP headers whose name (as sent) matches this regular expression become request parameters")
    add("--grpc-header-forward-pattern", type=_regex, default="",
        help="gRPC metadata whose name matches this regular expression becomes request parameters")
    add("--min-supported-compute-capability", type=number(float), default=MIN_COMPUTE_CAPABILITY,
        help="GPUs of a lower CUDA compute capability are not used for KIND_GPU / KIND_AUTO instances "
             f"(default {MIN_COMPUTE_CAPABILITY})")
    add("--model-load-retry-count", type=number(int), default=0,
        help="further attempts at creating a model version's instances when one fails (default 0)")
    add("--metrics-config", action="append", default=[], type=_setting, metavar="SETTING=VALUE",
        help="tritonserver's latency metrics settings: counter_latencies (default true), summary_latencies, "
             "histogram_latencies (default false), summary_quantiles=<quantile>:<error>,...")
    for flag, (kind, repeatable, why) in NO_EFFECT.items():
        add(flag, type=kind, default=[] if repeatable else None, action="append" if repeatable else "store",
            help=f"accepted for tritonserver compatibility; no effect: {why}")
    for flag, (kind, _, lacks) in UNSUPPORTED.items():
        add(flag, type=kind, default=None, help=f"accepted only at the value that leaves it off: {lacks}")


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def apply(
    parser: argparse.ArgumentParser, args: argparse.Namespace,
) -> tuple[dict[str, Any], dict[str, Any], list[str], list[str]]:
    """``(engine_fields, server_fields, notes, warnings)``; exits (code 2) on a value that needs a missing feature.

    ``notes`` says, for each no-effect flag given, why it does nothing; ``warnings`` names the deprecated flags
    given and the ``--metrics-config`` settings ignored, as tritonserver logs them (both logged when the server
    starts).
    """
    for flag, (_, off, lacks) in UNSUPPORTED.items():
        value = getattr(args, _dest(flag))
        if value is not None and not off(value):
            shown = str(value).lower() if isinstance(value, bool) else value
            parser.error(f"{flag}={shown}: not supported ({lacks})")
    latency_metrics, warnings = parse_metrics_config(args.metrics_config)
    warnings = [warn(getattr(args, _dest(flag))) for flag, warn in DEPRECATED.items()
                if getattr(args, _dest(flag)) not in (None, [])] + warnings
    notes = [f"{flag} (no effect: {why})" for flag, (_, _, why) in NO_EFFECT.items()
             if getattr(args, _dest(flag)) not in (None, [])]
    engine = {"model_config_name": args.model_config_name or "", "latency_metrics": latency_metrics,
              "model_load_retry_count": args.model_load_retry_count,
              "min_compute_capability": args.min_supported_compute_capability}
    server = {"reuse_http_port": args.reuse_http_port, "reuse_grpc_port": args.reuse_grpc_port,
              "http_header_forward": args.http_header_forward_pattern,
              "grpc_header_forward": args.grpc_header_forward_pattern}
    return engine, server, notes, warnings
