"""Shared test support: locators/installers for external tools (perf_analyzer, NVIDIA Triton).

Modules here do nothing at import time. Installers cache their downloads under ``<repo>/.tools/``
(gitignored; override with ``FERRY_TOOLS_DIR``) and report a human reason when a tool cannot be had,
so tests can skip with it.
"""
