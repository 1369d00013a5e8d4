"""glibc's malloc told to keep what a training process frees.

On CPU, XLA (JAX's, and TensorFlow's under `jit_compile`) allocates a step's
temporaries afresh at every call, as one block. glibc serves a block above
its mmap threshold (adaptive, at most 32 MiB) with a fresh `mmap` and unmaps
it when it is freed, so the kernel faults every page of it in again at every
step: a many-table step ran at 1.6-1.7x its MLP-only step instead of
1.1x (docs/benchmarks.md, "The host allocator on CPU").

`keep_freed_memory()` makes the running process serve every block from its
heap and keep freed memory for the next step, as `MALLOC_MMAP_MAX_=0
MALLOC_TRIM_THRESHOLD_=...` set before start-up would, with `mallopt`. The
programs that train call it for their own process (`tf-tpu-embed-opt demo`,
the benchmarks); the library never does: a user's process keeps the
allocator its user chose. Where the environment already sets glibc's malloc
variables, they win and nothing changes. Without glibc, there is nothing to
do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

__all__ = ["TRIM_THRESHOLD", "keep_freed_memory", "settings"]

# mallopt's parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# The largest value `mallopt` takes (a C int): free memory at the top of the
# heap is returned to the system only beyond 2 GiB.
TRIM_THRESHOLD = 2**31 - 1

_kept = False


def _environment() -> list:
    """glibc's malloc variables set in the environment, `NAME=value`."""
    glibc = [n for n in os.environ if n.startswith("MALLOC_") and n.endswith("_")]
    if "GLIBC_TUNABLES" in os.environ:
        glibc.append("GLIBC_TUNABLES")
    return sorted(f"{name}={os.environ[name]}" for name in glibc)


def keep_freed_memory() -> str:
    """Keeps freed memory in this process's heap (see module doc), once.

    Returns:
      What this process's allocator does now, as `settings()` says it.
    """
    global _kept
    if not _kept and not _environment() and platform.libc_ver()[0] == "glibc":
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        # Both are needed: either alone left the faults (docs/benchmarks.md).
        if libc.mallopt(_M_MMAP_MAX, 0) and libc.mallopt(
            _M_TRIM_THRESHOLD, TRIM_THRESHOLD
        ):
            _kept = True
    return settings()


def settings() -> str:
    """The host allocator's settings of this process, in a line."""
    if _kept:
        return (
            "glibc keeps freed memory (mallopt: M_MMAP_MAX=0, "
            f"M_TRIM_THRESHOLD={TRIM_THRESHOLD}, by this program)"
        )
    found = _environment()
    if found:
        return ", ".join(found)
    if platform.libc_ver()[0] != "glibc":
        return f"not glibc ({platform.system()}): the system's own"
    return "glibc's defaults (no GLIBC_TUNABLES, no MALLOC_*_)"
