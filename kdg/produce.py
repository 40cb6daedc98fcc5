"""`kdg produce`: send records under a guarantee, stamp each with an idempotency key, keep a ledger."""

import time
import uuid
from bisect import bisect_left
from collections import Counter
from dataclasses import asdict, dataclass, field
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Callable, Iterable

from kdg.errors import ConnectionFailed, DeliveryError, KdgError, ProducerFatal, TransactionAborted
from kdg.guarantees import policy_for
from kdg.kafka.admin import ensure_topic, topic_config
from kdg.kafka.producer import DeliveryReports, KdgProducer, refusals_for_good, refused
from kdg.killed_runs import settle_killed_runs
from kdg.lifecycle import DEFAULT_WAIT_TIMEOUT_S, Shutdown, StopRequested, attempt_s, wait_until_up
from kdg.metrics import Metrics
from kdg.records import ID_HEADER, SEQ_HEADER, Record, id_maker
from kdg.retention import parse_retention
from kdg.settings import Connection

if TYPE_CHECKING:
    from kdg.store.ledger import LedgerWriter

LEDGER_BATCH = 20_000
LEDGER_FLUSH_S = 1.0  # ... or this often, whichever comes first: a slow steady load keeps its ledger current
MAX_TXN_RETRIES = 5


@dataclass
class ProduceRequest:
    topic: str
    guarantee: str
    records: Iterable[Record]
    conn: Connection
    ledger: bool = True
    id_template: str | None = None
    txn_size: int = 10_000
    txn_interval_ms: int = 100
    transactional_id: str | None = None
    partitions: int = 3
    progress: Callable[[int], None] | None = None
    ledger_retention: str | None = None  # how long ledger rows are kept (stored for every producer; None: as stored)
    shutdown: Shutdown = field(default_factory=Shutdown)  # requested (a signal): stop sending, settle, return
    wait_timeout: float = DEFAULT_WAIT_TIMEOUT_S  # start-up: how long to wait for Kafka and Postgres to come up
    metrics_port: int | None = None   # serve /metrics, /healthz and /readyz here (0: any free port)
    metrics_host: str = "0.0.0.0"
    notice: Callable[[str], None] = lambda text: None  # status lines (waiting for Kafka or Postgres)
    chunk: int = 1  # records taken from the input at a time: many only from an input that never waits for more


