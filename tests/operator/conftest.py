"""Operator test setup.

The suite runs with ``--import-mode=importlib``, where a test module's folder is not on
``sys.path``; the shared helpers of this folder live in ``operator_support`` (a unique name:
``operator`` itself would be the standard library's), made importable here.
"""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
