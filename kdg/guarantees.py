"""The delivery guarantee, decided in ONE place.

Each guarantee maps to a frozen :class:`DeliveryPolicy`. Every other module reads the policy's
fields (``policy.commit_mode``, ``policy.transactional``); none compares guarantee names.

Example:
    >>> policy_for("exactly-once").isolation_level
    'read_committed'
"""

from dataclasses import dataclass, fields
from enum import Enum

from kdg.errors import PolicyViolation, UsageError


class Guarantee(str, Enum):
    AT_MOST_ONCE = "at-most-once"
    AT_LEAST_ONCE = "at-least-once"
    EXACTLY_ONCE = "exactly-once"


class CommitMode(str, Enum):
    BEFORE_PROCESSING = "before-processing"   # commit offsets, then process: a crash loses the batch
    AFTER_PROCESSING = "after-processing"     # process, then commit: a crash repeats the batch
    IN_SINK_TRANSACTION = "in-sink-transaction"  # offsets commit atomically with the results


@dataclass(frozen=True)
class DeliveryPolicy:
    """Every setting a guarantee decides, each with the reason it has that value."""

    guarantee: Guarantee
    acks: str
    retries: int | None  # None: librdkafka's default (unbounded within delivery.timeout.ms)
    idempotence: bool
    transactional: bool
    max_in_flight: int
    isolation_level: str
    commit_mode: CommitMode
    dedup: bool
    dedup_window: str         # how long a claim is kept, so how late a duplicate is still recognised
    spark_task_retries: bool
    confirms_delivery: bool   # the producer learns each record's fate (a broker answer); else it only knows it sent
    may_lose: bool            # what the guarantee allows a fault to cost, and so what `kdg chaos` accepts
    may_duplicate: bool
    reasons: dict

    def producer_config(self) -> dict[str, object]:
        """The librdkafka producer properties this policy fixes."""
        config: dict[str, object] = {
            "acks": self.acks,
            "enable.idempotence": self.idempotence,
            "max.in.flight.requests.per.connection": self.max_in_flight,
        }
        if self.retries is not None:
            config["retries"] = self.retries
        return config

    def consumer_config(self) -> dict[str, object]:
        """The librdkafka consumer properties this policy fixes (offsets are always committed by kdg)."""
        return {
            "isolation.level": self.isolation_level,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }

    def client_config(self) -> dict[str, object]:
        """Every client property this policy fixes, producer and consumer alike (what ``-X`` may not weaken)."""
        return {**self.producer_config(), **self.consumer_config()}

    def table(self) -> list[tuple[str, str, str]]:
        """(setting, value, reason) rows, as `kdg policy` prints them."""
        rows = []
        for f in fields(self):
            if f.name in ("guarantee", "reasons"):
                continue
            value = getattr(self, f.name)
            shown = "default (unbounded within delivery.timeout.ms)" if value is None else value
            rows.append((f.name, str(shown.value if isinstance(shown, Enum) else shown), self.reasons[f.name]))
        return rows

    def write_mode_effect(self, mode: str) -> str:
        """What a typed sink's write mode (``insert`` or ``upsert``) makes of this guarantee, read off its fields."""
        name = self.guarantee.value
        if mode == "upsert":
            if self.dedup:
                return ("each idempotency key is claimed once per table, with its row; on top of that the latest "
                        "version of each key wins")
            if self.may_duplicate:
                return (f"idempotent writes make {name} effectively-once for this table — but not for side "
                        "effects of the handler")
            return f"upserts cannot bring back what {name} skips: a crash still loses its batch"
        if mode == "insert":
            if self.dedup:
                return "each record's row once: its idempotency key is claimed in kdg_dedup with the row"
            if self.may_duplicate:
                return "a crash before the commit writes the batch again: duplicate rows, visible in the table"
            return "rows are never written twice; a crash can skip a batch"
        raise UsageError(f"--mode {mode!r}: use insert or upsert")

    def to_dict(self) -> dict:
        return {"guarantee": self.guarantee.value,
                "settings": {name: {"value": value, "reason": reason} for name, value, reason in self.table()},
                "producer_config": self.producer_config(), "consumer_config": self.consumer_config()}