@dataclass
class ProduceReport:
    guarantee: str
    topic: str
    run_id: str
    sent: int = 0
    acked: int = 0
    failed: int = 0
    unconfirmed: int = 0  # acks=0: sent, and no answer is ever expected
    transactions: int = 0
    aborted_transactions: int = 0
    producer_renewals: int = 0  # a client dead of a renewable fatal error replaced (its transaction sent again)
    duration_s: float = 0.0
    msgs_per_s: float = 0.0
    interrupted: bool = False  # stopped before its input ended: the open transaction (if any) was aborted
    stopped_by: str = ""       # the signal that stopped it
    open_transaction_aborted: bool = False  # ... in the middle of a transaction, which was aborted
    errors: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class _Outcomes:
    """What became of the records sent: counted in the report and, with the ledger, written to Postgres (a row
    per record, or one per run of records whose keys the ledger can rebuild: :meth:`_record`).

    A delivered record is 'acked' (with its partition and offset) when ``confirms`` (the policy's
    ``confirms_delivery``: a broker answered), else only 'sent' (acks=0: no answer is ever expected);
    a failed one is 'failed' with Kafka's reason. With the ledger every record's delivery report is
    read; without it librdkafka reports failures only, and a record that is neither waiting in the
    producer nor reported failed was delivered.
    """

    def __init__(self, report: ProduceReport, ledger: "LedgerWriter | None", run_id, topic: str, confirms: bool,
                 metrics: Metrics, keys=None):
        self.report, self.ledger, self.run_id, self.topic, self.confirms = report, ledger, run_id, topic, confirms
        self.metrics, self.keys = metrics, keys  # keys: the run's id maker (kdg.records.id_maker), for ranges
        self.rows: list[tuple] = []
        self.runs: dict[int, list] = {}  # per partition, the run of records whose row is not made yet
        self.due = time.monotonic() + LEDGER_FLUSH_S  # when the rows are written, full batch or not
        self.held = False  # rows are written only when asked (a transaction's, before it commits: write_now)
        self._shown = (0, 0, 0, 0, 0)  # what the metrics were last told: sent, acked, failed, transactions, aborts

    def show(self) -> None:
        """Bring the metrics up to the report (a few times a second at most, never per record)."""
        r = self.report
        now = (r.sent, r.acked + r.unconfirmed, r.failed, r.transactions, r.aborted_transactions)
        sent, acked, failed, txns, aborts = (a - b for a, b in zip(now, self._shown))
        self.metrics.produced(self.topic, sent=sent, acked=acked if self.confirms else 0, failed=failed)
        for _ in range(txns):
            self.metrics.transaction(self.topic, "committed")
        for _ in range(aborts):
            self.metrics.transaction(self.topic, "aborted")
        self._shown = now

    @property
    def needs_every_report(self) -> bool:
        return self.ledger is not None

    def settle(self, producer: KdgProducer, reports: DeliveryReports | None, sent: int) -> None:
        """Account for what ``producer`` settled: the ``reports`` that arrived or, without the ledger, the
        ``sent`` records (those sent since the last call) less the ones still waiting in the producer and the
        ones reported failed."""
        if reports is not None:
            self._record(reports.take())
            return
        failures = producer.take_failures()
        failed = sum(failures.values())
        self._count(sent - failed - len(producer), failed, failures)

    def _count(self, delivered: int, failed: int, errors: Counter) -> None:
        if self.confirms:
            self.report.acked += delivered
        else:
            self.report.unconfirmed += delivered
        self.report.failed += failed
        for name, n in errors.items():
            self.report.errors[name] = self.report.errors.get(name, 0) + n

    def _record(self, deliveries: list[tuple]) -> None:
        """Count ``deliveries`` and make their ledger rows: a run of delivered records whose keys the maker can
        rebuild (see :class:`kdg.records.Uuid7Maker`), at consecutive sequences and offsets of one partition,
        is one row (``seq_count`` of them); every other record is a row of its own, as is every failure.

        Reports that all succeeded, with keys of a form the ledger can rebuild, go per run
        (:meth:`_record_runs`); the others one at a time (:meth:`_record_each`)."""
        form = self.keys.form if self.keys is not None else None
        if form is not None and not any(map(_ERROR, deliveries)):
            self._record_runs(deliveries)  # the common case, per partition and per run (below)
        else:
            self._record_each(deliveries)
        if not self.held and (len(self.rows) >= LEDGER_BATCH or time.monotonic() >= self.due):
            self._write()

    def _record_runs(self, deliveries: list[tuple]) -> None:
        """:meth:`_record_each` for deliveries that all succeeded, whose keys the maker can rebuild, in C: grouped
        by partition, cut where a key's head changes, and each piece checked whole (consecutive sequences and
        offsets, every key its head and sequence). A piece that is not one run goes record by record."""
        self._count(len(deliveries), 0, Counter())
        by_partition = Counter(map(_PARTITION_OF, deliveries))
        ordered = deliveries if len(by_partition) == 1 else sorted(deliveries, key=_PARTITION_OF)  # stable
        start = 0
        for partition in sorted(by_partition):
            group = ordered[start:start + by_partition[partition]]
            start += len(group)
            seqs = list(map(_SEQ_OF, group))
            offsets = list(map(_OFFSET_OF, group)) if self.confirms else [None] * len(group)
            heads = list(map(_HEAD_OF, group))  # the producer's word for the keys its id maker made (Chunk.head)
            keys = None if None not in heads else list(map(_KEY_OF, group))  # else each key is checked
            if keys is not None:
                heads = list(map(self.keys.head_part, keys))
            at = 0
            while at < len(group):
                end = _run_end(heads, seqs, offsets, at)
                if not self._extend(partition, heads[at], group[at][0], seqs[at:end], offsets[at:end],
                                    None if keys is None else keys[at:end]):
                    self._record_each(group[at:], counted=True)  # not one run: record by record from here
                    break
                at = end

    def _extend(self, partition: int, head: str, first_key: str, seqs: list[int], offsets: list,
                keys: list[str] | None) -> bool:
        """Make the records of ``seqs`` (one head, in order; the first's key ``first_key``) part of ``partition``'s
        run, if they are one: False if not. ``keys``: theirs, each checked to be what ``head`` makes of its
        sequence; None when the producer's id maker made them of ``head`` (:attr:`Chunk.head`)."""
        n, seq = len(seqs), seqs[0]
        if (seqs != list(range(seq, seq + n)) or not self.keys.in_range(seq, seq + n - 1)
                or keys is not None and keys != self.keys.made_of(head, seq, n)):
            return False
        offset = offsets[0]
        if offsets != (list(range(offset, offset + n)) if offset is not None else [None] * n):
            return False
        after = None if offset is None else offset + n
        run = self.runs.get(partition)
        if run is not None and (run[0], run[5], run[6]) == (head, seq, offset):
            run[5], run[6] = seq + n, after
            return True
        if run is not None:
            self._close(run)
        self.runs[partition] = [head, seq, partition, offset, first_key, seq + n, after]
        return True

    def _record_each(self, deliveries: list[tuple], counted: bool = False) -> None:
        """:meth:`_record`, one delivery at a time (``counted``: the report counts them already). A record that
        extends its partition's run is checked inline: the next sequence, the next offset, and the key being the
        run's head followed by that sequence."""
        run_id, topic, confirms, rows, runs = self.run_id, self.topic, self.confirms, self.rows, self.runs
        status = "acked" if confirms else "sent"
        form = self.keys.form if self.keys is not None else None
        hex8, suffix = form == "x8", self.keys.suffix if form == "d" else ""
        errors: Counter = Counter()
        for key, seq, partition, offset, error, reason, _ in deliveries:
            if error is not None:
                errors[error] += 1
                rows.append((run_id, key, topic, seq, "failed", None, None, reason, None, None, None))
                continue
            if not confirms:
                offset = None
            run = runs.get(partition)  # [head, first seq, partition, first offset, first key, next seq, next offset]
            if run is not None:
                if (seq == run[5] and offset == run[6] and key.startswith(run[0])
                        and len(key) == len(run[0]) + len(tail := "%08x" % seq if hex8 else f"{seq}{suffix}")
                        and key.endswith(tail) and (not hex8 or seq <= 0xFFFF_FFFF)):
                    run[5] = seq + 1
                    if offset is not None:
                        run[6] = offset + 1
                    continue
                self._close(run)
            head = self.keys.head_of(key, seq) if form is not None else None
            if head is None:
                rows.append((run_id, key, topic, seq, status, partition, offset, None, None, None, None))
                runs.pop(partition, None)
            else:
                runs[partition] = [head, seq, partition, offset, key, seq + 1, None if offset is None else offset + 1]
        if not counted:
            failed = sum(errors.values())
            self._count(len(deliveries) - failed, failed, errors)

    def _close(self, run: list) -> None:
        """The ledger row of a run of records (one record: its key written whole)."""
        head, seq, partition, offset, key, after, _ = run
        n, status = after - seq, "acked" if self.confirms else "sent"
        if n == 1:
            self.rows.append((self.run_id, key, self.topic, seq, status, partition, offset, None, None, None, None))
        else:
            self.rows.append((self.run_id, head, self.topic, seq, status, partition, offset, None, n,
                              self.keys.form, self.keys.suffix))

    def _write(self) -> list[tuple]:
        """Hand the rows made so far to the ledger; they are returned."""
        self.due = time.monotonic() + LEDGER_FLUSH_S
        for run in self.runs.values():  # a run ends where a write does: each row is whole when written
            self._close(run)
        self.runs.clear()
        rows = self.rows
        if self.ledger is not None and rows:
            self.ledger.write(rows)
            self.rows = []
        return rows

    def write_now(self, reports: DeliveryReports) -> tuple[list[tuple], tuple]:
        """Count ``reports`` and write their ledger rows at once, in one COPY, waiting until it is done: the rows
        written, and the counts as they were before (:meth:`uncount`, should they not stand)."""
        r = self.report
        before = (r.acked, r.unconfirmed, r.failed, dict(r.errors))
        self._record(reports.take())
        rows = self._write()
        if self.ledger is not None:
            self.ledger.flush()
        return rows, before

    def uncount(self, rows: list[tuple], before: tuple, reason: str) -> None:
        """Undo :meth:`write_now`: its ``rows`` are failed with ``reason`` (written after those queued before),
        and the counts are ``before``'s again."""
        r = self.report
        r.acked, r.unconfirmed, r.failed, r.errors = before
        if self.ledger is not None and rows:
            run_id, topic = self.run_id, self.topic
            self.ledger.run(lambda store: store.void_ledger(run_id, topic, rows, reason))

    def close(self) -> None:
        """Hand the last rows to the ledger and wait until it has written them all."""
        if self.ledger is not None:
            self._write()
            self.ledger.close()


