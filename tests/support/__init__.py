"""Shared test support, importable as ``support`` (pyproject puts ``tests/`` on ``sys.path``).

``server`` and ``models``: in-process Ferry servers and small generated models. ``perf_analyzer`` and
``triton``: installers/locators for NVIDIA's perf_analyzer 2.50 and Triton 2.51, cached under
``<repo>/.tools/`` (gitignored; ``FERRY_TOOLS_DIR`` overrides); they return a human reason instead of
raising, and their ``*_or_skip`` / ``perf_analyzer_cmd`` helpers turn it into a pytest skip.
Nothing here does work at import time.
"""
