"""Errors of ``ferry-analyzer``, each carrying the process exit code the CLI ends with.

``cli.main`` prints ``ferry-analyzer: error: <message>`` and exits with ``exit_code``; no traceback
reaches the user for any of these.
"""

from __future__ import annotations

#: exit codes (documented in docs/analyzer.md)
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INFEASIBLE = 3
EXIT_INTERRUPTED = 130


class AnalyzerError(Exception):
    """A failure the user must see as one clear message."""

    exit_code = EXIT_FAILED


class InputError(AnalyzerError):
    """Bad flags or inputs: unknown model, invalid range, missing checkpoint."""

    exit_code = EXIT_USAGE


class ServerError(AnalyzerError):
    """The server under test did not start, died, or cannot be reached."""

    exit_code = EXIT_FAILED