def _stamp(rec: Record, seq: int, make_id) -> tuple[str, int]:
    """Give ``rec`` an idempotency key and sequence unless it carries them (a replayed envelope).

    A ``kdg-seq`` that is not a number is left as it is and the record's position is used in the
    ledger: stopping half-way through an input would be worse.
    """
    if not rec.headers:  # most records: none of their own, so both headers are new
        key = make_id(seq)
        rec.headers = [(ID_HEADER, key.encode()), (SEQ_HEADER, b"%d" % seq)]
        return key, seq
    key = rec.idempotency_key
    if key is None:
        key = make_id(seq)
        rec.headers.append((ID_HEADER, key.encode()))
    raw_seq = rec.header(SEQ_HEADER)
    if raw_seq is None:
        rec.headers.append((SEQ_HEADER, b"%d" % seq))
    else:
        try:
            seq = int(raw_seq)
        except ValueError:
            pass
    return key, seq


@dataclass(slots=True)
class Chunk:
    """Records taken from the input together, as columns (what :meth:`KdgProducer.send_many` takes); ``records``
    when they came as :class:`Record` objects (a source may hand columns over directly: ``take(n)``)."""

    values: list
    keys: list
    headers: list
    partitions: list
    records: list[Record] | None = None
    ids: list[str] = field(default_factory=list)   # once stamped: each record's idempotency key ...
    seqs: list[int] = field(default_factory=list)  # ... and sequence
    head: str | None = None  # once stamped, when the id maker made every key of one head: that head

    @classmethod
    def of(cls, recs: list[Record]) -> "Chunk":
        return cls(list(map(_VALUE, recs)), list(map(_KEY, recs)), list(map(_HEADERS, recs)),
                   list(map(_PARTITION, recs)), recs)

    def __len__(self) -> int:
        return len(self.values)

    def stamp(self, first: int, make_id) -> None:
        """:func:`_stamp` each record (sequences ``first``, ``first + 1``, …). Records with no headers of their own
        (a synthetic load, plain lines) get both of kdg's made per chunk, in C."""
        n = len(self.values)
        if self.records is not None and (n == 1 or any(self.headers)):
            stamped = [_stamp(rec, seq, make_id) for seq, rec in enumerate(self.records, first)]
            self.ids, self.seqs = [key for key, _ in stamped], [seq for _, seq in stamped]
            self.headers = list(map(_HEADERS, self.records))
            return
        self.ids, seqs = make_id.many(first, n), range(first, first + n)
        self.seqs = list(seqs)
        if n and make_id.form is not None and make_id.in_range(first, first + n - 1):
            self.head = make_id.head_part(self.ids[0])
        made = zip(zip(repeat(ID_HEADER, n), map(str.encode, self.ids)),
                   zip(repeat(SEQ_HEADER, n), map(b"%d".__mod__, seqs)))
        self.headers = [[key, seq] for key, seq in made]

    def send(self, producer: KdgProducer, topic: str, reports: DeliveryReports | None) -> None:
        """Queue the (stamped) records in one :meth:`KdgProducer.send_many` (one record: :meth:`KdgProducer.send`),
        each with its delivery report's tracker when there are ``reports``."""
        callbacks = reports.trackers(self.ids, self.seqs, self.head) if reports is not None else None
        if len(self.values) == 1:
            producer.send(topic, self.values[0], self.keys[0], self.headers[0], self.partitions[0],
                          callbacks[0] if callbacks else None)
            return
        producer.send_many(topic, self.values, self.keys, self.headers, self.partitions, callbacks)


