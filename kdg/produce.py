"""`kdg produce`: send records under a guarantee, stamp each with an idempotency key, keep a ledger."""

import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable

from kdg.errors import DeliveryError, ProducerFatal, TransactionAborted
from kdg.guarantees import policy_for
from kdg.kafka.admin import ensure_topic
from kdg.kafka.producer import DeliveryReports, KdgProducer
from kdg.lifecycle import DEFAULT_WAIT_TIMEOUT_S, Shutdown, StopRequested, wait_until_up
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

        Per record this runs once, so a record that extends its partition's run is checked inline: the next
        sequence, the next offset, and the key being the run's head followed by that sequence."""
        run_id, topic, confirms, rows, runs = self.run_id, self.topic, self.confirms, self.rows, self.runs
        status = "acked" if confirms else "sent"
        form = self.keys.form if self.keys is not None else None
        hex8, suffix = form == "x8", self.keys.suffix if form == "d" else ""
        errors: Counter = Counter()
        for key, seq, partition, offset, error, reason in deliveries:
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
        failed = sum(errors.values())
        self._count(len(deliveries) - failed, failed, errors)
        if len(rows) >= LEDGER_BATCH or time.monotonic() >= self.due:
            self._write()

    def _close(self, run: list) -> None:
        """The ledger row of a run of records (one record: its key written whole)."""
        head, seq, partition, offset, key, after, _ = run
        n, status = after - seq, "acked" if self.confirms else "sent"
        if n == 1:
            self.rows.append((self.run_id, key, self.topic, seq, status, partition, offset, None, None, None, None))
        else:
            self.rows.append((self.run_id, head, self.topic, seq, status, partition, offset, None, n,
                              self.keys.form, self.keys.suffix))

    def _write(self) -> None:
        self.due = time.monotonic() + LEDGER_FLUSH_S
        for run in self.runs.values():  # a run ends where a write does: each row is whole when written
            self._close(run)
        self.runs.clear()
        if self.ledger is not None and self.rows:
            self.ledger.write(self.rows)
            self.rows = []

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


def run_produce(req: ProduceRequest) -> ProduceReport:
    policy = policy_for(req.guarantee)
    if req.ledger_retention is not None:
        parse_retention(req.ledger_retention, "--ledger-retention")  # malformed: refused before anything is sent
    run_id = uuid.uuid4()
    report = ProduceReport(guarantee=policy.guarantee.value, topic=req.topic, run_id=str(run_id))
    with Metrics("produce", policy.guarantee.value, req.metrics_port, req.metrics_host) as metrics:
        if metrics.enabled:
            req.notice(f"metrics on http://{req.metrics_host}:{metrics.port}/metrics (and /healthz, /readyz)")
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
    wait_until_up("Kafka", lambda: ensure_topic(req.conn.bootstrap_servers, req.topic, partitions=req.partitions,
                                                extra=req.conn.extra), req.wait_timeout, req.shutdown, req.notice)
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
            store.start_run(run_id, req.topic, policy.guarantee.value)
        except BaseException:
            store.close()
            raise
        ledger = LedgerWriter(store)  # COPYs on its own thread until closed
    make_id = id_maker(req.id_template)
    outcomes = _Outcomes(report, ledger, run_id, req.topic, confirms=policy.confirms_delivery, metrics=metrics,
                         keys=make_id)
    started = time.monotonic()
    metrics.not_ready = None
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
    finally:
        report.duration_s = round(time.monotonic() - started, 3)
        report.msgs_per_s = round(report.sent / report.duration_s, 1) if report.duration_s else 0.0
        if store is not None:
            try:
                store.across_restart(lambda: store.finish_run(run_id, report.to_dict()))
            finally:
                store.close()


def _stopped(req: ProduceRequest, report: ProduceReport) -> None:
    report.interrupted, report.stopped_by = True, req.shutdown.signal or "stop requested"


