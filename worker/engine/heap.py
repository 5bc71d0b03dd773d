"""A round's large arrays reuse the process's heap instead of asking the kernel for new pages every round.

glibc's malloc serves each block of 128 KiB or more with its own mmap and unmaps it when it is freed, and it
hands the top of its heap back to the kernel once more than 128 KiB of it is free (M_TRIM_THRESHOLD). A worker
allocates the same large blocks every round and frees them at its end: a round of 16 requests of 64 texts holds
1.5 MiB of vectors, their normalised copy, 16 result blobs of 98 KB and the finish pipeline's packed bytes
(1.6 MB). Each time they come back as fresh pages: one page fault per 4 KiB, each page zeroed by the kernel.
(A freed mmapped block raises glibc's threshold to its size, but that moving threshold also keeps the trim
threshold at twice it, so the pages still go back at the end of the round.)

So the worker, at its start, sets M_MMAP_THRESHOLD to 32 MiB (the most glibc takes on a 64-bit machine) and
M_TRIM_THRESHOLD to 64 MiB: blocks up to 32 MiB come from the heap, and up to 64 MiB of freed heap stays mapped
for the next round. Measured with the null model on 64-text requests (2 cores, docs/performance.md): 15-29
page faults a request became 4.1-4.8, and the worker's CPU per request fell by about a sixth. What it costs: a
worker's resident memory stays up to 64 MiB above what it holds, per malloc arena, after its largest round.

An operator who tunes glibc's malloc (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, GLIBC_TUNABLES) keeps
their settings; without glibc (musl, macOS) nothing is done; an allocator loaded with LD_PRELOAD (jemalloc,
tcmalloc) does not use glibc's malloc, so the calls change nothing there.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Mapping

log = logging.getLogger("embedfleet.worker")

MMAP_THRESHOLD = 32 << 20  # bytes: blocks below it come from the heap (glibc's largest: 32 MiB on 64-bit)
TRIM_THRESHOLD = 64 << 20  # bytes of free heap kept mapped for reuse
OPERATOR_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def keep_freed_memory(environ: Mapping[str, str]) -> bool:
    """Set the two thresholds (glibc's mallopt) unless the operator tuned malloc in `environ`; True if set."""
    if any(environ.get(name) for name in OPERATOR_SETTINGS):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - glibc only: musl has a mallopt that does nothing
        mallopt = libc.mallopt
    except (AttributeError, OSError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not done:  # a 32-bit glibc takes a smaller mmap threshold: its defaults stay
        log.debug("glibc's mallopt refused the worker's malloc thresholds; its defaults stay")
    return done