class _Input:
    """The input, a chunk at a time: columns from a source that makes them (``take(n)``), else records gathered."""

    def __init__(self, records, size: int):
        self.size = size
        self._take = getattr(records, "take", None) if size > 1 else None
        self._records = iter(records) if self._take is None else None

    def take(self, n: int | None = None) -> Chunk | None:
        """Up to ``n`` (at most the chunk size) more records; None once the input has ended."""
        n = self.size if n is None else min(n, self.size)
        if self._take is not None:
            columns = self._take(n)
            return Chunk(*columns) if columns is not None else None
        recs = []
        for rec in self._records:
            if rec is None:  # the input is idle (stdin): what came so far, even nothing, is handed over now
                return Chunk.of(recs)
            recs.append(rec)
            if len(recs) >= n:
                break
        return Chunk.of(recs) if recs else None


def _run_end(heads: list[str], seqs: list[int], offsets: list, at: int) -> int:
    """Where the run that starts at ``at`` seems to end: the first index whose head differs or whose sequence or
    offset is not ``at``'s plus its distance from it. Sequences and offsets rise within a partition and a head's
    keys are together, so that is found by bisection (:meth:`_Outcomes._extend` then checks the run whole).

    An offset may be None although the record was delivered (a retried batch the broker had already written:
    librdkafka reports it delivered, its offset unknown); a record whose offset is known and one whose is not
    are never in one run."""
    head, seq, offset = heads[at], seqs[at], offsets[at]

    def broken(i: int) -> bool:
        if heads[i] != head or seqs[i] - seq != i - at:
            return True
        if offset is None or offsets[i] is None:
            return offsets[i] is not offset
        return offsets[i] - offset != i - at

    return bisect_left(range(len(heads)), True, lo=at + 1, key=broken)


