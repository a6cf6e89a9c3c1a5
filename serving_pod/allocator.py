"""glibc's allocator told to keep the memory of large tensors for reuse, in the server's own processes.

Each request with a megabyte tensor allocates several blocks that size (the body read, the model's output, the
response) and frees them when it is answered. glibc gives a freed block of 128 KiB or more back to the kernel
(``munmap``); its adaptive rule then raises that threshold to the block's size and trims the heap's top once
more than twice that is free there, so with a few requests in flight the freed memory still goes back and the
next request faults in fresh pages: 690 page faults per inference of the 1 MiB benchmark model over HTTP at
c=4, more than half of the server's CPU on a virtual machine (benchmarks/README.md, "Large tensors without page
faults"). ``keep_freed_memory`` sets ``M_MMAP_THRESHOLD`` to glibc's maximum (blocks up to 32 MiB come from the
heap) and ``M_TRIM_THRESHOLD`` to 64 MiB (free memory at the heap's top is kept up to that), so a steady load
reuses what the previous requests freed. The cost: memory a burst freed stays with the process (up to the trim
threshold per arena) instead of going back to the kernel at once.

Called at start by ``ferry-server``, its HTTP worker processes and the child processes of isolated python
instances; never on import, never in a process that embeds the engine (the Python API: that process's allocator
is its owner's). Nothing is changed where the allocator is not glibc's, or where the environment already tunes
it (``MALLOC_MMAP_THRESHOLD_`` and the other variables glibc reads, or another allocator in ``LD_PRELOAD`` such
as jemalloc or tcmalloc).
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Mapping

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: glibc's largest M_MMAP_THRESHOLD on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX)
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 64 * 1024 * 1024
#: the environment variables through which a user tunes glibc's allocator
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def keep_freed_memory(environ: Mapping[str, str] | None = None) -> str | None:
    """Set glibc's thresholds (module docstring); returns why they were left as they are, or None once set."""
    environ = os.environ if environ is None else environ
    user = [name for name in USER_SETTINGS if environ.get(name)]
    if "glibc.malloc" in environ.get("GLIBC_TUNABLES", ""):
        user.append("GLIBC_TUNABLES")
    if "malloc" in environ.get("LD_PRELOAD", ""):  # jemalloc, tcmalloc, mimalloc: not glibc's to tune
        user.append("LD_PRELOAD")
    if user:
        return f"the environment sets {', '.join(user)}"
    if platform.libc_ver()[0] != "glibc":
        return "the C library is not glibc"
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "mallopt is not available"
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; the mmap threshold first (setting either fixes both from then on)
    if mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 or mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return "mallopt refused the thresholds"
    return None
