"""The one module that owns confluent-kafka's Producer: config from the policy, sends, delivery reports,
transactions, errors."""

import math
import threading
import time
from collections import Counter, deque
from functools import partial
from itertools import repeat, starmap
from operator import length_hint

from confluent_kafka import KafkaError, KafkaException

from kdg.errors import DeliveryError, KdgError, ProducerFatal, TransactionAborted, UsageError
from kdg.guarantees import DeliveryPolicy
from kdg.kafka.access import FatalWatch, check
from kdg.kafka.clients import Role, client_config, new_producer, weakly


def producer_config(policy: DeliveryPolicy, bootstrap: str, extra: dict, transactional_id: str | None,
                    role: Role = Role.PRODUCER) -> dict:
    config = client_config(role, bootstrap, extra, policy)
    if policy.transactional and role is Role.PRODUCER:
        if not transactional_id:
            raise UsageError("a transactional producer needs a transactional.id")
        config["transactional.id"] = transactional_id
        # librdkafka requires delivery.timeout.ms <= transaction.timeout.ms; a longer delivery
        # timeout asked for with -X stretches the transaction timeout to match
        delivery = max(_ms(config, k) for k in ("delivery.timeout.ms", "message.timeout.ms", "linger.ms"))
        config.setdefault("transaction.timeout.ms", max(30_000, delivery))
    return config


def _ms(config: dict, key: str) -> int:
    """A time setting in ms as librdkafka takes it (``linger.ms`` may be fractional, ``0.5``); a value that is
    not a number is left for librdkafka to refuse, naming the property (kdg.kafka.clients)."""
    try:
        return math.ceil(float(config.get(key, 0)))
    except (TypeError, ValueError, OverflowError):
        return 0


_ANY_PARTITION = -1  # RD_KAFKA_PARTITION_UA: librdkafka's partitioner chooses
LIBRDKAFKA_BATCH_SIZE = 1_000_000  # librdkafka's default batch.size

# Fatal errors that a new client with the same transactional.id recovers from: the idempotent producer's
# sequence bookkeeping gave up (timed-out requests whose fate it could not settle; a broker that forgot the
# producer), not another producer taking the id over. They come from produce requests, which librdkafka
# settles before it sends EndTxn, so the open transaction was never committed: the new client's
# init_transactions aborts it, and its records can be sent again.
RENEWABLE = frozenset({KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.UNKNOWN_PRODUCER_ID,
                       KafkaError.DUPLICATE_SEQUENCE_NUMBER})
HUNG_AFTER_S = 30.0  # a guarded call that has not returned this long past its own timeout is stuck
MAX_STUCK = 3        # stuck clients kept before the process gives up (exit 6; an orchestrator restarts it)
_FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})


class DeliveryReports:
    """The delivery report of every record sent with one of :meth:`trackers`, collected as plain tuples.

    confluent-kafka hands a delivery report no headers, so a record's report is known by its
    callback alone: each record gets a ``functools.partial`` (made in C, cheaper than a closure)
    of one function that reduces the report to a tuple, and :meth:`take` hands them over in bulk.
    """

    def __init__(self) -> None:
        self._arrived: list[tuple] = []
        self._append = self._arrived.append  # the one list every callback appends to, for good

    def trackers(self, keys: list[str], seqs: list[int], head: str | None = None) -> list[partial]:
        """The ``on_delivery`` callback of each record ``(key, seq)``, made in C. ``head``: every key is what the
        producer's id maker made of that head and its sequence (so the ledger need not check it), else None."""
        n = len(keys)
        return list(map(partial, repeat(_arrive, n), repeat(self._append, n), keys, seqs, repeat(head, n)))

    def __len__(self) -> int:
        """Reports arrived and not taken yet."""
        return len(self._arrived)

    def take(self) -> list[tuple[str, int, int | None, int | None, str | None, str | None, str | None]]:
        """``(key, seq, partition, offset, error name, error text, head)`` of each report that arrived since the
        last call. A delivered record has no error; a failed one no partition or offset."""
        taken = self._arrived[:]
        self._arrived.clear()
        return taken


def _arrive(append, key: str, seq: int, head: str | None, err: KafkaError | None, msg) -> None:
    if err is None:
        append((key, seq, msg.partition(), msg.offset(), None, None, head))
    else:
        append((key, seq, None, None, err.name(), err.str(), head))


def raised_error(exc: BaseException) -> KafkaError | None:
    """The KafkaError a client call raised: a KafkaException's, or the one behind the SystemError confluent-kafka
    raises when a callback is served after one of its own raised (the exception it raised is the cause)."""
    if isinstance(exc, SystemError):
        exc = exc.__cause__
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


