"""Logging extension: the server's log settings, readable and (partly) writable at run time.

``/v2/logging`` and the ``LogSettings`` RPC read and update ``log_info``, ``log_warning``,
``log_error``, ``log_verbose_level`` and ``log_format``. ``log_file`` is fixed by ``--log-file``
at start and read-only through the API: Triton once let clients point it anywhere, which made
the logging API an arbitrary-file-write primitive.

``LogSettings.install`` (called by the CLI) puts one handler on the root logger, writing to
stderr or the log file; its filter applies the per-level switches, so updates take effect at
once without touching other handlers (in-process test servers only change the ``ferry`` level).
A log file that cannot be opened does not stop the server: as tritonserver, it logs to stderr
instead (and, unlike tritonserver, says so). Line heads follow tritonserver's formats, in UTC:
``LMMDD hh:mm:ss.ssssss`` and ``YYYY-MM-DDThh:mm:ssZ L``; the logger's name stands where
tritonserver puts its process id and source file.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from serving_pod.core.errors import InvalidArgumentError, UnavailableError, UnsupportedError

FORMATS = {
    "default": ("%(levelname).1s%(asctime)s %(name)s] %(message)s", "%m%d %H:%M:%S.%f"),
    "ISO8601": ("%(asctime)sZ %(levelname).1s %(name)s] %(message)s", "%Y-%m-%dT%H:%M:%S"),
}


class _Formatter(logging.Formatter):
    """Times in UTC, with ``%f`` for the microseconds (tritonserver's ``LMMDD hh:mm:ss.ssssss``)."""

    converter = time.gmtime

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        text = super().formatTime(record, (datefmt or "%Y-%m-%d %H:%M:%S").replace("%f", "{micros}"))
        return text.replace("{micros}", f"{int(record.created % 1 * 1_000_000):06d}")


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
        self.handler: logging.Handler | None = None

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
            if value is None:
                continue
            if key == "log_file":
                if value != self.file:
                    raise UnsupportedError("log file location can not be updated through network protocol")
            elif key in ("log_info", "log_warning", "log_error"):
                if not isinstance(value, bool):
                    raise InvalidArgumentError(f"'{key}' must be a boolean, got {value!r}")
                staged[key[4:]] = value
            elif key == "log_verbose_level":
                if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**32:
                    raise InvalidArgumentError(f"'log_verbose_level' must be an unsigned integer, got {value!r}")
                staged["verbose"] = value
            elif key == "log_format":
                if not isinstance(value, str):  # Triton's gRPC words; it was UNAVAILABLE "invalid argument ..."
                    raise InvalidArgumentError("expect string for 'log_format'")
                if value not in FORMATS:
                    raise UnavailableError(f"invalid argument for --log_format, got: {value}")
                staged["format"] = value
            else:
                raise InvalidArgumentError(f"unknown log setting '{key}'")
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
        """Make the settings effective: the ``ferry`` level and the installed handler's format."""
        logging.getLogger("ferry").setLevel(logging.DEBUG if self.verbose else logging.INFO)
        if self.handler is not None:
            fmt, datefmt = FORMATS[self.format]
            self.handler.setFormatter(_Formatter(fmt, datefmt))

    def install(self) -> None:
        """Route the root logger to stderr or ``file`` through this filter (the CLI calls this once)."""
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
        unopened = ""
        if self.file:
            try:
                handler = logging.FileHandler(self.file, encoding="utf-8")
            except OSError as exc:
                unopened = f"cannot open log file {self.file}: {exc.strerror or exc}; logging to stderr instead"
        handler.addFilter(self)
        root = logging.getLogger()
        for old in list(root.handlers):
            root.removeHandler(old)
        root.addHandler(handler)
        root.setLevel(logging.DEBUG if self.verbose else logging.INFO)
        self.handler = handler
        self.apply()
        if unopened:
            logging.getLogger("ferry").error("%s", unopened)


def installed_log_settings() -> LogSettings | None:
    """The settings whose handler ``install`` put on the root logger, if any."""
    for handler in logging.getLogger().handlers:
        for item in handler.filters:
            if isinstance(item, LogSettings):
                return item
    return None
