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

What is left (measured: one burst of 5,000 records into an idle consumer, 55 → 62 MB, then +2 MB over three
more; with ``PYTHONMALLOC=malloc`` 56 → 59 → 60) is mostly the Python heap's high-water mark for one full
batch, which pymalloc keeps: bounded by the batch size, not a leak.
"""

import contextlib
import ctypes
import ctypes.util
import gc
import threading

M_ARENA_MAX = -8      # glibc's mallopt parameters
M_MMAP_THRESHOLD = -3
ARENAS = 2            # librdkafka's threads share two arenas instead of one each (up to 8 per core)
MMAP_THRESHOLD = 128 * 1024  # glibc's initial value; setting it stops the sliding (mallopt(3))
TRIM_EVERY_S = 10.0   # malloc_trim walks the free chunks: well under a millisecond on these heaps
GC_YOUNG = 50_000     # allocations between young collections (Python's default: 700)


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
