"""The producer ledger: the store's ledger statements, and a writer that COPYs batches of rows on a
thread of its own, so sending goes on while Postgres writes.

:class:`LedgerMixin` (mixed into :class:`kdg.store.pg.Store`) records producer runs and COPYs
ledger rows. Rows reach ``kdg_ledger`` in the order they were given, through the one connection
of the :class:`~kdg.store.pg.Store` handed over to :class:`LedgerWriter`; nothing decides here
what a row says (that is ``kdg.produce``'s business). At most ``depth`` batches wait for the
thread, so a slow Postgres slows the producer down instead of filling memory.
"""

import json
import queue
import threading
import time
from typing import TYPE_CHECKING, Callable

from kdg.errors import ConnectionFailed

if TYPE_CHECKING:  # pg.py mixes LedgerMixin into Store: importing it here at run time would be a cycle
    from kdg.store.pg import Store

ABORTED_BY_KILL = "its transaction was aborted: the producer was killed before committing it"
# a row is one record, or (seq_count, key_form, key_suffix set) a run of them: 006_ledger_ranges.sql
LEDGER_COLUMNS = ("run_id", "idempotency_key", "topic", "seq", "status", "partition", "offset", "error",
                  "seq_count", "key_form", "key_suffix")


class LedgerMixin:
    """The producer ledger: owns a run's row in ``kdg_producer_runs`` and its rows in ``kdg_ledger``.

    A run is started and finished with a summary; its ledger rows go in by COPY (through the
    store's ``copy_rows``), usually from a :class:`LedgerWriter`'s thread.
    """

    def start_run(self, run_id, topic: str, guarantee: str, transactional_id: str | None = None) -> None:
        """A run begins; a transactional one's id is kept in its summary until it finishes (:meth:`killed_runs`)."""
        started = None if transactional_id is None else json.dumps({"transactional_id": transactional_id})
        self._run(self.conn.execute(
            "INSERT INTO kdg_producer_runs (run_id, topic, guarantee, summary) VALUES ($1, $2, $3, $4)",
            run_id, topic, guarantee, started))

    def killed_runs(self, topic: str, transactional_id: str, run_id) -> list:
        """Runs of ``topic`` with ``transactional_id`` that never finished, other than ``run_id``: dead, once
        ``run_id``'s producer holds that id (its init fenced them and aborted their open transaction). Each with
        the first record of its last ledger write (one COPY, so one ``recorded_at``: one transaction's rows)."""
        return self._run(self.conn.fetch(
            """SELECT r.run_id, l."partition", l."offset", l.recorded_at FROM kdg_producer_runs r
               LEFT JOIN LATERAL (SELECT "partition", "offset", recorded_at FROM kdg_ledger l
                                  WHERE l.topic = r.topic AND l.run_id = r.run_id AND l.status = 'acked'
                                  ORDER BY recorded_at DESC, "offset" IS NULL, seq LIMIT 1) l ON true
               WHERE r.topic = $1 AND r.finished_at IS NULL AND r.summary->>'transactional_id' = $2
                     AND r.run_id <> $3""", topic, transactional_id, run_id))

    def settle_killed_run(self, run_id, topic: str, last_written, committed: bool) -> None:
        """A killed run is finished: its last ledger write (``recorded_at`` ``last_written``, if any) failed if
        its transaction was not ``committed``."""
        if last_written is not None and not committed:
            self._run(self.conn.execute(
                """UPDATE kdg_ledger SET status = 'failed', "partition" = NULL, "offset" = NULL, error = $4
                   WHERE topic = $1 AND run_id = $2 AND recorded_at = $3 AND status = 'acked'""",
                topic, run_id, last_written, ABORTED_BY_KILL))
        self._run(self.conn.execute(
            "UPDATE kdg_producer_runs SET finished_at = now(), summary = $2 WHERE run_id = $1", run_id,
            json.dumps({"killed": True, "last_transaction": None if last_written is None
                        else "committed" if committed else "aborted"})))

    def void_ledger(self, run_id, topic: str, rows: list[tuple], reason: str) -> None:
        """The ledger ``rows`` (as written) of a transaction that was aborted: failed, with ``reason``."""
        keys, seqs = [r[1] for r in rows], [r[3] for r in rows]
        self._run(self.conn.execute(
            """UPDATE kdg_ledger SET status = 'failed', "partition" = NULL, "offset" = NULL, error = $5
               WHERE topic = $1 AND run_id = $2 AND status = 'acked'
                     AND (idempotency_key, seq) IN (SELECT * FROM unnest($3::text[], $4::bigint[]))""",
            topic, run_id, keys, seqs, reason))

    def finish_run(self, run_id, summary: dict) -> None:
        self._run(self.conn.execute(
            "UPDATE kdg_producer_runs SET finished_at = now(), summary = $2 WHERE run_id = $1",
            run_id, json.dumps(summary)))

    def copy_ledger(self, rows: list[tuple]) -> None:
        """COPY ledger rows, each of :data:`LEDGER_COLUMNS` or (one record each) of its first eight."""
        if not rows:
            return
        if time.monotonic() >= self._ledger_due:
            self.ledger_upkeep()
        self.copy_rows("kdg_ledger", rows, LEDGER_COLUMNS[:len(rows[0])])

    def ledger_upkeep(self) -> None:
        """Partitions for the rows about to be written (now and the next width, on the server's clock, which
        stamps ``recorded_at``), and expired ones dropped; again after half a width (50 ms to 5 min)."""
        at = self._run(self.conn.fetchval("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"))
        done = self.maintain(relations=["kdg_ledger"], at_ms=at)
        width = done[0].width_ms if done else 60_000
        self._ledger_due = time.monotonic() + min(300.0, max(0.05, width / 2000))

    def set_ledger_retention(self, asked: str) -> None:
        """``kdg produce --ledger-retention``: store it, unless another writer chose another one."""
        from kdg.errors import UsageError
        from kdg.retention import parse_retention, show

        wanted = parse_retention(asked, "--ledger-retention")
        window = self.ledger_window()
        if window.retention_from is not None and window.retention_ms != wanted:
            raise UsageError(f"the producer ledger keeps rows for {show(window.retention_ms)} (chosen by "
                             f"{window.retention_from}); to change it for every producer: "
                             f"kdg db maintain --ledger-retention {asked}")
        if window.retention_from is None:
            self.set_retention(window, wanted, "kdg produce --ledger-retention")