_POLICIES = {
    Guarantee.AT_MOST_ONCE: DeliveryPolicy(
        guarantee=Guarantee.AT_MOST_ONCE, acks="0", retries=0, idempotence=False, transactional=False,
        max_in_flight=5, isolation_level="read_uncommitted", commit_mode=CommitMode.BEFORE_PROCESSING,
        dedup=False, dedup_window="none", spark_task_retries=False, confirms_delivery=False, may_lose=True,
        may_duplicate=False,
        reasons={
            "acks": "fire and forget: the producer never waits for a broker",
            "retries": "a resend could duplicate; never resend",
            "idempotence": "needs acks=all; not wanted when loss is acceptable",
            "transactional": "no atomicity promised",
            "max_in_flight": "order is not promised; librdkafka's default",
            "isolation_level": "no transactions to hide",
            "commit_mode": "offsets are committed before processing: a crash skips the batch, never repeats it",
            "dedup": "nothing is ever delivered twice, so there is nothing to drop",
            "dedup_window": "no claims are made",
            "spark_task_retries": "a retried task could write twice; the range is marked done before writing",
            "confirms_delivery": "acks=0: no broker answers, so a record counts as sent, never as acknowledged",
            "may_lose": "a crash or a lost request drops records; nothing is ever repeated to make up for it",
            "may_duplicate": "nothing is resent and offsets move before processing, so nothing repeats",
        }),
    Guarantee.AT_LEAST_ONCE: DeliveryPolicy(
        guarantee=Guarantee.AT_LEAST_ONCE, acks="all", retries=None, idempotence=False, transactional=False,
        max_in_flight=1, isolation_level="read_uncommitted", commit_mode=CommitMode.AFTER_PROCESSING,
        dedup=False, dedup_window="none", spark_task_retries=True, confirms_delivery=True, may_lose=False,
        may_duplicate=True,
        reasons={
            "acks": "a write counts only once every in-sync replica has it",
            "retries": "resend until delivery.timeout.ms: a lost ack becomes a duplicate, never a loss",
            "idempotence": "off: duplicates from retries are allowed at this level",
            "transactional": "no atomicity promised",
            "max_in_flight": "one request at a time keeps order when a retry happens",
            "isolation_level": "no transactions to hide",
            "commit_mode": "offsets are committed after processing: a crash repeats the batch, never skips it",
            "dedup": "duplicates are allowed at this level and stay visible",
            "dedup_window": "no claims are made",
            "spark_task_retries": "a failed task is retried; the range is recorded only after the write",
            "confirms_delivery": "every record is acknowledged by the in-sync replicas, or reported failed",
            "may_lose": "nothing acknowledged is lost: resends and commits after processing see to it",
            "may_duplicate": "a resend or a crash before the commit repeats records",
        }),
    Guarantee.EXACTLY_ONCE: DeliveryPolicy(
        guarantee=Guarantee.EXACTLY_ONCE, acks="all", retries=None, idempotence=True, transactional=True,
        max_in_flight=5, isolation_level="read_committed", commit_mode=CommitMode.IN_SINK_TRANSACTION,
        dedup=True, dedup_window="the sink table's --dedup-retention", spark_task_retries=True, confirms_delivery=True,
        may_lose=False, may_duplicate=False,
        reasons={
            "acks": "idempotence and transactions need every in-sync replica",
            "retries": "safe to resend forever: the broker drops duplicates by producer id and sequence",
            "idempotence": "the broker de-duplicates retried batches",
            "transactional": "records of a batch become visible together or not at all",
            "max_in_flight": "at most 5 keeps ordering guaranteed by the idempotent producer",
            "isolation_level": "aborted and open transactions are never read",
            "commit_mode": "offsets are stored in the same Postgres (or Kafka) transaction as the results",
            "dedup": "an idempotency key is claimed in the same transaction as the row it guards",
            "dedup_window": "a duplicate is recognised while its first claim is kept: claims live in partitions by "
                            "the key's time (a UUIDv7's, else its first claim's), dropped whole once older than "
                            "the window, stored per table (default: the topic's retention.ms + segment.ms, how long "
                            "Kafka can serve a record). A record read again later is written again; spark-replay "
                            "refuses such a range unless --beyond-dedup-window",
            "spark_task_retries": "a retried task re-claims the same keys and adds nothing",
            "confirms_delivery": "records count once their transaction commits",
            "may_lose": "results and offsets commit together: a crash repeats work that dedup then drops",
            "may_duplicate": "each idempotency key is claimed once per sink; Kafka fences zombie producers",
        }),
}


def policy_for(guarantee: "str | Guarantee") -> DeliveryPolicy:
    """The policy of ``guarantee`` (a :class:`Guarantee` or its name)."""
    try:
        return _POLICIES[Guarantee(guarantee)]
    except ValueError:
        names = ", ".join(g.value for g in Guarantee)
        raise UsageError(f"unknown guarantee {guarantee!r}; choose one of {names}") from None


def all_policies() -> list[DeliveryPolicy]:
    return list(_POLICIES.values())


# Properties a user may not set at all through -X, because kdg owns them.
OWNED = {
    "enable.auto.commit": "kdg commits offsets itself, where the guarantee says",
    "enable.auto.offset.store": "kdg stores offsets itself, where the guarantee says",
    "transactional.id": "use --transactional-id",
    "isolation.level": "the guarantee decides which records are readable",
    "acks": "the guarantee decides acknowledgement",
    "request.required.acks": "the guarantee decides acknowledgement",
    "enable.idempotence": "the guarantee decides idempotence",
    "max.in.flight.requests.per.connection": "the guarantee decides how many requests may be in flight",
    "max.in.flight": "the guarantee decides how many requests may be in flight",
    "retries": "the guarantee decides retries",
    "message.send.max.retries": "the guarantee decides retries",
    "delivery.report.only.error": "kdg decides which delivery reports it reads (the ledger needs every record's)",
}


def merge_overrides(policy_config: dict[str, object], user: dict[str, str]) -> dict[str, object]:
    """User ``-X`` properties on top of a policy's config; the policy's keys win.

    A user property that would change a key the policy set is refused with its name and the
    reason; setting it to the very value the policy chose is allowed.
    """
    merged = dict(policy_config)
    for key, value in user.items():
        if key in OWNED:
            if key in policy_config and _same(policy_config[key], value):
                continue
            decided = policy_config.get(key, "kdg")
            raise PolicyViolation(f"-X {key}={value} is refused: {OWNED[key]} (policy value: {decided})")
        merged[key] = value
    return merged


def _same(policy_value: object, user_value: str) -> bool:
    if isinstance(policy_value, bool):
        return user_value.lower() == str(policy_value).lower()
    return str(policy_value) == user_value
