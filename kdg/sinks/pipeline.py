"""Pipelined exactly-once writes: batch n+1 is copied into Postgres while batch n commits.

One asyncpg connection runs one statement at a time, so a :class:`Pipeline` keeps ``depth``
connections, each driven by a thread of its own, and hands them batches in turn; meanwhile the
consume loop polls and sorts the next batch. Three rules keep every batch exactly-once:

1. **Chained offsets.** A batch's fenced UPDATE of ``kdg_offsets`` also requires each partition to
   hold the offset the batch before it stored there. If that batch rolled back, this one matches
   nothing and rolls back too (:class:`~kdg.errors.RetryBatch`); nothing is ever stored past a gap.
2. **Ordered steps.** A batch claims its keys in ``kdg_dedup`` only after its predecessor claimed
   its own, and touches ``kdg_offsets`` only after its predecessor did (a ``--handler`` runs only
   after its predecessor ended). A batch with typed tables reads them (a delete's rows, a kept value),
   so it must see its predecessor committed. It stages its rows (in its connection's own temp table),
   and once its predecessor has written its rows under the pipeline's lock (:attr:`Turn.key`, an advisory
   lock held to commit), prepares its claims and asks for that lock: Postgres grants it, and runs its
   next statement, the moment the predecessor commits, with no thread to wake in between. (A batch of one
   typed table lets its successor go on once it has made its claims, and the successor copies its own in
   before asking for the lock, looking them up once it holds it: that COPY overlaps the upsert before it.)
   Row locks then make commits land in submission order, and no batch ever waits in Python for one that
   waits in Postgres for it.
3. **Outcomes in order.** :meth:`Pipeline.submit` hands back finished batches oldest first; after
   any failure the caller drains the pipeline and reads on from what Postgres stored.
"""

import secrets
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from kdg import faults
from kdg.sinks import Batch, Outcome


class Turn:
    """A batch's place in line: when it may claim and move offsets, and when its successor may."""

    def __init__(self, before: "Turn | None", overlapping: Callable[[], int], key: int = 0):
        self._before, self._overlapping, self.key = before, overlapping, key
        self._claimed, self._updated, self._ended = threading.Event(), threading.Event(), threading.Event()
        self._locked = threading.Event()

    def wait_locked(self) -> None:
        """Before asking for :attr:`key`: the predecessor wrote its rows (or claimed them, :meth:`locked`) holding
        it (Postgres then waits for its commit), or ended."""
        if self._before is not None:
            self._before._locked.wait()

    def locked(self) -> None:
        """Written (a batch of one typed table: claimed), holding :attr:`key`: the next batch may prepare its
        claims and ask for it."""
        self._locked.set()

    def wait_claims(self) -> None:
        if self._before is not None:
            self._before._claimed.wait()

    def claimed(self) -> None:
        self._claimed.set()

    def wait_update(self) -> None:
        if self._before is not None:
            self._before._updated.wait()

    def wait_ended(self) -> None:
        """For a ``--handler``: the user's SQL sees every earlier batch committed, as without a pipeline."""
        if self._before is not None:
            self._before._ended.wait()

    def updated(self) -> None:
        """Offsets moved (or failed to): the next batch may take its turn. Then it may commit."""
        self._updated.set()
        if self._overlapping() > 1:  # a later batch is being written on another connection
            faults.reach("pipelined-commit")

    def done(self) -> None:
        """Ended, however: never leave a successor waiting."""
        self._claimed.set()
        self._locked.set()
        self._updated.set()
        self._ended.set()
        self._before = None  # the chain is freed as it goes


class Pipeline:
    """``depth`` Postgres connections writing batches in turn (see the module's rules)."""

    def __init__(self, open_store: Callable[[], object], depth: int):
        self.stores: list = []
        try:
            for _ in range(depth):
                self.stores.append(open_store())
        except BaseException:
            self.close()
            raise
        self._threads = [ThreadPoolExecutor(1, thread_name_prefix=f"kdg-pg-{i}") for i in range(depth)]
        self._in_flight: deque = deque()  # (batch, future), oldest first
        self._submitted = 0
        self._last: Turn | None = None
        self._writing = 0
        self._lock = threading.Lock()
        self._key = secrets.randbits(63)  # this pipeline's advisory lock (one 64-bit key: not kdg's two-key locks)

    @property
    def records_in_flight(self) -> int:
        return sum(len(batch) for batch, _ in self._in_flight)

    def _overlapping(self) -> int:
        return self._writing

    def submit(self, batch: Batch, write: Callable) -> list[Outcome]:
        """Start ``write(store, turn)`` for ``batch`` on the next connection; the outcomes finished so far.

        Waits for the oldest batch first when every connection is busy.
        """
        finished = [self._settle()] if len(self._in_flight) == len(self.stores) else []
        slot = self._submitted % len(self.stores)
        self._submitted += 1
        turn = self._last = Turn(self._last, self._overlapping, self._key)
        store = self.stores[slot]

        def job():
            with self._lock:
                self._writing += 1
            try:
                return write(store, turn)
            finally:
                with self._lock:
                    self._writing -= 1
                turn.done()

        self._in_flight.append((batch, self._threads[slot].submit(job)))
        return finished + self.finished()

    def finished(self) -> list[Outcome]:
        """The outcomes of the oldest batches that are done, without waiting (an idle loop's accounting)."""
        done = []
        while self._in_flight and self._in_flight[0][1].done():
            done.append(self._settle())
        return done

    def drain(self) -> list[Outcome]:
        """Wait for every batch in flight; their outcomes, oldest first."""
        return [self._settle() for _ in range(len(self._in_flight))]

    def _settle(self) -> Outcome:
        batch, future = self._in_flight.popleft()
        error = future.exception()
        return Outcome(batch, error=error) if error is not None else Outcome(batch, result=future.result())

    def lost(self) -> bool:
        return any(store.lost() for store in self.stores)

    def reconnect(self, give_up_after: float, notice, sleep=time.sleep) -> float:
        """After :meth:`drain`: connect again every connection Postgres dropped; seconds waited."""
        waited = 0.0
        for store in self.stores:
            if not store.alive():
                waited += store.reconnect(max(give_up_after - waited, 1.0), notice, sleep)
        return waited

    def close(self) -> None:
        for pool in getattr(self, "_threads", ()):
            pool.shutdown(wait=True)  # a batch still writing finishes (or fails) before its connection closes
        for store in self.stores:
            store.close()
