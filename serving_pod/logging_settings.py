"""Logging extension: the server's log settings, readable and (partly) writable at run time.

``/v2/logging`` and the ``LogSettings`` RPC read and update ``log_info``, ``log_warning``,
``log_error``, ``log_verbose_level`` and ``log_format``. ``log_file`` is fixed by ``--log-file``
at start: as tritonserver 2.51, any update naming it is refused (HTTP 501, gRPC UNIMPLEMENTED),
whatever its value; Triton once let clients point it anywhere, an arbitrary-file-write primitive.

``LogSettings.install`` (called by the CLI) puts one handler on the root logger, writing to
stderr or the log file; its filter applies the per-level switches and the root level follows
the verbose level, so updates take effect at once without touching other handlers (in-process
test servers only change the ``ferry`` level). A log file that cannot be opened does not stop
the server: as tritonserver, it logs to stderr instead and reads back ``log_file`` as ""
(and, unlike tritonserver, says why).

Entries follow tritonserver's formats (its extension_logging.md), in UTC:
``LMMDD hh:mm:ss.ssssss <pid> <file>:<line>] <message>`` and
``YYYY-MM-DDThh:mm:ssZ L <pid> <file>:<line>] <message>``; ``L`` is E, W or I (verbose
messages are I, as tritonserver's). The message is a JSON string (quoted, with ``"``, ``\\``
and control characters escaped, so no message can forge an entry) unless
``TRITON_SERVER_ESCAPE_LOG_MESSAGES=0``; a traceback follows on its own lines, as
tritonserver's multi-line entries (tables, configs) follow their heading. A start-up table (logged with
``extra={"table": True}``) is written raw, as tritonserver's: every line of it is a row or a rule.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from typing import Any, Callable

from serving_pod.core.errors import InvalidArgumentError, UnavailableError, UnsupportedError

#: the log_format values (module docstring)
FORMATS = ("default", "ISO8601")
#: tritonserver's verbose level is an int32: it reads larger levels back as 0 (and its CLI refuses them)
MAX_VERBOSE_LEVEL = 2**31 - 1
#: log_verbose_level >= 1, kept by ``LogSettings.apply``: the front ends read only this flag on their hot paths
#: before writing tritonserver's verbose request lines (``HTTP request: ...``, ``Process for ...``)
VERBOSE = False
ESCAPE_VARIABLE = "TRITON_SERVER_ESCAPE_LOG_MESSAGES"
#: libraries whose DEBUG records are their own internals (hpack writes about 18 lines per gRPC call): they stay at
#: INFO when the verbose level opens the root logger, as tritonserver's verbose log has nothing of the kind
_LIBRARY_LOGGERS = ("hpack", "h2", "httpcore", "httpx", "urllib3", "asyncio", "botocore", "s3transfer", "multipart",
                    "python_multipart", "grpc", "PIL", "numba")
_KEYS = ("log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format")
_ESCAPED = re.compile(r'[\x00-\x1f"\\]')
_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def escape(message: str) -> str:
    """``message`` as a JSON string, as tritonserver writes it (UTF-8 kept, ``\\u001B`` in upper case)."""
    return '"' + _ESCAPED.sub(lambda m: _SHORT.get(m[0]) or f"\\u{ord(m[0]):04X}", message) + '"'


def level_letter(levelno: int) -> str:
    """tritonserver's E, W or I (it writes verbose messages as I)."""
    return "E" if levelno >= logging.ERROR else "W" if levelno >= logging.WARNING else "I"


class _Formatter(logging.Formatter):
    """One entry in tritonserver's ``log_format`` (module docstring)."""

    def __init__(self, log_format: str, *, escaped: bool) -> None:
        super().__init__()
        self.log_format, self.escaped = log_format, escaped

    def format(self, record: logging.LogRecord) -> str:
        utc, letter = time.gmtime(record.created), level_letter(record.levelno)
        if self.log_format == "default":
            head = f"{letter}{time.strftime('%m%d %H:%M:%S', utc)}.{int(record.created % 1 * 1_000_000):06d}"
        else:
            head = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', utc)} {letter}"
        message = record.getMessage()
        text = f"{head} {record.process} {record.filename}:{record.lineno}] "
        # a table (``server.py``: every line of it a row or a rule) is written raw after an empty heading, as tritonserver's
        text += escape(message) if self.escaped and not getattr(record, "table", False) else message
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        for extra in (record.exc_text, record.stack_info and self.formatStack(record.stack_info)):
            if extra:
                text += "\n" + extra
        return text


