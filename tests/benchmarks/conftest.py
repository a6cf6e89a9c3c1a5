"""Make the repository root importable so these tests reach the ``benchmarks`` package.

pyproject's ``pythonpath`` holds ``tests`` only, where ``benchmarks`` would otherwise resolve to this folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
