"""``ferry-operator``: run the InferenceService operator (kopf) until interrupted.

Settings come from ``FERRY_*`` environment variables (see :mod:`.config`); the flags below
override the most common ones.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import kopf

from ferry_operator.config import OperatorConfig
from ferry_operator.handlers import build_registry


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ferry-operator", description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--namespace", action="append", default=None,
                        help="watch only this namespace (repeatable; default: FERRY_NAMESPACES or all)")
    parser.add_argument("--liveness", default=None,
                        help="liveness endpoint URL (default: FERRY_LIVENESS_ENDPOINT or http://0.0.0.0:8080/healthz)")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config = OperatorConfig.from_env()
    except ValueError as exc:
        print(f"ferry-operator: {exc}", file=sys.stderr)
        return 2
    namespaces = tuple(args.namespace or config.namespaces)
    kopf.configure(verbose=args.verbose)
    asyncio.run(kopf.operator(
        registry=build_registry(config),
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=args.liveness or config.liveness_endpoint,
        standalone=True,
    ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
