"""``ferry-server download <uri> <dest>``: the storage initializer's command line.

The operator runs it in an init container before the server starts; exit code 0 on success,
1 with a one-line error on stderr when the model cannot be fetched, 2 for bad usage.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from serving_pod.storage.operations import download
from serving_pod.storage.uris import StorageError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ferry-server download",
        description="Download a model repository from s3://, gs://, http(s)://, pvc://, file:// "
        "or a local path into a folder (the storage initializer).",
    )
    parser.add_argument("uri", help="storage URI of the model repository or archive")
    parser.add_argument("dest", type=Path, help="destination folder, e.g. /mnt/models")
    parser.add_argument("--quiet", action="store_true", help="log errors only")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the downloader on ``argv`` (the arguments after ``download``); returns the exit code."""
    try:
        args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage; return it instead
        return int(exc.code or 0)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")
    try:
        download(args.uri, args.dest)
    except StorageError as exc:
        print(f"ferry-server download: error: {exc}", file=sys.stderr)
        return 1
    return 0
