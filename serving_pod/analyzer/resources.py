"""CPU, RSS and GPU memory of the server while load runs, sampled on a background thread.

CPU and RSS cover the server process and its descendants (isolated python models run as children),
read with psutil. GPU memory comes from NVML (``pynvml``, package ``nvidia-ml-py``) when it imports and
finds a device; otherwise it stays ``None``. A remote server (no pid) yields ``None`` figures.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class ResourceUsage:
    """Mean CPU percent (100 = one core), peak resident memory and peak GPU memory, in MiB."""

    cpu_percent: float | None
    rss_mb: float | None
    gpu_mb: float | None


def _tree(pid: int) -> list[Any]:
    import psutil

    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


class _Nvml:
    """Used GPU memory of all devices (None when NVML is missing or finds no device)."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._pynvml = pynvml
        except Exception:  # noqa: BLE001 - any NVML failure means "no GPU figures"
            self.handles = []

    def used_mb(self) -> float | None:
        if not self.handles:
            return None
        total = 0
        for handle in self.handles:
            with contextlib.suppress(Exception):
                total += self._pynvml.nvmlDeviceGetMemoryInfo(handle).used
        return total / 2**20


class ResourceSampler:
    """``with ResourceSampler(pid) as s: ...`` then ``s.usage()``."""

    def __init__(self, pid: int | None, interval_s: float = 0.2) -> None:
        self.pid, self.interval_s = pid, interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu: list[float] = []
        self._rss_peak = 0
        self._gpu_peak: float | None = None
        self._procs: dict[int, Any] = {}

    def _sample(self, prime: bool = False) -> None:
        import psutil

        assert self.pid is not None
        try:
            procs = _tree(self.pid)
        except psutil.Error:
            return
        cpu, rss = 0.0, 0
        for proc in procs:
            known = self._procs.setdefault(proc.pid, proc)  # keep the object: cpu_percent needs its history
            with contextlib.suppress(psutil.Error):
                cpu += known.cpu_percent(None)
                rss += known.memory_info().rss
        if not prime:
            self._cpu.append(cpu)
        self._rss_peak = max(self._rss_peak, rss)

    def _run(self, nvml: _Nvml) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()
            used = nvml.used_mb()
            if used is not None:
                self._gpu_peak = max(self._gpu_peak or 0.0, used)

    def __enter__(self) -> ResourceSampler:
        if self.pid is not None:
            self._sample(prime=True)
            self._thread = threading.Thread(target=self._run, args=(_Nvml(),), daemon=True,
                                            name="ferry-analyzer-resources")
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._sample()

    def usage(self) -> ResourceUsage:
        if self.pid is None:
            return ResourceUsage(None, None, None)
        cpu = sum(self._cpu) / len(self._cpu) if self._cpu else None
        return ResourceUsage(cpu, self._rss_peak / 2**20 if self._rss_peak else None, self._gpu_peak)