_VALUE, _KEY, _HEADERS, _PARTITION = (attrgetter(a) for a in ("value", "key", "headers", "partition"))
_KEY_OF, _SEQ_OF, _PARTITION_OF, _OFFSET_OF, _ERROR = (itemgetter(i) for i in range(5))  # of a delivery report
_HEAD_OF = itemgetter(6)


def run_produce(req: ProduceRequest) -> ProduceReport:
    policy = policy_for(req.guarantee)
    if req.ledger_retention is not None:
        parse_retention(req.ledger_retention, "--ledger-retention")  # malformed: refused before anything is sent
    run_id = uuid.uuid4()
    report = ProduceReport(guarantee=policy.guarantee.value, topic=req.topic, run_id=str(run_id))
    with Metrics("produce", policy.guarantee.value, req.metrics_port, req.metrics_host,
                 lambda: req.shutdown.requested) as metrics:
        if metrics.enabled:
            req.notice(f"metrics on http://{req.metrics_host}:{metrics.port}/metrics (and /healthz, /readyz)")
        metrics.started(req.topic)
        try:
            _produce(req, policy, run_id, report, metrics)
        except StopRequested:  # while waiting for Kafka or Postgres: nothing was sent
            report.interrupted, report.stopped_by = True, req.shutdown.signal or "stop requested"
    return report


