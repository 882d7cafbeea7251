"""glibc malloc settings for generation: large tensors from the heap, not from fresh mmaps.

Holds ``keep_large_blocks_in_heap``.

Why: glibc serves every block over its mmap threshold (128 KB to 32 MB, adaptive) with a fresh
``mmap`` and returns it with ``munmap`` when freed. A forward pass allocates and frees many
blocks of 10-100 MB (prefill activations, logits, the keys and values SDPA expands for its
heads), so every one of them is page-faulted in again, on every step: on this project's 2-core
machine a 32-row decode step went from about 1.1 s to 4.2 s that way, and to 8x slower than quiet
when a second busy process shared the cores. With mmaps off and trimming pushed out, freed blocks
stay in the process's heap and are reused without faults; the cost is that the heap keeps its
high-water mark until the process ends (a generation process reaches it within a few batches).

This is what ``MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=...`` do from the environment, applied
by ``load_backend``/``HFBackend`` so that every process that generates gets it (``crl``, the
benchmarks, Ray workers, a user's own script). ``CRL_MALLOC=system`` leaves glibc's defaults
(so does a ``MALLOC_MMAP_MAX_`` already in the environment); with jemalloc or tcmalloc in
``LD_PRELOAD`` the call changes only glibc's unused allocator.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

__all__ = ["keep_large_blocks_in_heap"]

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_MAX = -4
_TRIM_THRESHOLD = 2**31 - 1  # bytes of free heap top kept before trimming (mallopt takes an int)

_applied = False


def keep_large_blocks_in_heap() -> bool:
    """Turn glibc's mmap for large blocks off and its heap trimming out, once per process.

    Returns whether the settings are in force (False where the C library is not glibc, where
    ``CRL_MALLOC=system`` is set, or where ``MALLOC_MMAP_MAX_`` already decides).

    Example:
        >>> keep_large_blocks_in_heap() in (True, False)
        True
    """
    global _applied
    if _applied:
        return True
    if (os.environ.get("CRL_MALLOC", "").lower() == "system" or "MALLOC_MMAP_MAX_" in os.environ
            or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    # mallopt returns 1 on success
    _applied = bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD,
                                                                        _TRIM_THRESHOLD))
    return _applied
