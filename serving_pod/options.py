"""Server options as frozen values, built from the command line by ``cli`` (tritonserver's flag names)."""

from __future__ import annotations

from dataclasses import dataclass, field

from serving_pod.core.engine import EngineOptions

DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024
GRPC_MAX_MESSAGE_SIZE = 2**31 - 1


@dataclass(frozen=True, slots=True)
class GrpcKeepalive:
    """tritonserver's ``--grpc-keepalive-*`` / ``--grpc-http2-*`` flags (milliseconds), with its defaults."""

    time_ms: int = 7_200_000
    timeout_ms: int = 20_000
    permit_without_calls: bool = False
    max_pings_without_data: int = 2
    min_recv_ping_interval_without_data_ms: int = 300_000
    max_ping_strikes: int = 2
    #: ``--grpc-max-connection-age``: GOAWAY a connection this old (+-10% jitter, gRPC core's); 0: never
    max_connection_age_ms: int = 0
    #: ``--grpc-max-connection-age-grace``: then close it this long after the GOAWAY; 0: when its calls end
    max_connection_age_grace_ms: int = 0


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """Server certificate and key files; ``ca`` (root certificates) and ``mutual`` for client certs."""

    cert: str
    key: str
    ca: str = ""
    mutual: bool = False


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """Everything ``FerryServer`` needs; ports 0 mean "pick a free port"."""

    engine: EngineOptions = field(default_factory=EngineOptions)
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    allow_gpu_metrics: bool = True
    allow_cpu_metrics: bool = True
    http_address: str = "0.0.0.0"
    grpc_address: str = "0.0.0.0"
    metrics_address: str = "0.0.0.0"
    #: freeze start-up objects out of the garbage collector and raise its young threshold
    #: (``server.GC_YOUNG_THRESHOLD``; the CLI sets it; in-process embedders may not want it)
    gc_freeze: bool = False
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    http_max_input_size: int = DEFAULT_MAX_INPUT_SIZE
    #: HTTP protocol processes in all (1 = this process only); see ``serving_pod.http.workers``
    http_workers: int = 1
    #: gRPC front end: "native" (``serving_pod.grpc.native``) or "grpcio" (grpc.aio)
    grpc_server: str = "native"
    log_verbose: int = 0
    log_format: str = "default"
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_file: str = ""
    #: restricted API groups -> ``security.Restriction`` (``--http-restricted-api``)
    http_restrictions: dict = field(default_factory=dict)
    #: restricted protocol groups -> ``security.Restriction`` (``--grpc-restricted-protocol``)
    grpc_restrictions: dict = field(default_factory=dict)
    http_tls: TlsOptions | None = None
    grpc_tls: TlsOptions | None = None
    #: bytes of request headers (request line included) one HTTP request may send
    http_max_header_size: int = 64 * 1024
    #: seconds a client may take to send one whole HTTP request (slow clients are disconnected)
    http_read_timeout_secs: float = 60.0
    grpc_max_message_size: int = GRPC_MAX_MESSAGE_SIZE
    grpc_max_metadata_size: int = 64 * 1024
    grpc_keepalive: GrpcKeepalive = field(default_factory=GrpcKeepalive)
    #: ``--grpc-infer-response-compression-level``: none, low, med or high
    grpc_response_compression: str = "none"
    #: ``--reuse-http-port`` / ``--reuse-grpc-port``: SO_REUSEPORT on the listening socket
    reuse_http_port: bool = False
    reuse_grpc_port: bool = False
    #: ``--http-header-forward-pattern`` / ``--grpc-header-forward-pattern`` (regex; "" forwards nothing)
    http_header_forward: str = ""
    grpc_header_forward: str = ""
    #: tritonserver flags given that do nothing in Ferry, each with why (``cli_compat``; logged at start)
    ignored_flags: tuple[str, ...] = ()
    #: settings given that the server ignores (e.g. a ``--metrics-config`` quantile that does not parse)
    startup_warnings: tuple[str, ...] = ()
