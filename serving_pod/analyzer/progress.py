"""Progress display during sweeps: tqdm when installed and stderr is a terminal, else plain lines.

On a terminal the plain display rewrites one line (``\\r``); in logs and CI it prints one line per
measurement. ``--no-progress`` silences it (the final summary is printed regardless).
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class Progress:
    """``update(text)`` after each measurement; ``close()`` at the end. ``total`` may be unknown (quick mode)."""

    def __init__(self, title: str, total: int | None = None, *, enabled: bool = True,
                 stream: TextIO | None = None) -> None:
        self.title, self.total, self.enabled = title, total, enabled
        self.stream = stream or sys.stderr
        self.count = 0
        self.started = time.monotonic()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._bar: Any = None
        if enabled and self.tty:
            try:
                from tqdm import tqdm  # type: ignore[import-untyped]

                self._bar = tqdm(total=total, desc=title, file=self.stream, unit="pt", leave=True)
            except ImportError:
                self._bar = None

    def update(self, text: str) -> None:
        self.count += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)
            self._bar.update(1)
            return
        elapsed = time.monotonic() - self.started
        if self.total:
            filled = int(20 * min(self.count, self.total) / self.total)
            counter = f"[{'#' * filled}{'.' * (20 - filled)}] {self.count}/{self.total}"
        else:
            counter = f"[{self.count}]"
        line = f"{self.title} {counter} {elapsed:5.0f}s {text}"
        if self.tty:
            self.stream.write("\r" + line[:160].ljust(160))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        """A message that must not be overwritten (e.g. a configuration that failed to load)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            self.stream.write(("\n" if self.tty else "") + text + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and self.tty and self.count:
            self.stream.write("\n")
            self.stream.flush()
