"""The one Postgres store: sink rows, dedup claims, fenced offsets and the producer ledger.

``kdg consume``, ``kdg produce``, ``kdg audit`` and Spark executors all write through here.
The SQL is async (asyncpg); :class:`Store` gives plain callers a blocking facade on a private
event loop, so it can be used from confluent-kafka callbacks and Spark tasks alike.

This module is the connection (its life, and raw SQL); each concern's statements live in a
module of their own and are mixed into :class:`Store`: fenced offsets in :mod:`kdg.store.offsets`,
exactly-once claims in :mod:`kdg.store.claims`, sink tables and plain/typed writes in
:mod:`kdg.store.sinks`, replay runs in :mod:`kdg.store.replays`, the producer ledger in
:mod:`kdg.store.ledger`, retention windows and their partitions in :mod:`kdg.store.windows`.
"""

import asyncio
import time
from collections import deque
from typing import Callable

import asyncpg

from kdg.errors import ConnectionFailed, KdgError, PostgresRefused, RetryBatch
from kdg.lifecycle import LAST_TRY_S
from kdg.settings import TableName, redact_dsn
from kdg.store.claims import ClaimsMixin
from kdg.store.ledger import LedgerMixin
from kdg.store.migrations import connect, require_schema
from kdg.store.offsets import OffsetsMixin
from kdg.store.replays import ReplaysMixin
from kdg.store.rows import staging_table
from kdg.store.sinks import SinksMixin
from kdg.store.unit import UnitMixin
from kdg.store.windows import Window, WindowsMixin, dropped_while_writing, forget_dropped

_STAGE = staging_table()