# Errors a broker answers a record with that it would answer again, however often the record is sent
REFUSED_FOR_GOOD = frozenset({"MSG_SIZE_TOO_LARGE", "_MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "INVALID_RECORD",
                              "INVALID_TIMESTAMP", "TOPIC_AUTHORIZATION_FAILED"})


def refusals_for_good(failures: Counter[str]) -> Counter[str]:
    """Of ``failures`` (by error name), those a record would meet again if sent again (:data:`REFUSED_FOR_GOOD`);
    not the records an abort purged, nor what a broker outage failed."""
    return Counter({name: n for name, n in failures.items() if name in REFUSED_FOR_GOOD})


def refused(what: str, failures: Counter[str]) -> DeliveryError:
    """The error for records Kafka refused: ``what`` names them, ``failures`` counts them by error name."""
    reasons = ", ".join(f"{n} {name}" for name, n in failures.most_common())
    return DeliveryError(f"{what} were refused by Kafka: {reasons}")


class KdgProducer:
    """A producer bound to one delivery policy.

    Refuses transaction calls when the policy is not transactional; retries ``BufferError``
    after serving delivery reports; turns ``KafkaError`` into kdg errors.

    Delivery reports: with ``every_report`` (the default) each record's ``on_delivery`` callback
    hears its outcome. Without it librdkafka reports failures only (``delivery.report.only.error``),
    to a counter of the producer's own (:meth:`take_failures`), and no Python runs for a record that
    is delivered: once :meth:`flush` returns with nothing left, every record sent and not counted
    failed was delivered.
    """

    def __init__(self, policy: DeliveryPolicy, bootstrap: str, extra: dict | None = None,
                 transactional_id: str | None = None, role: Role = Role.PRODUCER, init: bool = True,
                 every_report: bool = True):
        """``init=False`` builds (and so vets) the producer but leaves ``init_transactions`` to :meth:`init`."""
        self.policy = policy
        self.transactional = policy.transactional and role is Role.PRODUCER
        self.config = producer_config(policy, bootstrap, extra or {}, transactional_id, role)
        self._failures: Counter[str] = Counter()
        self._errors = FatalWatch()  # error_cb: the fatal error behind a later _FATAL
        self._stuck: list = []  # clients left with a thread inside a call that never returned (kept alive)
        self.hung_after_s = HUNG_AFTER_S
        # the client's callbacks hold this object weakly: dropped, it and its client go at once (weakly)
        reports = {} if every_report else {"delivery.report.only.error": True,
                                           "on_delivery": weakly(self._count_failure)}
        self._role, self._client_config = role, {**self.config, **reports, "error_cb": self._errors}
        self._producer = new_producer(self._client_config, role)
        self.in_transaction = False
        if init:
            self.init()

    def fit_batches(self, max_bytes: int) -> None:
        """Build batches of at most ``max_bytes`` (the topic's ``max.message.bytes``), before anything is sent.

        A broker refuses a batch over its topic's limit whole (MSG_SIZE_TOO_LARGE for every record in it), and
        librdkafka never splits one: one record too large, or small records many enough, and each of them
        would be reported refused. librdkafka closes a batch before the record that would take it past
        ``batch.size`` (a record over it goes alone), so with this only a record too large itself is refused.
        A smaller ``batch.size`` of the user's is kept."""
        try:
            if int(self._client_config.get("batch.size", LIBRDKAFKA_BATCH_SIZE)) <= max_bytes:
                return
        except (TypeError, ValueError):  # not a number: librdkafka refused it when the client was made
            return
        self.config["batch.size"] = self._client_config["batch.size"] = max_bytes
        self._producer = new_producer(self._client_config, self._role)

    def init(self) -> None:
        """Register the transactional.id with its coordinator, fencing any older producer that had it."""
        if self.transactional:
            self._call("init_transactions", timeout=60)

    def _fatal_error(self, doing: str, err: KafkaError) -> ProducerFatal:
        """``err`` (fatal) as kdg's error; a bare _FATAL (what a call answers once the client is dead) is
        replaced by the error that killed it, as error_cb heard it."""
        if err.code() == KafkaError._FATAL and self._errors.heard is None:
            try:
                self._producer.poll(0)  # serve the fatal event: error_cb (or confluent-kafka, raising it) names it
            except (KafkaException, SystemError) as exc:
                found = raised_error(exc)
                if found is not None and found.fatal():
                    self._errors.heard = found
        cause = self._errors.cause(err)
        fenced = cause.code() in _FENCED
        hint = " (another producer took this transactional.id over)" if fenced else ""
        return ProducerFatal(f"{doing}: fatal Kafka error {cause.name()}: {cause.str()}{hint}",
                             renewable=self.transactional and cause.code() in RENEWABLE, fenced=fenced)

    def recover(self, exc: ProducerFatal, *, fenced_too: bool = False) -> None:
        """Go on after ``exc`` with a new client (:meth:`renew`) if its transaction is known never to have
        committed: a renewable error, or (``fenced_too``, the caller's judgement) a fence; else raise ``exc``."""
        if not (exc.renewable or (fenced_too and exc.fenced)):
            raise exc
        self.renew()

    def renew(self) -> None:
        """Replace a client that died of a :data:`RENEWABLE` error by a new one with the same
        transactional.id: its init_transactions bumps the epoch and aborts the transaction the old one
        left open. The old client's records are purged unsent (their reports are never served)."""
        old, self._errors.heard, self.in_transaction = self._producer, None, False
        if self._stuck and self._stuck[-1] is old:
            if len(self._stuck) > MAX_STUCK:
                raise DeliveryError(f"{len(self._stuck)} producer clients stuck inside librdkafka: stopping")
        else:
            try:
                old.purge()
            except KafkaException:
                pass
            del old  # destroyed here: nothing is left in it to deliver
        self._producer = new_producer(self._client_config, self._role)
        self.init()

    def send(self, topic: str, value, key=None, headers=None, partition: int | None = None, on_delivery=None) -> None:
        """Queue one record; ``on_delivery(err, msg)`` hears its outcome from :meth:`poll` or :meth:`flush`."""
        produce = self._producer.produce
        if partition is None:
            partition = _ANY_PARTITION
        while True:
            try:
                # positional, in confluent-kafka's order: topic, value, key, partition, callback, its alias
                # on_delivery, timestamp (0: now), headers — a keyword call builds a dict per record
                produce(topic, value, key, partition, on_delivery, None, 0, headers)
                return
            except BufferError:
                self.poll(0.05)  # queue full: serve delivery reports, then try again
            except KafkaException as exc:
                raise self._refused(topic, exc) from exc

    def send_many(self, topic: str, values: list, keys: list, headers: list, partitions: list,
                  on_delivery: list | None = None) -> None:
        """Queue records given as columns (a partition of None: the partitioner's choice), as :meth:`send`
        would one by one, but with no Python per record: confluent-kafka's ``produce`` is called from C
        (``starmap``). A full queue stops it at a record, which goes again once delivery reports are served.
        A record refused raises what :meth:`send` would, its ``queued`` the number of records before it."""
        parts = [_ANY_PARTITION if p is None else p for p in partitions] if None in partitions else partitions
        n = len(values)
        args = list(zip(repeat(topic, n), values, keys, parts, on_delivery or repeat(None, n), repeat(None, n),
                        repeat(0, n), headers))
        pending = iter(args)
        try:
            while True:
                try:
                    deque(starmap(self._producer.produce, pending), maxlen=0)
                    return
                except BufferError:
                    stopped_at = args[n - length_hint(pending) - 1]
                except KafkaException as exc:
                    raise self._refused(topic, exc) from exc
                self.poll(0.05)  # queue full: serve delivery reports, then that record again
                t, value, key, partition, callback, _, _, hdrs = stopped_at
                self.send(t, value, key, hdrs, partition, callback)
        except KdgError as exc:
            exc.queued = n - length_hint(pending) - 1
            raise

    def _refused(self, topic: str, exc: KafkaException) -> Exception:
        """kdg's error for a record ``produce`` refused."""
        check(exc.args[0], f"producing to {topic!r}")
        if exc.args[0].fatal() or exc.args[0].code() == KafkaError._FATAL:
            return self._fatal_error(f"produce to {topic}", exc.args[0])
        return DeliveryError(f"produce to {topic} failed: {exc.args[0].str()}")

    def poll(self, timeout: float = 0) -> int:
        return self._serving("poll", timeout)

    def _count_failure(self, err: KafkaError, msg) -> None:
        self._failures[err.name()] += 1

    def take_failures(self) -> Counter[str]:
        """Failed deliveries reported (without ``every_report``) since the last call, by error name."""
        taken, self._failures = self._failures, Counter()
        return taken

    def flush(self, timeout: float = 120) -> int:
        return self._serving("flush", timeout)

    def _serving(self, name: str, timeout: float) -> int:
        """``poll`` or ``flush``, which serve the client's callbacks. A fatal error comes out of them as
        :class:`ProducerFatal`: confluent-kafka raises librdkafka's fatal event itself (it never reaches
        ``error_cb``), and when a delivery report is served after it, as a SystemError that the
        KafkaException caused (``_arrive returned a result with an exception set``). kdg's own error raised in
        ``error_cb`` (a refused login) comes out as itself."""
        try:
            return getattr(self._producer, name)(timeout)
        except (KafkaException, SystemError) as exc:
            if isinstance(exc, SystemError) and isinstance(exc.__cause__, KdgError):
                raise exc.__cause__ from None
            err = raised_error(exc)
            if err is None or not (err.fatal() or err.code() == KafkaError._FATAL):
                raise
            raise self._fatal_error(name, err) from exc

    def deliver(self, what: str, timeout: float = 120) -> None:
        """Flush, then raise :class:`DeliveryError` unless every record sent so far was delivered: none
        refused since the last :meth:`take_failures` (so only without ``every_report``), none still waiting
        after ``timeout`` seconds. ``what`` names the records, e.g. ``"dead letters to orders.dlq"``."""
        remaining = self.flush(timeout)
        failures = self.take_failures()
        if failures:
            raise refused(what, failures)
        if remaining:
            raise DeliveryError(f"{what} were not acknowledged: {remaining} still waiting after {timeout:.0f} s")

    def __len__(self) -> int:
        return len(self._producer)

    # -- transactions ------------------------------------------------------------------------
    def _require_transactional(self) -> None:
        if not self.transactional:
            raise DeliveryError(f"transactions are not part of the {self.policy.guarantee.value} policy")

    def begin(self) -> None:
        self._require_transactional()
        self._call("begin_transaction")
        self.in_transaction = True

    def send_offsets(self, offsets, group_metadata) -> None:
        """The consumer's offsets into the transaction. librdkafka can wait here for ever, its timeout
        ignored, when the group coordinator's broker went away (librdkafka#5456, #5511; after a soak's broker
        kill a consumer stayed stuck for minutes), so each attempt is watched (:meth:`_guarded`)."""
        self._require_transactional()
        self._call("send_offsets_to_transaction", offsets, group_metadata, timeout=30, guarded=True)

    def commit(self) -> None:
        self._require_transactional()
        self._call("commit_transaction", timeout=60)
        self.in_transaction = False

    def abort(self) -> None:
        self._require_transactional()
        if self.in_transaction:
            self._call("abort_transaction", timeout=60)
            self.in_transaction = False

    def _guarded(self, name: str, args: tuple):
        """One call of a transactional API on a thread of its own; one that has not returned
        :attr:`hung_after_s` seconds past its own timeout is given up as a renewable fatal error. The stuck
        client is kept (never destroyed under the thread inside it); :meth:`renew`'s new one fences it."""
        answer: list = []

        def call() -> None:
            try:
                answer.append((True, getattr(self._producer, name)(*args)))
            except BaseException as exc:  # handed to the caller's thread
                answer.append((False, exc))

        worker = threading.Thread(target=call, name=f"kdg-{name}", daemon=True)
        worker.start()
        worker.join(args[-1] + self.hung_after_s)
        if not answer:
            self._stuck.append(self._producer)
            raise ProducerFatal(f"{name} did not return {self.hung_after_s:g} s past its {args[-1]:g} s timeout "
                                "(librdkafka#5456: the group coordinator went away)", renewable=True, hung=True)
        ok, value = answer[0]
        if not ok:
            raise value
        return value

    def _call(self, name: str, *args, timeout: float | None = None, give_up_after: float = 300,
              guarded: bool = False):
        """Call a transactional API; retry retriable errors for ``give_up_after`` seconds in all, then raise
        DeliveryError; raise TransactionAborted when the transaction must be aborted. ``timeout`` is the
        API's own per-call timeout, trimmed to what is left."""
        deadline = time.monotonic() + give_up_after
        last = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DeliveryError(f"{name} kept failing with retriable errors for {give_up_after:.0f} s: "
                                    f"{last.str() if last else 'no answer'}")
            try:
                if timeout is None:
                    return getattr(self._producer, name)(*args)
                if guarded:
                    return self._guarded(name, (*args, max(1.0, min(timeout, left))))
                return getattr(self._producer, name)(*args, max(1.0, min(timeout, left)))
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                check(err, name)
                if err.fatal() or err.code() == KafkaError._FATAL:
                    raise self._fatal_error(name, err) from exc
                if err.txn_requires_abort():
                    raise TransactionAborted(f"{name}: {err.str()}") from exc
                if not err.retriable():
                    raise DeliveryError(f"{name} failed: {err.name()}: {err.str()}") from exc
                last = err
