"""``ferry-analyzer``: Ferry's Model Analyzer — configuration sweeps under latency/throughput constraints.

Layout (one concern per module):

- ``cli``: the ``profile`` and ``report`` commands, flag parsing and exit codes.
- ``space``: the configurations users tune (instances, max batch size, dynamic batching, delay, preferred
  sizes) and how a point becomes a ``ModelConfig``.
- ``target``: the server under test (a ``ferry-server`` it starts, or a remote one) over the HTTP API.
- ``perf`` / ``builtin_load``: load generators (perf_analyzer preferred, a tritonclient aio fallback).
- ``measure``: one measurement (load + statistics deltas + resource usage); ``stats``, ``resources``.
- ``objectives``: objectives, constraints and ranking; ``search``: quick and brute strategies.
- ``checkpoint``: the JSON file every measurement is saved to (resume, and the report's only input).
- ``profile``: the orchestration of a sweep; ``report`` / ``svg``: the HTML report and CSV export.
"""