class Store(OffsetsMixin, ClaimsMixin, SinksMixin, UnitMixin, ReplaysMixin, LedgerMixin, WindowsMixin):
    """A blocking facade over one asyncpg connection.

    This class holds the connection's life (connect, reconnect, close) and raw SQL; what the store
    does with it comes from one mixin per concern: :class:`~kdg.store.offsets.OffsetsMixin`,
    :class:`~kdg.store.claims.ClaimsMixin`, :class:`~kdg.store.sinks.SinksMixin`,
    :class:`~kdg.store.replays.ReplaysMixin` and :class:`~kdg.store.ledger.LedgerMixin`.
    """

    def __init__(self, dsn: str):
        self.dsn = dsn
        self._loop = asyncio.new_event_loop()
        self._sink_ready: set[TableName] = set()
        self._stages: set[str] = set()
        self._windows: dict[str, Window] = {}  # claim windows by sink table identity (kdg.store.windows)
        self._ledger_due = 0.0  # when the ledger's partitions are next looked after (kdg.store.ledger)
        self.unclaimed = 0  # exactly-once rows written without a claim: their keys were older than the window
        self.healed: deque[str] = deque()  # claim state found dropped outside kdg by a write, in words, until read
        try:
            self.conn: asyncpg.Connection = self._run(connect(dsn))
        except BaseException:
            self._loop.close()
            raise
        try:
            self._run(require_schema(self.conn, dsn))
            self._run(self.conn.execute(_STAGE))
        except BaseException:
            self.close()  # a store that cannot be used leaves no connection behind
            raise

    def _run(self, coro):
        try:
            return self._converted(coro)
        except PostgresRefused as exc:
            windows = list(self._windows.values())
            self._windows.clear()  # a rolled-back transaction takes back the partitions it made: read them again
            if windows and isinstance(exc.__cause__, (asyncpg.exceptions.CheckViolationError,  # no partition
                                                      asyncpg.exceptions.UndefinedTableError)):  # no claim table
                self._forget_dropped(windows, exc)
            raise
        except BaseException:
            self._windows.clear()
            raise

    def _forget_dropped(self, windows: list[Window], exc: PostgresRefused) -> None:
        """After a write refused for want of a partition ("no partition of relation … found for row") or of a
        table: if one of this store's claim partitions was dropped outside kdg, forget it (it is made again as
        the batch is written again) and ask for the batch again, instead of failing every write of its range
        for ever. Also when another writer of the table forgot it first (the window moved since this batch
        read it: a pipelined batch meets the same gap at the same time). A whole claim table dropped stops
        the writer (:func:`~kdg.store.windows.dropped_while_writing`). Any other refusal stands."""
        async def forget() -> tuple[dict, list[Window], bool]:
            found = await forget_dropped(self.conn, [w.relation for w in windows])
            versions = {w.relation: await self.conn.fetchval(
                "SELECT updated_at FROM kdg_windows WHERE relation = $1", w.relation) for w in windows}
            whole = [w for w in windows if versions[w.relation] is None]  # forgotten now, or by another writer
            return found, whole, any(versions[w.relation] != w.version for w in windows)

        try:
            found, whole, moved = self._converted(forget())
        except KdgError:
            return  # the refusal is what the caller hears
        notes = [note for _, found_notes in found.values() for note in found_notes]
        self.healed.extend(notes)
        if whole:
            raise dropped_while_writing(whole[0]) from exc
        if notes or moved:
            raise RetryBatch(f"{notes[0] if notes else 'the claim window moved'} (the batch is written again)") \
                from exc

    def _converted(self, coro):
        """Run ``coro``, with asyncpg's errors as kdg's."""
        try:
            return self._loop.run_until_complete(coro)
        except (OSError, asyncpg.exceptions.ConnectionDoesNotExistError,
                asyncpg.exceptions.InterfaceError, asyncpg.exceptions.AdminShutdownError,
                asyncpg.exceptions.CannotConnectNowError, asyncpg.exceptions.InternalClientError) as exc:
            # a connection an error left half-way through an operation answers every later call with
            # "another operation is in progress" (an InterfaceError, or after a server restart an
            # InternalClientError "cannot switch to state …": two consumers of the 60-minute soak exited 1
            # on it): dropped now, it reads as lost and is made again
            conn = getattr(self, "conn", None)
            if conn is not None and not conn.is_closed():
                conn.terminate()
            raise ConnectionFailed(f"lost Postgres at {redact_dsn(self.dsn)}: {exc}") from exc
        except asyncpg.PostgresError as exc:
            raise PostgresRefused(f"Postgres refused a statement ({exc.sqlstate} {type(exc).__name__}): "
                                  f"{str(exc).splitlines()[0]}") from exc

    def lost(self) -> bool:
        """Whether the connection is gone (the server went away), as opposed to a statement failing."""
        return self.conn.is_closed()

    def alive(self) -> bool:
        """Whether Postgres answers on this connection now (a connection idle through a restart looks open)."""
        if self.lost():
            return False
        try:
            self._run(self.conn.fetchval("SELECT 1"))
            return True
        except ConnectionFailed:
            return False

    def reconnect(self, give_up_after: float, notice: Callable[[str], None] = lambda text: None,
                  sleep: Callable[[float], object] = time.sleep) -> float:
        """Connect again after :meth:`lost`, backing off until Postgres answers; returns the seconds waited.

        Postgres restarting, in recovery or out of connections is waited for; after
        ``give_up_after`` seconds the last error is raised as :class:`ConnectionFailed`.
        Per-session state (the temp staging tables) is made again on the new connection.
        ``sleep(seconds)`` waits between attempts; when it returns True (a stop was requested,
        :meth:`kdg.lifecycle.Shutdown.sleep`) the wait ends with :class:`ConnectionFailed`.
        """
        self.conn.terminate()
        started, delay, attempt = time.monotonic(), 0.25, 0
        while True:
            attempt += 1
            try:
                conn = self._run(connect(self.dsn, timeout=5))
                try:
                    self._run(conn.execute(_STAGE))
                except BaseException:
                    conn.terminate()
                    raise
                break
            except ConnectionFailed as exc:
                waited = time.monotonic() - started
                left = give_up_after - waited  # the last attempt at the deadline, not a back-off before it
                if left < LAST_TRY_S:
                    raise ConnectionFailed(f"Postgres did not come back within {give_up_after:g} s "
                                           f"(attempt {attempt}): {exc}") from exc
                notice(f"Postgres unreachable (attempt {attempt}, {waited:.1f} s): {exc}; "
                       f"retrying in {min(delay, left):.2g} s")
                if sleep(min(delay, left)) is True:
                    raise ConnectionFailed(f"stopped while waiting for Postgres (attempt {attempt}): {exc}") from exc
                delay = min(delay * 2, 5.0)
        self.conn = conn
        self._stages.clear()
        return time.monotonic() - started

    def across_restart(self, call: Callable[[], object], give_up_after: float = 120.0,
                       notice: Callable[[str], None] = lambda text: None, sleep: Callable[[float], object] = time.sleep):
        """``call()``; when it fails because Postgres went away (a restart), wait for it and call again
        (``notice`` and ``sleep`` as :meth:`reconnect` takes them: a stop ends the wait).

        Only for statements that may run twice: one whose answer was lost may have committed.
        """
        try:
            return call()
        except ConnectionFailed:
            if self.alive():
                raise
            self.reconnect(give_up_after, notice, sleep)
            return call()

    def close(self) -> None:
        """Close the connection and the private loop; a second call does nothing."""
        if self._loop.is_closed():
            return
        closing = self.conn.close(timeout=5)
        try:
            self._loop.run_until_complete(closing)
        except Exception:  # closing a dead connection must not hide the real error
            closing.close()  # never awaited if the loop did not get to run it
            self.conn.terminate()
        self._loop.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- raw SQL -----------------------------------------------------------------------------
    def copy_rows(self, table: str, rows: list[tuple], columns: tuple[str, ...]) -> None:
        """COPY ``rows`` into ``table`` (a name kdg chose, never the user's)."""
        if rows:
            self._run(self.conn.copy_records_to_table(table, records=rows, columns=columns))

    def execute(self, sql: str, *args) -> str:
        return self._run(self.conn.execute(sql, *args))

    def fetch(self, sql: str, *args):
        return self._run(self.conn.fetch(sql, *args))

    def fetchval(self, sql: str, *args):
        return self._run(self.conn.fetchval(sql, *args))
