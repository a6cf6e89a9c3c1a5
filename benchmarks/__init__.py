"""Ferry benchmarks: side-by-side comparison with NVIDIA Triton and batching runs, driven by perf_analyzer.

Run from the repository root as modules (``python -m benchmarks.compare_triton``); see benchmarks/README.md.
Pure parts (perf_analyzer CSV parsing, medians, ratios, tables) live in ``perfcsv`` and ``report``;
process management in ``servers``.
"""