class LedgerWriter:
    """Takes over ``store`` until :meth:`close`: no one else may use it meanwhile.

    A batch that fails to be written (Postgres gone past ``pg_wait``, a refused statement, a stop asked
    while waiting for Postgres) stops the writer: nothing more is written, and the error is raised once,
    by the next :meth:`write` or else by :meth:`close`, saying how many acknowledged records have no row.
    ``shutdown`` (:class:`kdg.lifecycle.Shutdown`) ends those waits; ``waiting(reason)`` hears when the
    writer starts waiting for Postgres (a reason) and when it wrote again (None): readiness, and a notice.
    """

    def __init__(self, store: "Store", depth: int = 2, pg_wait: float = 120.0, shutdown=None,
                 waiting: Callable[[str | None], None] = lambda reason: None):
        self._store, self.pg_wait, self._shutdown, self._waiting = store, pg_wait, shutdown, waiting
        self._batches: queue.Queue[list[tuple] | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._error_raised = False
        self.unwritten = 0  # records whose rows failed to be written, or were queued behind a failure
        self._thread = threading.Thread(target=self._run, name="kdg-ledger-writer", daemon=True)
        self._thread.start()

    def write(self, rows: list[tuple]) -> None:
        """Queue ``rows`` (the list is the writer's from now on); waits while ``depth`` batches are queued
        (Postgres slow, or away: sending pauses with it), unless a stop is asked meanwhile."""
        self._raise_failure()
        while rows:
            try:
                self._batches.put(rows, timeout=0.2)
                return
            except queue.Full:
                if self._shutdown is not None and self._shutdown.requested:
                    self.unwritten += _records(rows)
                    self._raise_failure()  # the writer gave up meanwhile: its error says why
                    raise ConnectionFailed("stopped while the producer ledger waited for Postgres")

    def run(self, statement: Callable[["Store"], object]) -> None:
        """Queue ``statement(store)``, made on the writer's thread after the rows queued before it (as
        :meth:`write`: Postgres away is waited for, and the statement may run twice)."""
        self.write([statement])

    def flush(self) -> None:
        """Wait until everything queued is written (Postgres away: up to ``pg_wait``); raise as :meth:`write`."""
        self._raise_failure()
        self._batches.join()
        self._raise_failure()

    def close(self) -> None:
        """Wait until every queued batch is written; raise the error that stopped the writer, if one did."""
        if self._thread.is_alive():
            self._batches.put(None)
            self._thread.join()
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._error is not None and not self._error_raised:
            self._error_raised = True
            if not isinstance(self._error, ConnectionFailed):
                raise self._error
            raise ConnectionFailed(f"the producer ledger could not be written ({self._error}): {self.unwritten:,} "
                                   "records Kafka acknowledged have no ledger rows, so an audit counts them as "
                                   "unexpected") from self._error

    def _run(self) -> None:
        while (rows := self._batches.get()) is not None:
            if self._error is None:
                try:
                    self._copy(rows)
                except BaseException as exc:  # handed to the producer's thread, which decides
                    self._error = exc
            if self._error is not None:
                self.unwritten += _records(rows)
            self._batches.task_done()

    def _copy(self, rows: list[tuple]) -> None:
        """COPY ``rows``; Postgres gone (a restart) is waited for and the COPY made again. A COPY whose
        answer was lost may have committed: its rows are then there twice, which the audit, counting
        keys, does not mind — a row missing would be a record it could not account for."""
        waited = []

        def notice(text: str) -> None:
            if not waited:
                self._waiting(f"producer ledger: {text}")
            waited.append(text)

        sleep = self._shutdown.sleep if self._shutdown is not None else time.sleep
        if callable(rows[0]):  # a statement (run)
            self._store.across_restart(lambda: rows[0](self._store), self.pg_wait, notice, sleep)
        else:
            self._store.across_restart(lambda: self._store.copy_ledger(rows), self.pg_wait, notice, sleep)
        if waited:
            self._waiting(None)


def _records(rows: list[tuple]) -> int:
    """The records ledger ``rows`` stand for: a run's row counts its ``seq_count`` (LEDGER_COLUMNS)."""
    return sum(row[8] if len(row) > 8 and row[8] else 1 for row in rows if not callable(row))