def _produce(req: ProduceRequest, policy, run_id, report: ProduceReport, metrics: Metrics) -> None:
    txn_id = req.transactional_id or f"kdg-produce-{req.topic}"
    # vet the configuration first, then reach Kafka (ensure_topic answers "unreachable" in seconds), then
    # register the transactional.id, which would otherwise wait out its own timeouts on a dead cluster;
    # only the ledger needs each record's delivery report, else librdkafka reports failures only
    producer = KdgProducer(policy, req.conn.bootstrap_servers, req.conn.extra, transactional_id=txn_id, init=False,
                           every_report=req.ledger)
    metrics.not_ready = "waiting for Kafka"
    attempt = attempt_s(req.wait_timeout, req.shutdown)
    wait_until_up("Kafka", lambda: ensure_topic(req.conn.bootstrap_servers, req.topic, partitions=req.partitions,
                                                extra=req.conn.extra, timeout=attempt),
                  req.wait_timeout, req.shutdown, req.notice)
    _fit_batches(producer, req)
    producer.init()
    store = ledger = None
    if req.ledger:
        from kdg.store.ledger import LedgerWriter
        from kdg.store.pg import Store

        metrics.not_ready = "waiting for Postgres"
        store = wait_until_up("Postgres", lambda: Store(req.conn.pg_dsn), req.wait_timeout, req.shutdown, req.notice)
        try:
            if req.ledger_retention is not None:
                store.set_ledger_retention(req.ledger_retention)
            store.start_run(run_id, req.topic, policy.guarantee.value, txn_id if policy.transactional else None)
            if policy.transactional:  # this producer holds the transactional.id: runs that had it are dead
                settle_killed_runs(store, req.conn, req.topic, txn_id, run_id, req.notice)
        except BaseException:
            store.close()
            raise
        def waiting(reason: str | None) -> None:  # the ledger's Postgres went away (sending pauses), or is back
            metrics.not_ready = reason
            req.notice(reason or "producer ledger: Postgres is back; its rows are written again")

        ledger = LedgerWriter(store, shutdown=req.shutdown, waiting=waiting)  # COPYs on its own thread until closed
    make_id = id_maker(req.id_template)
    outcomes = _Outcomes(report, ledger, run_id, req.topic, confirms=policy.confirms_delivery, metrics=metrics,
                         keys=make_id)
    started = time.monotonic()
    metrics.not_ready = None
    failed = False
    try:
        try:
            if policy.transactional:
                _send_transactional(req, producer, outcomes, make_id, report)
            else:
                _send_plain(req, producer, outcomes, make_id, report)
        finally:
            metrics.stopping = True
            outcomes.close()  # the run lasts until its ledger is written
            outcomes.show()
    except BaseException:
        failed = True
        raise
    finally:
        report.duration_s = round(time.monotonic() - started, 3)
        report.msgs_per_s = round(report.sent / report.duration_s, 1) if report.duration_s else 0.0
        if store is not None:
            try:
                store.across_restart(lambda: store.finish_run(run_id, report.to_dict()), sleep=req.shutdown.sleep)
            except ConnectionFailed:
                if not failed:  # else the ledger's own error, already on its way, says more
                    raise
            finally:
                store.close()


def _fit_batches(producer: KdgProducer, req: ProduceRequest) -> None:
    """Batches within the topic's ``max.message.bytes`` (:meth:`KdgProducer.fit_batches`), so that a record too
    large refuses no neighbour with it. A user who may not describe the topic keeps librdkafka's batches."""
    try:
        limit = topic_config(req.conn.bootstrap_servers, req.topic, ("max.message.bytes",), req.conn.extra)
    except KdgError:
        return
    if limit.get("max.message.bytes", "").isdigit():
        producer.fit_batches(int(limit["max.message.bytes"]))


def _stopped(req: ProduceRequest, report: ProduceReport) -> None:
    report.interrupted, report.stopped_by = True, req.shutdown.signal or "stop requested"