def _send_plain(req, producer, outcomes, make_id, report) -> None:
    """Records go out as they come; each counts once its delivery is settled (see :class:`_Outcomes`).

    Stopped (a signal), it sends no more, and what was sent gets 30 s to be delivered before it is counted.
    """
    reports = DeliveryReports() if outcomes.needs_every_report else None
    track = reports.tracker if reports is not None else None
    send, topic, stop_requested = producer.send, req.topic, req.shutdown.check
    remaining = 0
    try:
        for seq, rec in enumerate(req.records):
            if stop_requested():
                _stopped(req, report)
                break
            key, seq = _stamp(rec, seq, make_id)
            send(topic, rec.value, rec.key, rec.headers, rec.partition, track(key, seq) if track else None)
            report.sent += 1
            if report.sent % 100 == 0:
                producer.poll(0)
                if reports is not None and (report.sent % LEDGER_BATCH == 0 or time.monotonic() >= outcomes.due):
                    outcomes.settle(producer, reports, report.sent)
                if report.sent % 1000 == 0:
                    outcomes.show()
                    if req.progress:
                        req.progress(report.sent)
        if stop_requested() and not report.interrupted:  # the input ended because of it (stdin at a terminal)
            _stopped(req, report)
        remaining = producer.flush(30 if report.interrupted else 120)
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
    stop_requested = req.shutdown.check
    for seq, rec in enumerate(req.records):
        if stop_requested():
            break
        key, seq = _stamp(rec, seq, make_id)
        txn.add(rec, key, seq)
        if len(txn.records) >= req.txn_size or time.monotonic() >= txn.deadline:
            txn.commit()
    if stop_requested():  # between records, or the input ended because of it (stdin at a terminal)
        _stopped(req, report)
        if producer.in_transaction:
            # its records are delivered first: an abort racing the partitions' registration with the
            # coordinator can be refused as INVALID_TXN_STATE (librdkafka#4849), fatal for the producer
            producer.flush(req.shutdown.timeout / 2)
            try:
                producer.abort()
            except ProducerFatal as exc:
                producer.recover(exc)  # the new client's init_transactions aborts it
            report.open_transaction_aborted = True
        return
    if txn.records:
        txn.commit()


class _Transaction:
    """The open transaction: its records (kept to re-send after an abort) and their delivery reports."""

    def __init__(self, req, producer, outcomes, report):
        self.req, self.producer, self.outcomes, self.report = req, producer, outcomes, report
        self.records: list[tuple[Record, str, int]] = []
        self.reports = self._new_reports()
        self.deadline = 0.0
        self.renewals = 0  # in a row, since the last commit

    def _new_reports(self) -> DeliveryReports | None:
        return DeliveryReports() if self.outcomes.needs_every_report else None

    def add(self, rec: Record, key: str, seq: int) -> None:
        if not self.records:
            self.producer.begin()
            self.deadline = time.monotonic() + self.req.txn_interval_ms / 1000
        self.records.append((rec, key, seq))
        try:
            self._send(rec, key, seq)
        except ProducerFatal as exc:
            self._renew(exc)

    def _send(self, rec: Record, key: str, seq: int) -> None:
        cb = self.reports.tracker(key, seq) if self.reports is not None else None
        self.producer.send(self.req.topic, rec.value, rec.key, rec.headers, rec.partition, cb)

    def commit(self) -> None:
        for attempt in range(MAX_TXN_RETRIES):
            try:
                self.producer.commit()
                break
            except TransactionAborted:
                self.producer.abort()
                self._again()
            except ProducerFatal as exc:
                self._renew(exc)
        else:
            raise DeliveryError(f"a transaction was aborted {MAX_TXN_RETRIES} times in a row; stopping")
        self.outcomes.settle(self.producer, self.reports, len(self.records))
        self.report.sent += len(self.records)
        self.report.transactions += 1
        self.renewals = 0
        self.outcomes.show()
        self.records, self.reports = [], self._new_reports()
        if self.req.progress:
            self.req.progress(self.report.sent)

    def _again(self) -> None:
        """The open transaction was aborted: its records were purged and reported failed; send them again."""
        self.report.aborted_transactions += 1
        self.producer.take_failures()
        self.reports = self._new_reports()
        self.producer.begin()
        for rec, key, seq in self.records:
            self._send(rec, key, seq)

    def _renew(self, exc: ProducerFatal) -> None:
        """The client died of a fatal error: if a new one can go on (:data:`kdg.kafka.producer.RENEWABLE`),
        it takes over the transactional.id, which aborts the open transaction, and its records go again."""
        if self.renewals >= MAX_TXN_RETRIES:
            raise exc
        self.producer.recover(exc)
        self.renewals += 1
        self.report.producer_renewals += 1
        self.req.notice(f"{exc}; a new producer took over the transactional.id (aborting the open transaction) "
                        f"and sends its {len(self.records)} records again")
        self._again()
