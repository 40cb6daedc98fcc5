"""`kdg produce`: send records under a guarantee, stamp each with an idempotency key, keep a ledger."""

import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable

from kdg.errors import DeliveryError, TransactionAborted
from kdg.guarantees import policy_for
from kdg.kafka.admin import ensure_topic
from kdg.kafka.producer import KdgProducer
from kdg.records import ID_HEADER, SEQ_HEADER, Record, id_maker
from kdg.settings import Connection

LEDGER_BATCH = 20_000
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
    duration_s: float = 0.0
    msgs_per_s: float = 0.0
    interrupted: bool = False
    errors: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


class _Ledger:
    """Collects delivery outcomes and COPYs them to Postgres in batches (or only counts them)."""

    def __init__(self, report: ProduceReport, store, run_id, topic: str, acks_expected: bool):
        self.report, self.store, self.run_id, self.topic = report, store, run_id, topic
        self.acks_expected = acks_expected
        self.rows: list[tuple] = []

    def outcome(self, key: str, seq: int, err, msg) -> None:
        if err is not None:
            self.report.failed += 1
            self.report.errors[err.name()] = self.report.errors.get(err.name(), 0) + 1
            row = (self.run_id, key, self.topic, seq, "failed", None, None, err.str())
        elif not self.acks_expected:
            self.report.unconfirmed += 1
            row = (self.run_id, key, self.topic, seq, "sent", msg.partition(), None, None)
        else:
            self.report.acked += 1
            row = (self.run_id, key, self.topic, seq, "acked", msg.partition(), msg.offset(), None)
        if self.store is not None:
            self.rows.append(row)
            if len(self.rows) >= LEDGER_BATCH:
                self.write()

    def write(self) -> None:
        if self.store is not None and self.rows:
            self.store.copy_ledger(self.rows)
            self.rows = []


def _stamp(rec: Record, seq: int, make_id) -> tuple[str, int]:
    """Give ``rec`` an idempotency key and sequence unless it carries them (a replayed envelope).

    A ``kdg-seq`` that is not a number is left as it is and the record's position is used in the
    ledger: stopping half-way through an input would be worse.
    """
    key = rec.idempotency_key
    if key is None:
        key = make_id(seq)
        rec.headers.append((ID_HEADER, key.encode()))
    raw_seq = rec.header(SEQ_HEADER)
    if raw_seq is None:
        rec.headers.append((SEQ_HEADER, str(seq).encode()))
    else:
        try:
            seq = int(raw_seq)
        except ValueError:
            pass
    return key, seq


def run_produce(req: ProduceRequest) -> ProduceReport:
    policy = policy_for(req.guarantee)
    run_id = uuid.uuid4()
    report = ProduceReport(guarantee=policy.guarantee.value, topic=req.topic, run_id=str(run_id))
    txn_id = req.transactional_id or f"kdg-produce-{req.topic}"
    # vet the configuration first, then reach Kafka (ensure_topic answers "unreachable" in seconds), then
    # register the transactional.id, which would otherwise wait out its own timeouts on a dead cluster
    producer = KdgProducer(policy, req.conn.bootstrap_servers, req.conn.extra, transactional_id=txn_id, init=False)
    ensure_topic(req.conn.bootstrap_servers, req.topic, partitions=req.partitions, extra=req.conn.extra)
    producer.init()
    store = None
    if req.ledger:
        from kdg.store.pg import Store

        store = Store(req.conn.pg_dsn)
        store.start_run(run_id, req.topic, policy.guarantee.value)
    ledger = _Ledger(report, store, run_id, req.topic, acks_expected=policy.confirms_delivery)
    make_id = id_maker(req.id_template)
    started = time.monotonic()
    try:
        if policy.transactional:
            _send_transactional(req, producer, ledger, make_id, report)
        else:
            _send_plain(req, producer, ledger, make_id, report)
    except KeyboardInterrupt:
        report.interrupted = True
        if producer.in_transaction:
            producer.abort()
        else:
            producer.flush(30)
    finally:
        report.duration_s = round(time.monotonic() - started, 3)
        report.msgs_per_s = round(report.sent / report.duration_s, 1) if report.duration_s else 0.0
        ledger.write()
        if store is not None:
            store.finish_run(run_id, report.to_dict())
            store.close()
    return report


def _send_plain(req, producer, ledger, make_id, report) -> None:
    track = ledger.store is not None
    count_only = lambda err, msg: ledger.outcome("", 0, err, msg)  # noqa: E731  (one callback, no ledger rows)
    for seq, rec in enumerate(req.records):
        key, seq = _stamp(rec, seq, make_id)
        cb = (lambda err, msg, k=key, s=seq: ledger.outcome(k, s, err, msg)) if track else count_only
        producer.send(req.topic, rec.value, rec.key, rec.headers, rec.partition, on_delivery=cb)
        report.sent += 1
        if report.sent % 1000 == 0:
            producer.poll(0)
            if req.progress:
                req.progress(report.sent)
    remaining = producer.flush(120)
    if remaining:
        raise DeliveryError(f"{remaining} records were still undelivered after 120 s")
    if req.progress:
        req.progress(report.sent)


def _send_transactional(req, producer, ledger, make_id, report) -> None:
    """Records go out as they come, inside a transaction committed every ``txn_size`` records or
    ``txn_interval_ms``, whichever comes first.

    A transaction Kafka makes us abort is re-sent whole; delivery reports only count once it commits.
    """
    txn = _Transaction(req, producer, ledger, report)
    for seq, rec in enumerate(req.records):
        key, seq = _stamp(rec, seq, make_id)
        txn.add(rec, key, seq)
        if len(txn.records) >= req.txn_size or time.monotonic() >= txn.deadline:
            txn.commit()
    if txn.records:
        txn.commit()


class _Transaction:
    """The open transaction: its records (kept to re-send after an abort) and their delivery reports."""

    def __init__(self, req, producer, ledger, report):
        self.req, self.producer, self.ledger, self.report = req, producer, ledger, report
        self.track = ledger.store is not None
        self.records: list[tuple[Record, str, int]] = []
        self.outcomes: list[tuple] = []
        self.deadline = 0.0
        self._count_only = lambda err, msg: self.outcomes.append(("", 0, err, msg))

    def add(self, rec: Record, key: str, seq: int) -> None:
        if not self.records:
            self.producer.begin()
            self.deadline = time.monotonic() + self.req.txn_interval_ms / 1000
        self.records.append((rec, key, seq))
        self._send(rec, key, seq)

    def _send(self, rec: Record, key: str, seq: int) -> None:
        outcomes = self.outcomes
        cb = (lambda err, msg, k=key, s=seq: outcomes.append((k, s, err, msg))) if self.track else self._count_only
        self.producer.send(self.req.topic, rec.value, rec.key, rec.headers, rec.partition, on_delivery=cb)

    def commit(self) -> None:
        for attempt in range(MAX_TXN_RETRIES):
            try:
                self.producer.commit()
                break
            except TransactionAborted:
                self.producer.abort()
                self.report.aborted_transactions += 1
                self.outcomes.clear()
                self.producer.begin()
                for rec, key, seq in self.records:
                    self._send(rec, key, seq)
        else:
            raise DeliveryError(f"a transaction was aborted {MAX_TXN_RETRIES} times in a row; stopping")
        for outcome in self.outcomes:
            self.ledger.outcome(*outcome)
        self.report.sent += len(self.records)
        self.report.transactions += 1
        self.records, self.outcomes = [], []
        if self.req.progress:
            self.req.progress(self.report.sent)