def _send_plain(req, producer, outcomes, make_id, report) -> None:
    """Records go out as they come; each counts once its delivery is settled (see :class:`_Outcomes`).

    Stopped (a signal), it sends no more, and what was sent gets 30 s to be delivered before it is counted.
    """
    reports = DeliveryReports() if outcomes.needs_every_report else None
    topic, stop_requested = req.topic, req.shutdown.check
    remaining = settled = shown = 0
    try:
        source = _Input(req.records, req.chunk)
        while (chunk := source.take()) is not None:
            if stop_requested():
                _stopped(req, report)
                break
            if not chunk:  # the input is idle: deliveries are settled and the ledger kept current meanwhile
                producer.poll(0)
                if reports is not None and time.monotonic() >= outcomes.due:
                    outcomes.settle(producer, reports, report.sent)
                continue
            chunk.stamp(report.sent, make_id)
            try:
                chunk.send(producer, topic, reports)
            except KdgError as exc:  # a record refused: those before it were sent
                report.sent += getattr(exc, "queued", 0)
                raise
            report.sent += len(chunk)
            if report.sent - settled >= 100:
                settled = report.sent
                producer.poll(0)
                if reports is not None and (len(reports) >= LEDGER_BATCH or time.monotonic() >= outcomes.due):
                    outcomes.settle(producer, reports, report.sent)
                if report.sent - shown >= 1000:
                    shown = report.sent
                    outcomes.show()
                    if req.progress:
                        req.progress(report.sent)
        if stop_requested() and not report.interrupted:  # the input ended because of it (stdin at a terminal)
            _stopped(req, report)
        remaining = producer.flush(30 if report.interrupted else 120)
    except Exception:  # a bad line or a refused record mid-input: what was sent before it is delivered and
        producer.flush(30)  # settled first, so the ledger holds every record Kafka does
        raise
    finally:
        outcomes.settle(producer, reports, report.sent)
    if remaining and not report.interrupted:
        raise DeliveryError(f"{remaining} records were still undelivered after 120 s")
    if req.progress:
        req.progress(report.sent)


def _send_transactional(req, producer, outcomes, make_id, report) -> None:
    """Records go out as they come, inside a transaction committed every ``txn_size`` records or
    ``txn_interval_ms``, whichever comes first.

    A transaction Kafka makes us abort is re-sent whole; its records only count once it commits.
    Stopped (a signal, read between records, never inside a client call), the open transaction is
    aborted: none of its records counts, or ever reaches a read_committed reader.
    """
    txn = _Transaction(req, producer, outcomes, report)
    stop_requested, taken = req.shutdown.check, 0
    source = _Input(req.records, req.chunk)
    while not stop_requested():
        chunk = source.take(req.txn_size - txn.size)  # a chunk never spans two transactions
        if chunk is None:
            break
        if not chunk:  # the input is idle (stdin): the open transaction still commits within --txn-interval-ms
            if txn.size and time.monotonic() >= txn.deadline:
                txn.commit()
            continue
        chunk.stamp(taken, make_id)
        taken += len(chunk)
        txn.add(chunk)
        if txn.size >= req.txn_size or time.monotonic() >= txn.deadline:
            txn.commit()
    if stop_requested():  # between records, or the input ended because of it (stdin at a terminal)
        _stopped(req, report)
        if producer.in_transaction:
            # its records are delivered first: an abort racing the partitions' registration with the
            # coordinator can be refused as INVALID_TXN_STATE (librdkafka#4849), fatal for the producer
            try:
                producer.flush(req.shutdown.timeout / 2)
                producer.abort()
            except ProducerFatal as exc:  # (a fatal error met while its records were delivered, or aborting)
                producer.recover(exc)  # the new client's init_transactions aborts it
            report.open_transaction_aborted = True
        return
    if txn.size:
        txn.commit()


