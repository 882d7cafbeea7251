"""``call_in_fresh_thread``: run torch work of a helper thread in a thread that then ends.

torch's CPU kernels run their parallel regions on GNU OpenMP (libgomp), which gives every thread
that starts one a team of worker threads of its own, kept while that thread lives. Once the
process holds more of those threads than there are cores, libgomp throttles every team: its
workers sleep after about a hundred spins instead of waiting for the next region, and each of the
thousands of small regions of a generation or an update then waits for them to wake. A
long-lived helper thread that ran torch once (the extractor's generation in the background, a
dense index's encoder) so slowed the main thread's rollouts and updates for the rest of a run:
on 2 cores 1.2x, with about 1.4 of the 2 cores busy (``benchmarks/helper_thread_bench.py``). A
thread that ends frees its team, and the main thread's regions run at full speed again.

>>> call_in_fresh_thread(lambda: 6 * 7)
42
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["call_in_fresh_thread"]

T = TypeVar("T")


def call_in_fresh_thread(fn: Callable[[], T], name: str = "crl-torch-call") -> T:
    """``fn()`` in a new thread, waited for; its result returned, its exception raised here.
    Leaving the pool's block joins the thread, so it has ended when this returns."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix=name) as pool:
        return pool.submit(fn).result()
