"""Native memory of a long-running command: what librdkafka frees goes back to the system.

A soak measured consumers' RSS growing 11-23 % over an hour, in steps at broker kills, while the Python
heap's live objects stayed flat (tracemalloc: 21.2 MB before and after six broker kills). The steps are memory that
librdkafka's threads allocate while a broker is away (retries, reconnects, leader moves) and free when it is
back, which glibc keeps in per-thread arenas instead of returning it. In the same run, capping glibc at two
arenas and trimming every few seconds halved the growth (consumer +23 % → +11 %, producer +5 % → +3 %);
docs/soak-60min has the hour-long figures.

glibc also slides its mmap threshold up to the size of any mapped block that is freed, after which blocks
that large come from the arenas, where one live neighbour pins them. Fixing the threshold keeps every
block of :data:`MMAP_THRESHOLD` or more in its own mapping, unmapped the moment it is freed.

What is left is the Python heap's high-water mark for one full batch, which pymalloc keeps: bounded by the
batch size, not a leak. Much of it is pinned, not used: after a 5,000-record batch, ``sys._debugmallocstats()``
showed pymalloc's 1 MiB arenas up from 16 to 22 while its live blocks grew 0.4 MB, with 2,000 freed 2-tuples
and 2,000 freed 7-tuples kept on the interpreter's free lists, in pools of the new arenas. A full collection
empties those lists; :class:`CalmCollector` runs one once a burst has passed. Even then 7 new arenas stayed,
held by about 0.3 MB of live objects made while the batch filled the older ones.
"""

import contextlib
import ctypes
import ctypes.util
import gc
import threading
import time

M_ARENA_MAX = -8      # glibc's mallopt parameters
M_MMAP_THRESHOLD = -3
ARENAS = 2            # librdkafka's threads share two arenas instead of one each (up to 8 per core)
MMAP_THRESHOLD = 128 * 1024  # glibc's initial value; setting it stops the sliding (mallopt(3))
TRIM_EVERY_S = 10.0   # malloc_trim walks the free chunks: well under a millisecond on these heaps
GC_YOUNG = 50_000     # allocations between young collections (Python's default: 700)
BURST_RECORDS = 5_000  # records since the last full collection that make a calm turn collect (one default batch)
CALM_COLLECT_EVERY_S = 30.0  # ... at most this often


def _glibc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


@contextlib.contextmanager
def returned_to_the_system():
    """For the life of a long-running command: fewer arenas (before its clients start threads), a fixed mmap
    threshold, and freed native memory trimmed back to the system every :data:`TRIM_EVERY_S`. A no-op
    without glibc."""
    libc = _glibc()
    if libc is None:
        yield
        return
    libc.mallopt(M_ARENA_MAX, ARENAS)
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    done = threading.Event()

    def trim() -> None:
        while not done.wait(TRIM_EVERY_S):
            libc.malloc_trim(0)

    threading.Thread(target=trim, name="kdg-malloc-trim", daemon=True).start()
    try:
        yield
    finally:
        done.set()


@contextlib.contextmanager
def collected_rarely():
    """For the life of a long-running command: what start-up loaded (modules, typer, the clients' classes)
    frozen out of the cyclic collector's sight, and young collections 70 times rarer.

    A batch is thousands of messages, records and rows: acyclic, freed by reference counting the moment
    the batch is done, yet each 700 of them started a collection, and every tenth of those one of the older
    generations, walking every live object. py-spy put 21 % of an exactly-once consumer's samples (40 % of
    its main thread's) in ``gc_collect_main``. Cycles (an exception and its traceback) are still collected,
    later."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


class CalmCollector:
    """One full collection once a burst has passed: after :data:`BURST_RECORDS` records or more, at the first
    turn whose poll did not fill a batch, with no full batch being written (the loop has caught up), at most
    every :data:`CALM_COLLECT_EVERY_S`.

    It empties the free lists that pin arenas a full batch took (see the module's text), and collects the
    cycles that :func:`collected_rarely` lets wait. Catching up, batch after full batch, it never runs; at a
    steady trickle it runs every half minute, for a few milliseconds. ``benchmarks/rss_burst.py`` (an idle
    consumer given 4 bursts of 5,000 records of 200 B; MB idle → after the last burst, with / without it):
    exactly-once typed 47 → 50-51 / 47 → 52; at-least-once 45 → 50 / 45 → 52; exactly-once generic 47 → 53
    either way.
    """

    def __init__(self, records: int = BURST_RECORDS, every_s: float = CALM_COLLECT_EVERY_S, clock=time.monotonic):
        self._records, self._every, self._clock = records, every_s, clock
        self._since, self._next = 0, 0.0
        self.collections = 0

    def turned(self, got: int, busy: bool) -> bool:
        """Count a turn's ``got`` records (``busy``: its poll filled a batch, or a full batch is still being
        written); True if it collected."""
        self._since += got
        if busy or self._since < self._records or self._clock() < self._next:
            return False
        gc.collect()
        self._since, self._next = 0, self._clock() + self._every
        self.collections += 1
        return True