class LogSettings(logging.Filter):
    """Current log settings; also the filter of the handler it installs."""

    def __init__(
        self,
        *,
        file: str = "",
        info: bool = True,
        warning: bool = True,
        error: bool = True,
        verbose: int = 0,
        format: str = "default",
    ) -> None:
        super().__init__()
        if format not in FORMATS:
            raise ValueError(f"invalid log format '{format}': expected default or ISO8601")
        self.file, self.info, self.warning, self.error = file, info, warning, error
        self.verbose, self.format = verbose, format
        self.escaped = True  # install() reads TRITON_SERVER_ESCAPE_LOG_MESSAGES
        self.handler: logging.Handler | None = None
        #: called with these settings whenever they take effect (``apply``): ``--http-workers`` processes follow them
        self.listeners: list[Callable[[LogSettings], None]] = []

    def as_dict(self) -> dict[str, Any]:
        return {
            "log_file": self.file,
            "log_info": self.info,
            "log_warning": self.warning,
            "log_error": self.error,
            "log_verbose_level": self.verbose,
            "log_format": self.format,
        }

    def update(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Validate every change first, then apply them all; returns the new settings."""
        staged: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in _KEYS:  # tritonserver ignores them: a misspelt key would change nothing, silently
                raise InvalidArgumentError(f"unknown log setting '{key}'")
            if value is None:  # HTTP null: no change, as tritonserver (gRPC refuses an empty value before this)
                continue
            if key == "log_file":  # any value, the current one too: tritonserver's code and words
                raise UnsupportedError("log file location can not be updated through network protocol")
            if key in ("log_info", "log_warning", "log_error"):
                if not isinstance(value, bool):
                    raise InvalidArgumentError(f"'{key}' must be a boolean, got {value!r}")
                staged[key[4:]] = value
            elif key == "log_verbose_level":
                if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_VERBOSE_LEVEL:
                    raise InvalidArgumentError(
                        f"'log_verbose_level' must be an integer from 0 to {MAX_VERBOSE_LEVEL}, got {value!r}")
                staged["verbose"] = value
            elif key == "log_format":
                if not isinstance(value, str):  # Triton's gRPC words; it was UNAVAILABLE "invalid argument ..."
                    raise InvalidArgumentError("expect string for 'log_format'")
                if value not in FORMATS:
                    raise UnavailableError(f"invalid argument for --log_format, got: {value}")
                staged["format"] = value
        for name, value in staged.items():
            setattr(self, name, value)
        self.apply()
        return self.as_dict()

    # --- effect on python logging ------------------------------------------------------------
    def filter(self, record: logging.LogRecord) -> bool:
        level = record.levelno
        if level >= logging.ERROR:
            return self.error
        if level >= logging.WARNING:
            return self.warning
        if level >= logging.INFO:
            return self.info
        return self.verbose > 0

    def apply(self) -> None:
        """Make the settings effective: the ``ferry`` level and, once installed, the root level (every
        logger's verbose messages, python models' ``log_verbose`` too) and the handler's format."""
        global VERBOSE
        VERBOSE = self.verbose > 0
        level = logging.DEBUG if self.verbose else logging.INFO
        logging.getLogger("ferry").setLevel(level)
        if self.handler is not None:
            logging.getLogger().setLevel(level)
            self.handler.setFormatter(_Formatter(self.format, escaped=self.escaped))
        for listener in self.listeners:
            listener(self)

    def install(self) -> None:
        """Route the root logger to stderr or ``file`` through this filter (the CLI calls this once)."""
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
        unopened = ""
        if self.file:
            try:
                handler = logging.FileHandler(self.file, encoding="utf-8")
            except OSError as exc:
                unopened = f"cannot open log file {self.file}: {exc.strerror or exc}; logging to stderr instead"
                self.file = ""  # tritonserver reads back "" too: nothing is written there
        handler.addFilter(self)
        root = logging.getLogger()
        for old in list(root.handlers):
            root.removeHandler(old)
        root.addHandler(handler)
        for name in _LIBRARY_LOGGERS:
            library = logging.getLogger(name)
            if library.level == logging.NOTSET:  # a level set on purpose (by a model, say) is kept
                library.setLevel(logging.INFO)
        self.escaped = os.environ.get(ESCAPE_VARIABLE) != "0"  # unset or anything but "0": escaped
        self.handler = handler
        self.apply()
        if unopened:
            logging.getLogger("ferry").error("%s", unopened)


def log_infer_failed(logger: logging.Logger, request_id: str, message: str) -> None:
    """tritonserver's verbose line for an inference request it could not start, HTTP and gRPC alike (callers check
    ``VERBOSE`` and that it is such a failure: module docstrings of ``http.app`` and ``grpc.service``)."""
    logger.debug("[request id: %s] Infer failed: %s", request_id or "<id_unknown>", message, stacklevel=2)


def installed_log_settings() -> LogSettings | None:
    """The settings whose handler ``install`` put on the root logger, if any."""
    for handler in logging.getLogger().handlers:
        for item in handler.filters:
            if isinstance(item, LogSettings):
                return item
    return None