class _Transaction:
    """The open transaction: its records (kept to re-send after an abort) and their delivery reports."""

    def __init__(self, req, producer, outcomes, report):
        self.req, self.producer, self.outcomes, self.report = req, producer, outcomes, report
        outcomes.held = True  # a transaction's rows are written whole, before it commits (_write_ledger)
        self.written: tuple[list[tuple], tuple] | None = None  # its rows, and the counts before them
        self.chunks: list[Chunk] = []  # the records sent in it (stamped)
        self.size = 0
        self.reports = self._new_reports()
        self.deadline = 0.0
        self.renewals = 0  # in a row, since the last commit

    def _new_reports(self) -> DeliveryReports | None:
        return DeliveryReports() if self.outcomes.needs_every_report else None

    def add(self, chunk: Chunk) -> None:
        """Send ``chunk`` (stamped) in the open transaction, beginning one if none is."""
        if not self.size:
            self.producer.begin()
            self.deadline = time.monotonic() + self.req.txn_interval_ms / 1000
        self.chunks.append(chunk)
        self.size += len(chunk)
        try:
            chunk.send(self.producer, self.req.topic, self.reports)
        except ProducerFatal as exc:
            self._renew(exc)

    def commit(self) -> None:
        for attempt in range(MAX_TXN_RETRIES):
            try:
                self._write_ledger()
                self.producer.commit()
                break
            except TransactionAborted:
                try:
                    self.producer.abort()
                except ProducerFatal as exc:  # aborting anyway: nothing of it was committed
                    self._renew(exc, aborting=True)
                    continue
                self._again()
            except ProducerFatal as exc:
                self._renew(exc)
        else:
            raise DeliveryError(f"a transaction was aborted {MAX_TXN_RETRIES} times in a row; stopping")
        if self.reports is None:
            self.outcomes.settle(self.producer, None, self.size)
        self.written = None
        self.report.sent += self.size
        self.report.transactions += 1
        self.renewals = 0
        self.outcomes.show()
        self.chunks, self.size, self.reports = [], 0, self._new_reports()
        if self.req.progress:
            self.req.progress(self.report.sent)

    def _write_ledger(self) -> None:
        """With the ledger, the transaction's rows are written before it commits, its records delivered first (in
        the open transaction: each with its partition and offset): a producer killed once it committed leaves
        none of them out. Killed before, its next run finds the rows of a transaction that never committed
        (:func:`settle_killed_runs`)."""
        if self.reports is None:
            return
        while self.producer.flush(60):  # as the commit would wait: each record is delivered or fails in the end
            pass                        # (message.timeout.ms)
        self.written = self.outcomes.write_now(self.reports)

    def _again(self) -> None:
        """The open transaction was aborted: its records were purged and reported failed; send them again."""
        self.report.aborted_transactions += 1
        failures = self.producer.take_failures()
        if self.written is not None:  # its ledger rows, written before the commit that failed, and the
            rows, before = self.written  # failures their reports counted
            failures.update(Counter(self.report.errors) - Counter(before[3]))
            self.outcomes.uncount(rows, before, "its transaction was aborted")
            self.written = None
        if self.reports is not None:
            failures.update(name for name in map(_ERROR, self.reports.take()) if name is not None)
        if refusals := refusals_for_good(failures):  # sent again, they would be refused again: none committed
            raise refused(f"records to {self.req.topic} (in a transaction, aborted: none of it was committed)", refusals)
        self.reports = self._new_reports()
        self.producer.begin()
        for chunk in self.chunks:
            chunk.send(self.producer, self.req.topic, self.reports)

    def _renew(self, exc: ProducerFatal, aborting: bool = False) -> None:
        """The client died of a fatal error: if a new one can go on (:data:`kdg.kafka.producer.RENEWABLE`),
        it takes over the transactional.id, which aborts the open transaction, and its records go again.

        ``aborting``: it died while aborting a transaction Kafka had failed, so none of it was committed; a fence
        then goes on too. librdkafka meets one after requests timed out: the abort bumps the epoch (KIP-360), and
        its own retried bump can be answered as a fence (seen with 40 produce responses held back). A producer
        really fenced by another one with the same transactional.id still stops after
        ``MAX_TXN_RETRIES`` renewals without a commit."""
        if self.renewals >= MAX_TXN_RETRIES:
            raise exc
        self.producer.recover(exc, fenced_too=aborting)
        self.renewals += 1
        self.report.producer_renewals += 1
        self.req.notice(f"{exc}; a new producer took over the transactional.id (aborting the open transaction) "
                        f"and sends its {self.size} records again")
        self._again()
